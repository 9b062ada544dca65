"""The operator's `/v1/admin` routes for sessions: the audit log, the warm pool, stopping any
session, limits and the SSH agent bridge (the network's are in `network`)."""

from __future__ import annotations

from starlette.requests import Request

from corral.audit import AuditPage
from corral.controls import BridgeReport, LimitsReport
from corral.kernels.pool import PoolStatus
from corral.kernels.session import SessionInfo
from corral.server import queries as q
from corral.server import schemas as s
from corral.server.operation import Api, service_of

api = Api()

LIMITS_TEXT = (
    "A value the schema admits can still be refused: a size string that comes to less than "
    "the minimum (128 MiB of memory, 1 byte otherwise) or more than 8192 TiB gets 400 "
    "`invalid_input`; memory below what the session uses now gets 409 `conflict`."
)


@api(
    "GET",
    "/v1/admin/audit",
    "Page through the audit log (admin)",
    query=q.AuditQuery,
    ok=(200, s.AuditPageModel),
)
async def admin_audit(request: Request, query: q.AuditQuery) -> AuditPage:
    return await service_of(request).audit.page(
        kind=query.kind, session=query.session, before_id=query.before_id, limit=query.limit
    )


@api(
    "GET",
    "/v1/admin/pool",
    "The warm pool: kernels ready for new sessions, its target and memory (admin)",
    ok=(200, s.PoolModel),
)
async def admin_pool(request: Request) -> PoolStatus:
    return service_of(request).controls.pool()


@api(
    "POST",
    "/v1/admin/sessions/{id}/stop",
    "Stop any session (admin)",
    ok=(200, s.SessionModel),
)
async def admin_stop_session(request: Request) -> SessionInfo:
    return await service_of(request).admin_stop_session(request.path_params["id"])


@api(
    "GET",
    "/v1/admin/sessions/{id}/limits",
    "A session's limits, what enforces them and its usage (admin)",
    ok=(200, s.SessionLimitsModel),
)
async def admin_get_limits(request: Request) -> LimitsReport:
    return service_of(request).controls.limits(request.path_params["id"])


@api(
    "PATCH",
    "/v1/admin/sessions/{id}/limits",
    "Change a session's limits; running sandboxes change at once where possible (admin)",
    body=s.LimitsChange,
    ok=(200, s.SessionLimitsModel),
    description=LIMITS_TEXT,
)
async def admin_set_limits(request: Request, body: s.LimitsChange) -> LimitsReport:
    changes = body.model_dump(exclude_none=True)  # the model refuses nulls and {}
    return await service_of(request).controls.set_limits(request.path_params["id"], changes)


@api(
    "PUT",
    "/v1/admin/sessions/{id}/bridge",
    "Enable or disable a session's SSH agent bridge, from its next start (admin)",
    body=s.BridgeRequest,
    ok=(200, s.BridgeModel),
)
async def admin_set_bridge(request: Request, body: s.BridgeRequest) -> BridgeReport:
    return await service_of(request).controls.set_bridge(request.path_params["id"], body.ssh_agent)
