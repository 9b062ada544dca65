"""Files inside a read-write project mount that the host later executes or trusts.

A sandbox that can write a project could plant a git hook, a `core.fsmonitor` line in a
`.git/config` (or a new `.git/commondir` pointing at one), or an editor or agent setting that
runs a command, and the host would run it the next time the developer uses the project. So a
read-write project is an overlay inside the sandbox (`corral.kernels.projects`), and the
sandbox's writes reach the host folder only through `OverlaySync` (`protect.sync`), which
judges every path with `verdict` (`protect.trusted`): what the host would run or trust is
kept in the session's own view and reported as it happens.

Names in messages and reports pass through `escape_name` (`protect.names`); the operator's
extra protected names are checked by `validate_protected_names`.
"""

from corral.protect.names import escape_name, validate_protected_names
from corral.protect.sync import OverlaySync, remove_layers
from corral.protect.trusted import verdict

__all__ = [
    "OverlaySync",
    "escape_name",
    "remove_layers",
    "validate_protected_names",
    "verdict",
]
