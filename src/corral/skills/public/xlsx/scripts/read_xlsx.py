#!/usr/bin/env python3
"""Print the cells of an .xlsx workbook, sheet by sheet, one row per line.

Values are the ones saved in the file. A formula whose value was never computed (a file
written by a script and not yet opened in Excel or LibreOffice) shows as its formula.
With --formulas every formula cell shows its formula ('=SUM(B2:B3)') instead of its value.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openpyxl import load_workbook  # type: ignore[import-untyped]


def cell_text(value: Any, formula: Any) -> str:
    if value is None and isinstance(formula, str) and formula.startswith("="):
        return formula
    return "" if value is None else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("xlsx", help="the workbook to read")
    parser.add_argument("--sheet", help="only this sheet (default: all)")
    parser.add_argument("--formulas", action="store_true", help="show formulas, not values")
    parser.add_argument("--max-rows", type=int, default=200, help="rows per sheet (default 200)")
    args = parser.parse_args()

    formulas = load_workbook(args.xlsx, data_only=False)
    values = formulas if args.formulas else load_workbook(args.xlsx, data_only=True)
    names = [args.sheet] if args.sheet else formulas.sheetnames
    for name in names:
        if name not in formulas.sheetnames:
            sys.exit(f"error: no sheet named {name!r}; the workbook has {formulas.sheetnames}")
        sheet, shown = formulas[name], values[name]
        print(f"## Sheet: {name} ({sheet.dimensions})")
        rows = zip(
            shown.iter_rows(values_only=True), sheet.iter_rows(values_only=True), strict=True
        )
        for number, (row, row_formulas) in enumerate(rows, 1):
            if number > args.max_rows:
                print(f"... {sheet.max_row - args.max_rows} more rows (use --max-rows)")
                break
            cells = [cell_text(v, f) for v, f in zip(row, row_formulas, strict=True)]
            print(f"{number}: " + "\t".join(cells))
        print()


if __name__ == "__main__":
    main()
