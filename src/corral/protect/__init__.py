"""Files inside a read-write project mount that the host later executes or trusts.

A sandbox that can write a project could plant a git hook, a `core.fsmonitor` line in
`.git/config`, or an editor/agent setting that runs a command, and the host would run it the
next time the developer uses the project. So, for a read-write mount:

1. `scan` (`protect.scan`) walks the project once on the host, before the session starts,
   and lists what to protect (a `Plan`); a protected path reached through a link, or of the
   wrong type, is refused.
2. `prepare` (`protect.copies`) makes per-session copies in a server-owned private directory,
   opening every source without following a link, and fingerprints each copy
   (`protect.fingerprint`). The caller bind-mounts each copy (`ProtectedBind`) over its `rel`.
3. `changes` (`protect.compare`), at session end, names the protected files the sandbox
   changed or created.

The data passed between the steps is in `protect.plan`; names, their escaping for reports
and the refusal are in `protect.names`; copying bytes (a reflink when possible) is
`protect.clone`. Nothing here follows a symbolic link (every open goes through
`corral.fsafe`); every walk is bounded (entries, depth, one filesystem).

Errors: `ProtectionRefused` (an `InvalidInput`) for a refused project; `InvalidInput` for a bad
extra name. Other operating-system errors propagate.
"""

from corral.protect.clone import FICLONE, clone_or_copy
from corral.protect.compare import changes
from corral.protect.copies import MAX_COPY_BYTES, MAX_HOOK_ENTRIES, prepare
from corral.protect.names import (
    DEFAULT_PROTECTED,
    ProtectionRefused,
    escape_name,
    validate_protected_names,
)
from corral.protect.plan import MAX_DEPTH, Fingerprint, Item, Kind, Plan, ProtectedBind, Stamp
from corral.protect.scan import scan

__all__ = [
    "DEFAULT_PROTECTED",
    "FICLONE",
    "MAX_COPY_BYTES",
    "MAX_DEPTH",
    "MAX_HOOK_ENTRIES",
    "Fingerprint",
    "Item",
    "Kind",
    "Plan",
    "ProtectedBind",
    "ProtectionRefused",
    "Stamp",
    "changes",
    "clone_or_copy",
    "escape_name",
    "prepare",
    "scan",
    "validate_protected_names",
]
