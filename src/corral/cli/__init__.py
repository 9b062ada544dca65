"""The `corral` command line: doctor, run, fetch, sessions, audit, limits, serve, the MCP
clients' set-up, skills, the network policy, secrets and the SSH agent bridge.

A thin caller: it parses arguments, calls, and prints; corral errors become a message on
stderr and a non-zero exit code. Only one process owns a state directory (`corral.owner`):
commands that read or change sessions, the audit log or skills go through the running
server's HTTP API (`corral.remote`; `corral --url URL` names one). When no server runs,
they act on the state through `corral.offline`, the one module that does; `serve` and
`mcp-stdio` alone run a service of their own, which holds the state's lock.

`base` holds the group and what the commands share; each other module adds its commands
to the group when imported, which this package does.
"""

from corral.cli import network, run, secrets, serve, sessions, skills  # noqa: F401 - they add commands
from corral.cli.base import main

__all__ = ["main"]
