"""Which paths of a read-write project the host would read as configuration or run.

A sandbox's writes to a project reach the host only through the overlay sync
(`protect.sync`), which asks `verdict` about every path it would apply:

- "apply": ordinary project content, and what git itself writes for ordinary commits inside
  a `.git` directory (the object store, refs, logs, the index, HEAD and the few files a
  commit leaves), so an agent's `git commit` in the sandbox shows on the host's branch;
- "ignore": git's lock files, written and renamed within one command: never applied,
  never reported;
- "drop": everything else under any `.git` (its config files, hooks, `info/`, `commondir`,
  `modules/`, `worktrees/`, a `.git` that is a file or a link pointing elsewhere, a second
  `.git` inside one), and the agent, editor and shell files that run commands, at any depth
  (sandbox-runtime's mandatory deny list is the floor), and the operator's own protected
  names. A dropped path stays in the session's own view; the host never sees it.

Paths are '/'-separated and relative to the project root, as they are in the overlay's upper
layer. `kind` is what the sandbox made there: "file", "dir", "link", "gone" (deleted) or
"other".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Verdict = Literal["apply", "drop", "ignore"]

# Folders whose contents an agent, editor or tool reads as settings or runs: dropped whole.
TRUSTED_DIRS = frozenset(
    {".claude", ".cursor", ".devcontainer", ".gemini", ".husky", ".idea", ".vscode"}
)
# Files anywhere in the tree that a shell, git or a tool reads as settings or runs.
TRUSTED_FILES = frozenset(
    {
        ".bash_profile",
        ".bashrc",
        ".envrc",
        ".gitconfig",
        ".gitmodules",
        ".mcp.json",
        ".pre-commit-config.yaml",
        ".profile",
        ".ripgreprc",
        ".zprofile",
        ".zshrc",
    }
)
# Inside a `.git` directory: what an ordinary commit writes (folders whole, or single files).
GIT_CONTENT_DIRS = frozenset({"objects", "refs", "logs"})
GIT_CONTENT_FILES = frozenset({"index", "HEAD", "ORIG_HEAD", "COMMIT_EDITMSG", "packed-refs"})


def verdict(rel: str, kind: str, extra: Sequence[str] = ()) -> Verdict:
    """What the sync does with `rel` (see the module docstring)."""
    parts = rel.split("/")
    if _named_by_operator(parts, extra):
        return "drop"
    if any(part in TRUSTED_DIRS for part in parts) or parts[-1] in TRUSTED_FILES:
        return "drop"
    if ".git" not in parts:
        return "apply"
    at = parts.index(".git")
    return _inside_git(parts[at + 1 :], kind)


def _inside_git(inside: list[str], kind: str) -> Verdict:
    """The verdict for a path `inside` a `.git` (empty: the `.git` itself)."""
    if not inside:
        return _git_itself(kind)
    if ".git" in inside:
        return "drop"
    if inside[-1].endswith(".lock") and kind in ("file", "gone"):
        return "ignore"
    if kind not in ("file", "dir", "gone"):
        return "drop"  # a link or a special file inside .git: never
    if inside[0] in GIT_CONTENT_DIRS:
        return "apply"
    if len(inside) == 1 and inside[0] in GIT_CONTENT_FILES and kind != "dir":
        return "apply"
    return "drop"


def _git_itself(kind: str) -> Verdict:
    """A `.git` may be made as a directory (a new repository's content is judged inside);
    a `.git` file or link (pointing at another git directory) and a deleted one are dropped."""
    return "apply" if kind == "dir" else "drop"


def _named_by_operator(parts: list[str], extra: Sequence[str]) -> bool:
    """True when `parts` is one of the operator's protected names or lies under one."""
    for name in extra:
        named = name.split("/")
        if parts[: len(named)] == named:
            return True
    return False
