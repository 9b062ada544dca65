"""Every REST operation of the server, from the modules that declare them.

coderunner's routes come before `/v1`'s: `/v1/sessions/session` is theirs, not the session
named "session".
"""

from __future__ import annotations

from starlette.routing import Route

from corral.server import admin, compat, meta
from corral.server.operation import Handler, Operation
from corral.server.rest import AREAS

OPERATIONS: tuple[Operation, ...] = (
    *meta.api.operations,
    *compat.api.operations,
    *(op for area in AREAS for op in area.api.operations),
    *admin.api.operations,
)


def routes() -> list[Route]:
    return [op.route() for op in OPERATIONS]


def operation_of(handler: Handler) -> Operation:
    """The operation `handler` serves: how a client names the call it makes."""
    for op in OPERATIONS:
        if op.handler is handler:
            return op
    raise LookupError(f"{handler!r} serves no operation")
