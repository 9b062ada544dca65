"""`/v1/sessions`: create, list, get, stop, restart and delete a session."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from corral.kernels.session import SessionInfo
from corral.server import schemas as s
from corral.server.auth import role_of
from corral.server.operation import Api, service_of

api = Api()

SESSION_LINKS = (
    ("DeleteFile", "delete_v1_sessions_id_files", (("id", "$response.body#/id"),)),
    (
        "StopCoderunnerSession",
        "delete_v1_sessions_session",
        (("query.session_id", "$response.body#/id"),),
    ),
)


@api(
    "POST",
    "/v1/sessions",
    "Create a session",
    body=s.CreateSessionRequest,
    body_required=False,
    ok=(201, s.SessionModel),
    links=SESSION_LINKS,
)
async def create_session(request: Request, body: s.CreateSessionRequest) -> SessionInfo:
    return await service_of(request).create_session(
        body.id, actor=role_of(request.scope).value, mounts=body.mounts
    )


@api("GET", "/v1/sessions", "List sessions", ok=(200, s.SessionList))
async def list_sessions(request: Request) -> dict[str, list[SessionInfo]]:
    return {"sessions": service_of(request).list_sessions()}


@api("GET", "/v1/sessions/{id}", "Get a session", ok=(200, s.SessionModel))
async def get_session(request: Request) -> SessionInfo:
    return service_of(request).get_session(request.path_params["id"])


@api("DELETE", "/v1/sessions/{id}", "Stop a session and delete its files", ok=(204, None))
async def delete_session(request: Request) -> Response:
    await service_of(request).delete_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
    return Response(status_code=204)


@api(
    "POST",
    "/v1/sessions/{id}/stop",
    "Stop a session's kernels (files stay)",
    ok=(200, s.SessionModel),
)
async def stop_session(request: Request) -> SessionInfo:
    return await service_of(request).stop_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )


@api("POST", "/v1/sessions/{id}/restart", "Replace a session's kernels", ok=(200, s.SessionModel))
async def restart_session(request: Request) -> SessionInfo:
    return await service_of(request).restart_session(
        request.path_params["id"], actor=role_of(request.scope).value
    )
