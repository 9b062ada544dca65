"""The operator's extra protected names, and the escaping of names in messages and reports.

Names in messages and reports pass through `escape_name`: printable ASCII stays, non-ASCII
letters, marks and digits stay, a backslash becomes two, an undecodable byte and an ASCII
control character become `\\xNN`, and any other character becomes `\\uNNNN` (or
`\\UNNNNNNNN`). So a file named "a<newline>b" is reported as `a\\x0ab`; the mapping is one to
one, and a report can never move the cursor or fake a line.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence

from corral.errors import InvalidInput


def validate_protected_names(names: Sequence[str]) -> tuple[str, ...]:
    """Return the extra protected names, each checked to be a plain relative file path.

    Refused (`InvalidInput`): an empty name, an absolute one, a NUL byte, an empty, '.' or
    '..' component, or a '.git' component (git directories are protected already).
    """
    for name in names:
        if not name or "\0" in name or name.startswith("/"):
            raise InvalidInput(f"protected name '{escape_name(name)}' must be a relative path")
        for part in name.split("/"):
            if part in ("", ".", ".."):
                raise InvalidInput(
                    f"protected name '{escape_name(name)}' has an empty, '.' or '..' component"
                )
            if part == ".git":
                raise InvalidInput(
                    f"protected name '{escape_name(name)}' is inside .git, which is "
                    "protected already"
                )
    return tuple(names)


def escape_name(name: str | bytes) -> str:
    """`name` made safe to show: see the module docstring for the rule. One to one."""
    text = os.fsdecode(name) if isinstance(name, bytes) else name
    return "".join(_escape_char(ch) for ch in text)


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if 0x20 <= code < 0x7F:
        return ch
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode carries it
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable() and unicodedata.category(ch)[0] in "LMN":
        return ch
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
