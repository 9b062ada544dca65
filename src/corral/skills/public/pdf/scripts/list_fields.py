#!/usr/bin/env python3
"""List the form fields of a PDF (AcroForm): name, type and current value."""

from __future__ import annotations

import argparse
import json

from pypdf import PdfReader

FIELD_TYPES = {"/Tx": "text", "/Btn": "button", "/Ch": "choice", "/Sig": "signature"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pdf", help="the PDF form")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    args = parser.parse_args()

    fields = PdfReader(args.pdf).get_fields() or {}
    rows = [
        {
            "name": name,
            "type": FIELD_TYPES.get(str(field.get("/FT")), str(field.get("/FT"))),
            "value": None if field.get("/V") is None else str(field.get("/V")),
        }
        for name, field in fields.items()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("no form fields")
    else:
        for row in rows:
            print(f"{row['name']}\t{row['type']}\t{row['value'] or ''}")


if __name__ == "__main__":
    main()
