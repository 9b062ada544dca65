#!/usr/bin/env python3
"""Fill the form fields of a PDF and write the result to a new file.

Values come from a JSON object ({"field": "value"}) given with --json, and/or from
name=value arguments (these win). Unknown field names are an error.
"""

from __future__ import annotations

import argparse
import json
import sys

from pypdf import PdfReader, PdfWriter


def read_values(json_path: str | None, pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    if json_path:
        with open(json_path, encoding="utf-8") as f:
            loaded = json.load(f)
        if not isinstance(loaded, dict):
            sys.exit("error: the JSON file must hold an object of field names to values")
        values.update({str(k): str(v) for k, v in loaded.items()})
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            sys.exit(f"error: {pair!r} is not name=value")
        values[name] = value
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pdf", help="the PDF form to fill")
    parser.add_argument("output", help="where to write the filled PDF")
    parser.add_argument("fields", nargs="*", metavar="name=value", help="field values")
    parser.add_argument("--json", dest="json_path", help="a JSON file of field values")
    args = parser.parse_args()

    values = read_values(args.json_path, args.fields)
    if not values:
        sys.exit("error: no field values given (use name=value or --json FILE)")
    reader = PdfReader(args.pdf)
    known = set(reader.get_fields() or {})
    unknown = sorted(set(values) - known)
    if unknown:
        have = ", ".join(sorted(known)) or "no fields"
        sys.exit(f"error: no field named {', '.join(unknown)}; the form has: {have}")

    writer = PdfWriter(clone_from=reader)
    writer.update_page_form_field_values(None, values, auto_regenerate=False)
    writer.set_need_appearances_writer(True)  # viewers redraw the fields with the new values
    with open(args.output, "wb") as f:
        writer.write(f)
    print(f"filled {len(values)} fields into {args.output}")


if __name__ == "__main__":
    main()
