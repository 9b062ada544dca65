#!/usr/bin/env python3
"""Replace a text in the values of a PDF form's fields, writing a new, still fillable PDF.

Exit status 1, with nothing written, when the PDF has no form fields or no field value holds
the text.
"""

from __future__ import annotations

import argparse
import re
import sys

from pypdf import PdfReader, PdfWriter


def field_values(reader: PdfReader) -> dict[str, str]:
    """Every form field that has a text value, by its full name."""
    fields = reader.get_fields() or {}
    return {name: field["/V"] for name, field in fields.items() if isinstance(field.get("/V"), str)}


def replaced(
    values: dict[str, str], search: str, replacement: str, ignore_case: bool
) -> dict[str, str]:
    """The fields whose value holds `search`, with their new values."""
    pattern = re.compile(re.escape(search), re.IGNORECASE if ignore_case else 0)
    changed = {}
    for name, value in values.items():
        new = pattern.sub(lambda _: replacement, value)
        if new != value:
            changed[name] = new
    return changed


def write(reader: PdfReader, changed: dict[str, str], output: str) -> None:
    writer = PdfWriter(clone_from=reader)
    for page in writer.pages:
        if "/Annots" in page:
            writer.update_page_form_field_values(page, changed, auto_regenerate=False)
    writer.set_need_appearances_writer(True)
    with open(output, "wb") as out:
        writer.write(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input_pdf")
    parser.add_argument("search_text")
    parser.add_argument("replace_text")
    parser.add_argument("output_pdf")
    parser.add_argument("--ignore-case", action="store_true", help="match in any case")
    args = parser.parse_args()
    reader = PdfReader(args.input_pdf)
    if not reader.get_fields():
        print(
            f"{args.input_pdf} has no form fields (a scanned or flattened PDF)",
            file=sys.stderr,
        )
        return 1
    values = field_values(reader)
    changed = replaced(values, args.search_text, args.replace_text, args.ignore_case)
    if not changed:
        shown = ", ".join(f"{n}={v!r}" for n, v in sorted(values.items())) or "none has a value"
        print(
            f"no form field holds {args.search_text!r}; the fields with values: {shown}",
            file=sys.stderr,
        )
        return 1
    write(reader, changed, args.output_pdf)
    for name, value in sorted(changed.items()):
        print(f"{name}: {values[name]!r} -> {value!r}")
    print(f"{len(changed)} of {len(values)} fields changed; wrote {args.output_pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
