"""What a model reads about each MCP tool: its title, description, hints and parameters.

A model decides its next call from these alone, so each says what the tool does, what it
needs, and what happens to the session; read-only tools say so in their annotations, and
stopping a session is marked destructive (its variables are lost).
"""

from __future__ import annotations

from typing import Annotated

from mcp.types import ToolAnnotations
from pydantic import Field

SessionId = Annotated[
    str | None,
    Field(
        description="A session started with start_python_session. Omit it to use the default "
        "session, which always exists; a stopped session must be started again first."
    ),
]
PythonCode = Annotated[
    str,
    Field(
        description="Python code to run. Variables, imports and files persist in the session "
        "between calls; the value of the last expression is returned."
    ),
]
ShellCommand = Annotated[
    str,
    Field(description="A bash command or script, run in /workspace; its state persists."),
]
NewSessionId = Annotated[
    str | None,
    Field(
        description="The id to give the session: 1-64 letters, digits, '_', '.' or '-'. Omit "
        "it for a generated one. Naming a stopped session starts it again with its files."
    ),
]
Mounts = Annotated[
    list[str] | None,
    Field(
        description="Names of the operator's project folders to show at /workspace/NAME "
        "(only names the operator configured; never a path)."
    ),
]
StopSessionId = Annotated[
    str,
    Field(
        description="The session to stop. Its variables are lost; its files and installed "
        "packages are kept for a later start_python_session with the same id."
    ),
]
FolderPath = Annotated[
    str, Field(description="A folder relative to /workspace ('.' is /workspace itself).")
]
Recursive = Annotated[bool, Field(description="List every file below the folder as well.")]
FilePath = Annotated[str, Field(description="A file path relative to /workspace.")]
FileContent = Annotated[
    str, Field(description="The file's text, or its bytes in base64 when base64_encoded is true.")
]
Base64Encoded = Annotated[bool, Field(description="content is base64 (for a binary file).")]
SkillName = Annotated[str, Field(description="A skill's name, as list_skills shows it.")]
SkillFile = Annotated[
    str, Field(description="A path inside the skill's folder, such as scripts/fill.py.")
]
PageUrl = Annotated[str, Field(description="An http:// or https:// URL.")]
Screenshot = Annotated[bool, Field(description="Also return the page as a PNG image.")]
Hosts = Annotated[
    list[str],
    Field(
        description="Hosts to reach: example.com, *.example.com, host:port, an IP address or "
        "CIDR range, or a preset (pypi, npm, github, huggingface)."
    ),
]
Reason = Annotated[str, Field(description="Why the session needs them; the operator reads it.")]


def _hints(title: str, *, read_only: bool = False, destructive: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=None if read_only else destructive,
        open_world_hint=False,
    )


READ_ONLY = {"read_only": True}

# name: (description, annotations)
TOOLS: dict[str, tuple[str, ToolAnnotations]] = {
    "execute_python_code": (
        "Run Python code in a persistent sandboxed kernel and return its output (stderr "
        "included), results and any error. Plots come back as images. Packages install with "
        "pip only where the operator allows the network.",
        _hints("Run Python", destructive=True),
    ),
    "execute_shell_command": (
        "Run a bash command in the session's sandbox (same /workspace and installed packages "
        "as the Python kernel).",
        _hints("Run a shell command", destructive=True),
    ),
    "start_python_session": (
        "Start a named session (its own kernel, variables and /workspace), optionally with "
        "some of the operator's project mounts by name, and return it. Starting a stopped "
        "session's id resumes it with its files and packages.",
        _hints("Start a session"),
    ),
    "list_python_sessions": (
        "List the active (started, not stopped) named sessions.",
        _hints("List sessions", **READ_ONLY),
    ),
    "stop_python_session": (
        "Stop a session: its variables are lost, its files and packages are kept until it "
        "is started again.",
        _hints("Stop a session", destructive=True),
    ),
    "list_files": (
        "List files in the session's /workspace.",
        _hints("List files", **READ_ONLY),
    ),
    "read_file": (
        "Read a text file from the session's /workspace (binary files come back as base64).",
        _hints("Read a file", **READ_ONLY),
    ),
    "write_file": (
        "Write a file into the session's /workspace (parents are created, an existing file "
        "is replaced). One call carries at most 4 MiB (about 3 MiB of base64 content); the "
        "workspace limit applies.",
        _hints("Write a file", destructive=True),
    ),
    "list_skills": (
        "List the available skills (folders of instructions and scripts for PDF, Word, Excel, "
        "PowerPoint, image work and more), public and the user's own.",
        _hints("List skills", **READ_ONLY),
    ),
    "get_skill_info": (
        "Read a skill's SKILL.md: what it does and the exact commands to run its scripts in "
        "the sandbox (skills are at /opt/corral/skills, read-only).",
        _hints("Read a skill", **READ_ONLY),
    ),
    "get_skill_file": (
        "Read another file of a skill (for example a script or EXAMPLES.md) by its path "
        "inside the skill folder.",
        _hints("Read a skill's file", **READ_ONLY),
    ),
    "navigate_and_get_all_visible_text": (
        "Load a web page (http or https) in a sandboxed browser and return all its visible "
        "text. With screenshot=true the page is also returned as an image. Only public "
        "addresses are reachable unless the operator allows more.",
        ToolAnnotations(title="Read a web page", read_only_hint=True, open_world_hint=True),
    ),
    "request_network_access": (
        "Ask the operator to let this session reach some hosts. Grants nothing by itself: "
        "the operator approves or rejects it, and the answer says which or that it waits.",
        _hints("Ask for network access"),
    ),
}
