#!/usr/bin/env python3
"""Merge PDFs, in the order given, into one file."""

from __future__ import annotations

import argparse

from pypdf import PdfWriter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output", help="where to write the merged PDF")
    parser.add_argument("inputs", nargs="+", help="the PDFs to merge, in order")
    args = parser.parse_args()

    writer = PdfWriter()
    for path in args.inputs:
        writer.append(path)
    with open(args.output, "wb") as f:
        writer.write(f)
    print(f"merged {len(args.inputs)} files ({len(writer.pages)} pages) into {args.output}")


if __name__ == "__main__":
    main()
