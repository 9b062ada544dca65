#!/usr/bin/env python3
"""Print the paragraphs and tables of a .docx file, in document order, as markdown or text."""

from __future__ import annotations

import argparse

from docx import Document
from docx.table import Table
from docx.text.paragraph import Paragraph


def paragraph_line(paragraph: Paragraph, markdown: bool) -> str:
    text = paragraph.text.strip()
    style = paragraph.style.name if paragraph.style is not None else ""
    if not markdown or not text:
        return text
    if style == "Title":
        return f"# {text}"
    if style.startswith("Heading "):
        level = style.removeprefix("Heading ")
        return f"{'#' * int(level)} {text}" if level.isdigit() else text
    if style.startswith("List Bullet"):
        return f"- {text}"
    if style.startswith("List Number"):
        return f"1. {text}"
    return text


def table_lines(table: Table, markdown: bool) -> list[str]:
    rows = [[cell.text.strip().replace("\n", " ") for cell in row.cells] for row in table.rows]
    if not markdown:
        return ["\t".join(row) for row in rows]
    lines = [f"| {' | '.join(row)} |" for row in rows]
    if lines:
        lines.insert(1, f"|{'---|' * len(rows[0])}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("docx", help="the .docx file to read")
    parser.add_argument(
        "--format", choices=["markdown", "text"], default="markdown", help="default: markdown"
    )
    args = parser.parse_args()

    markdown = args.format == "markdown"
    lines: list[str] = []
    for block in Document(args.docx).iter_inner_content():
        if isinstance(block, Paragraph):
            line = paragraph_line(block, markdown)
            if line:
                lines.append(line)
        else:
            lines.extend(["", *table_lines(block, markdown), ""])
    print("\n".join(lines))


if __name__ == "__main__":
    main()
