#!/usr/bin/env python3
"""Print the text of a PDF, page by page."""

from __future__ import annotations

import argparse
import sys

from pypdf import PdfReader


def parse_pages(spec: str | None, count: int) -> list[int]:
    """Page numbers (1-based) from '1,3-5'; all pages when spec is None."""
    if not spec:
        return list(range(1, count + 1))
    pages: list[int] = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        pages.extend(range(int(first), int(last or first) + 1))
    bad = [p for p in pages if not 1 <= p <= count]
    if bad:
        sys.exit(f"error: page {bad[0]} is out of range (the PDF has {count} pages)")
    return pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pdf", help="the PDF to read")
    parser.add_argument("--pages", help="pages to read, e.g. 1,3-5 (default: all)")
    parser.add_argument("-o", "--output", help="write the text to this file instead of stdout")
    args = parser.parse_args()

    reader = PdfReader(args.pdf)
    chunks = []
    for number in parse_pages(args.pages, len(reader.pages)):
        text = reader.pages[number - 1].extract_text() or ""
        chunks.append(f"--- page {number} ---\n{text.strip()}\n")
    out = "\n".join(chunks)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(out)
        print(f"wrote {len(chunks)} pages of text to {args.output}")
    else:
        print(out, end="")


if __name__ == "__main__":
    main()
