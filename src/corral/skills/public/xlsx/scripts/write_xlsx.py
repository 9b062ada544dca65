#!/usr/bin/env python3
"""Write an .xlsx workbook from JSON rows; strings starting with '=' become formulas.

The JSON is either a list of rows (one sheet named "Sheet1") or an object
{"sheets": [{"name": "Sales", "rows": [[...], ...], "header": true}]}. With "header"
(the default) the first row is bold and frozen. Column widths follow the longest value.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from openpyxl import Workbook  # type: ignore[import-untyped]
from openpyxl.styles import Font  # type: ignore[import-untyped]
from openpyxl.utils import get_column_letter  # type: ignore[import-untyped]


def sheets_of(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, list):
        return [{"name": "Sheet1", "rows": data}]
    if isinstance(data, dict) and isinstance(data.get("sheets"), list):
        return list(data["sheets"])
    sys.exit('error: the JSON must be a list of rows or {"sheets": [...]}')


def fill(sheet: Any, rows: list[list[Any]], header: bool) -> None:
    widths: dict[int, int] = {}
    for row in rows:
        sheet.append(row)
        for column, value in enumerate(row, 1):
            widths[column] = max(widths.get(column, 0), len(str(value)))
    for column, width in widths.items():
        sheet.column_dimensions[get_column_letter(column)].width = min(width + 2, 60)
    if header and rows:
        for cell in sheet[1]:
            cell.font = Font(bold=True)
        sheet.freeze_panes = "A2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", help="the JSON file")
    parser.add_argument("output", help="the .xlsx file to write")
    args = parser.parse_args()

    with open(args.source, encoding="utf-8") as f:
        sheets = sheets_of(json.load(f))
    workbook = Workbook()
    workbook.remove(workbook.active)
    for spec in sheets:
        sheet = workbook.create_sheet(str(spec.get("name", f"Sheet{len(workbook.sheetnames) + 1}")))
        fill(sheet, spec.get("rows", []), bool(spec.get("header", True)))
    workbook.save(args.output)
    print(f"wrote {args.output}: sheets {', '.join(workbook.sheetnames)}")


if __name__ == "__main__":
    main()
