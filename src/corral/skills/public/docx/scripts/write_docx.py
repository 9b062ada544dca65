#!/usr/bin/env python3
"""Write a .docx file from a small markdown-like text file.

Understood, one per line: '# ', '## ', '### ' headings; '- ' or '* ' bullets; '1. ' numbered
items; '| a | b |' table rows (a '|---|' separator line is skipped; the first row is the
header); anything else is a paragraph ('**bold**' and '*italic*' spans are kept). Blank lines
separate blocks.
"""

from __future__ import annotations

import argparse
import re

from docx import Document
from docx.document import Document as DocxDocument
from docx.text.paragraph import Paragraph

SPAN = re.compile(r"(\*\*[^*]+\*\*|\*[^*]+\*)")
SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def add_runs(paragraph: Paragraph, text: str) -> None:
    for piece in SPAN.split(text):
        if piece.startswith("**") and piece.endswith("**") and len(piece) > 4:
            paragraph.add_run(piece[2:-2]).bold = True
        elif piece.startswith("*") and piece.endswith("*") and len(piece) > 2:
            paragraph.add_run(piece[1:-1]).italic = True
        elif piece:
            paragraph.add_run(piece)


def add_table(document: DocxDocument, rows: list[list[str]]) -> None:
    width = max(len(row) for row in rows)
    table = document.add_table(rows=len(rows), cols=width)
    table.style = "Table Grid"
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
            if r == 0:
                for run in table.cell(r, c).paragraphs[0].runs:
                    run.bold = True


def build(lines: list[str]) -> DocxDocument:
    document = Document()
    table: list[list[str]] = []
    for raw in [*lines, ""]:
        line = raw.rstrip()
        if line.startswith("|"):
            if not SEPARATOR.match(line):
                table.append([cell.strip() for cell in line.strip("|").split("|")])
            continue
        if table:
            add_table(document, table)
            table = []
        heading = re.match(r"(#{1,3}) (.*)", line)
        if heading:
            document.add_heading(heading.group(2).strip(), level=len(heading.group(1)))
        elif re.match(r"[-*] ", line):
            add_runs(document.add_paragraph(style="List Bullet"), line[2:].strip())
        elif re.match(r"\d+\. ", line):
            add_runs(document.add_paragraph(style="List Number"), line.split(" ", 1)[1].strip())
        elif line.strip():
            add_runs(document.add_paragraph(), line.strip())
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", help="the markdown-like text file")
    parser.add_argument("output", help="the .docx file to write")
    args = parser.parse_args()

    with open(args.source, encoding="utf-8") as f:
        document = build(f.read().splitlines())
    document.save(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
