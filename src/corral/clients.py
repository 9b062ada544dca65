"""Ready-to-paste MCP client configurations, with the URL and the agent token filled in.

A snippet is exactly what goes into the client's file (`corral mcp-config gemini >
~/.gemini/settings.json` writes valid JSON); where it goes is said apart (`Snippet.where`),
and the CLI prints that on stderr.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from corral.errors import InvalidInput


class Snippet(NamedTuple):
    text: str  # what goes into the file, or the command to run
    where: str | None = None  # the file it goes into, when it is one


def _http_entry(url: str, token: str, url_key: str = "url") -> dict[str, object]:
    return {url_key: url, "headers": {"Authorization": f"Bearer {token}"}}


def _claude_code(url: str, token: str) -> Snippet:
    header = shlex.quote(f"Authorization: Bearer {token}")
    return Snippet(f"claude mcp add --transport http corral {url} --header {header}\n")


def stdio_command() -> list[str]:
    """An absolute command line that starts `corral mcp-stdio` from any directory and with
    another PATH (Claude Desktop starts it itself): this `corral` executable, the one beside
    this interpreter, the one on PATH, else this interpreter with `-m corral`."""
    candidates = [Path(sys.argv[0]), Path(sys.executable).parent / "corral"]
    found = shutil.which("corral")
    candidates += [Path(found)] if found else []
    for candidate in candidates:
        if candidate.name == "corral" and candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate.absolute()), "mcp-stdio"]
    return [str(Path(sys.executable).absolute()), "-m", "corral", "mcp-stdio"]


def _stdio_env() -> dict[str, str]:
    """The corral folders this shell chose, so the stdio process finds the same server."""
    names = ("CORRAL_STATE_DIR", "CORRAL_CONFIG_DIR", "CORRAL_RUN_ROOT", "CORRAL_URL")
    return {name: os.environ[name] for name in names if os.environ.get(name)}


def _claude_desktop(url: str, token: str) -> Snippet:
    # Claude Desktop's config file starts local servers over stdio; beside a running server
    # `corral mcp-stdio` relays to it (`url`), else it runs its own service.
    command, *args = stdio_command()
    entry: dict[str, object] = {"command": command, "args": args}
    if env := _stdio_env():
        entry["env"] = env
    config = {"mcpServers": {"corral": entry}}
    return Snippet(
        json.dumps(config, indent=2) + "\n",
        "claude_desktop_config.json (stdio: Desktop starts corral itself)",
    )


def _json_config(
    path: str, key: str, entry: Callable[[str, str], dict[str, object]]
) -> Callable[[str, str], Snippet]:
    def render(url: str, token: str) -> Snippet:
        return Snippet(json.dumps({key: {"corral": entry(url, token)}}, indent=2) + "\n", path)

    return render


def _opencode_entry(url: str, token: str) -> dict[str, object]:
    return {"type": "remote", "enabled": True, **_http_entry(url, token)}


def _openai_agents(url: str, token: str) -> Snippet:
    return Snippet(_OPENAI_AGENTS.format(url=url, token=token))


_OPENAI_AGENTS = """# pip install openai-agents
import asyncio

from agents import Agent, Runner
from agents.mcp import MCPServerStreamableHttp


async def main() -> None:
    params = {{"url": "{url}", "headers": {{"Authorization": "Bearer {token}"}}}}
    async with MCPServerStreamableHttp(params=params, name="corral") as corral:
        agent = Agent(name="analyst", instructions="Run code with corral's tools.",
                      mcp_servers=[corral])
        result = await Runner.run(agent, "Compute the 20th Fibonacci number in Python.")
        print(result.final_output)


asyncio.run(main())
"""


RENDERERS: dict[str, Callable[[str, str], Snippet]] = {
    "claude-code": _claude_code,
    "claude-desktop": _claude_desktop,
    "cursor": _json_config("~/.cursor/mcp.json", "mcpServers", _http_entry),
    "gemini": _json_config(
        "~/.gemini/settings.json",
        "mcpServers",
        lambda url, token: _http_entry(url, token, "httpUrl"),
    ),
    "opencode": _json_config("opencode.json", "mcp", _opencode_entry),
    "kiro": _json_config(".kiro/settings/mcp.json", "mcpServers", _http_entry),
    "openai-agents": _openai_agents,
}


def client_config(client: str, url: str, token: str) -> Snippet:
    """The snippet for `client`; raises `InvalidInput` naming the known clients."""
    renderer = RENDERERS.get(client)
    if renderer is None:
        raise InvalidInput(f"unknown client {client!r}: choose one of {', '.join(RENDERERS)}")
    return renderer(url, token)
