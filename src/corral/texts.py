"""coderunner's text forms, in one place, for the MCP tools and the coderunner routes.

The service returns data (`ExecutionResult`, `PageResult`, skill listings); what an agent
reads is made here: the output or `[Execution successful with no output]`, `Error: ...`
sentences rather than exceptions, the skill texts with the paths the sandbox sees. Each
form is pinned by the MCP and compat tests; change one only on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from corral.browser.fetch import PageResult
from corral.errors import CorralError, NotFound
from corral.kernels.results import ExecutionResult, refusal_note
from corral.skills.catalog import SOURCES, SkillFile, SkillInfo

NO_OUTPUT = "[Execution successful with no output]"
RULE = "=" * 80
LIST_HINT = "Use list_skills() to see available skills."
IMAGE_TYPES = ("image/png", "image/jpeg")  # the result MIME types sent as images

# -- execution -----------------------------------------------------------------------------


def result_text(result: ExecutionResult, *, with_stderr: bool = False) -> str:
    """coderunner's text for a result: the output (and stderr, which coderunner's kernel
    merges into it, when asked) and text results, or its no-output marker."""
    # A figure's text/plain is only its repr ("<Figure size ...>"): the image says more.
    texts = [
        bundle["text/plain"]
        for bundle in result.results
        if "text/plain" in bundle and not any(m.startswith("image/") for m in bundle)
    ]
    text = result.stdout + (result.stderr if with_stderr else "") + "".join(texts)
    return text or NO_OUTPUT


def error_text(result: ExecutionResult) -> str | None:
    """coderunner's 'Error: ...' text when the code failed, else None."""
    if result.error is not None:
        lines = result.error.traceback or [f"{result.error.ename}: {result.error.evalue}"]
        return "Error: Execution Error:\n" + "\n".join(lines)
    if result.status != "ok":
        return f"Error: {result.message or result.status}"
    return None


def tool_text(result: ExecutionResult) -> str:
    """The text of an execute tool's answer: the result text, or output then the error; a
    result with only images says how many (the images follow as their own content). What
    the egress proxy refused meanwhile, and how to ask for it, follows."""
    return _then(_tool_text(result), _refusals(result))


def _tool_text(result: ExecutionResult) -> str:
    failure = error_text(result)
    if failure is not None:
        return result.stdout + result.stderr + failure
    text = result_text(result, with_stderr=True)
    images = sum(1 for bundle in result.results for mime in IMAGE_TYPES if mime in bundle)
    if images and text == NO_OUTPUT:
        return f"[Execution successful: {images} image(s)]"
    return text


def compat_output(result: ExecutionResult) -> tuple[str, str]:
    """`POST /execute`'s stdout and stderr: the result text, or the error after stderr; what
    the proxy refused at the end of stderr."""
    failure = error_text(result)
    if failure is None:
        return result_text(result), _then(result.stderr, _refusals(result))
    return result.stdout, _then(result.stderr + failure, _refusals(result))


def _refusals(result: ExecutionResult) -> str:
    if not result.network_refused:
        return ""
    return "[corral] " + refusal_note(result.network_refused, result.session_id)


def _then(text: str, note: str) -> str:
    """`note` on a line of its own after `text`."""
    if not note or not text:
        return text + note
    return text + ("" if text.endswith("\n") else "\n") + note


def failure_text(exc: CorralError) -> str:
    """A call corral refused or could not run, as coderunner says it."""
    return f"Error: {exc}"


# -- the browser ---------------------------------------------------------------------------


def page_text(page: PageResult) -> str:
    """The page's text with corral's notes (cut text, refused connections) after it."""
    notes = "".join(f"\n[corral] {note}" for note in page.notes())
    return page.text + notes


def fetch_failure_text(exc: CorralError) -> str:
    return f"Error: Failed to retrieve all visible text: {exc}"


# -- skills --------------------------------------------------------------------------------


class ListedSkill(Protocol):
    """A skill as listed: the catalog's entry, or the API's (`corral skills list`)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def problem(self) -> str | None: ...


class SetAsideArchive(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> str: ...


class Listed(Protocol):
    @property
    def skills(self) -> Sequence[ListedSkill]: ...
    @property
    def set_aside(self) -> Sequence[SetAsideArchive]: ...


def skills_text(listing: Listed) -> str:
    """The list_skills() text; a skill with a problem says what it is, then set-asides."""
    lines = ["Available Skills:", ""]
    for source in SOURCES:
        group = [entry for entry in listing.skills if entry.source == source]
        lines.append(f"{source.capitalize()} Skills ({len(group)}):")
        lines.extend(_list_line(entry) for entry in group)
        if not group:
            lines.append("  (none)")
        lines.append("")
    if listing.set_aside:
        lines.append(f"Archives set aside in the user skills folder ({len(listing.set_aside)}):")
        lines.extend(f"  - {archive.name}: {archive.reason}" for archive in listing.set_aside)
        lines.append("")
    lines.append("Use get_skill_info(skill_name) to read documentation for a specific skill.")
    return "\n".join(lines)


def skill_info_text(info: SkillInfo) -> str:
    """The get_skill_info() text: a header with the sandbox path, then SKILL.md."""
    entry = info.entry
    header = f"Skill: {entry.name} ({entry.source})\nLocation: {entry.location}/\n"
    return f"{header}{RULE}\n\n{info.content}"


def skill_file_text(file: SkillFile) -> str:
    """The get_skill_file() text: a header with the file's sandbox path, then the file."""
    header = (
        f"Skill: {file.skill} ({file.source})\nFile: {file.filename}\nLocation: {file.location}\n"
    )
    return f"{header}{RULE}\n\n{file.content}"


def skill_error_text(exc: CorralError) -> str:
    """A skill call that failed; a missing skill points at list_skills()."""
    hint = f" {LIST_HINT}" if isinstance(exc, NotFound) else ""
    return f"Error: {exc}{hint}"


def _list_line(entry: ListedSkill) -> str:
    if entry.problem:
        return f"  - {entry.name}: (not usable: {entry.problem})"
    return f"  - {entry.name}: {' '.join(entry.description.split())}"
