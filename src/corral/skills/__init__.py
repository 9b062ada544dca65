"""Skills: folders with a SKILL.md and scripts, shipped (public) or added by the user.

Both folders are shown read-only inside every sandbox at `SANDBOX_SKILLS`/{public,user}.
"""

from __future__ import annotations

from pathlib import Path

PUBLIC_DIR = Path(__file__).resolve().parent / "public"
SANDBOX_SKILLS = "/opt/corral/skills"


def user_dir(config_dir: Path) -> Path:
    """Where the user's own skills live (`corral skills path` prints it)."""
    return config_dir / "skills"
