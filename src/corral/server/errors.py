"""Mapping corral's errors and bad input to HTTP statuses, in one place (the edge).

Known errors become a status and their message; anything else is logged with its traceback
and becomes a 500 that reveals nothing of it. A client that went away before its body
arrived is normal: one quiet line, no traceback, and nothing to answer.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match

from corral import errors as e
from corral.server.responses import error_response

log = logging.getLogger(__name__)

# Most specific first: the first class that matches decides.
STATUSES: tuple[tuple[type[e.CorralError], int, str], ...] = (
    (e.PathRefused, 400, "path_refused"),
    (e.InvalidInput, 400, "invalid_input"),
    (e.SessionNotFound, 404, "session_not_found"),
    (e.MountNotFound, 404, "mount_not_found"),
    (e.ExecutionNotFound, 404, "execution_not_found"),
    (e.NotFound, 404, "not_found"),
    (e.Conflict, 409, "conflict"),
    (e.TooLarge, 413, "too_large"),
    (e.BodyTimedOut, 408, "body_timeout"),
    (e.TooManySessions, 429, "too_many_sessions"),
    (e.StorageFull, 507, "storage_full"),
    (e.CapacityExceeded, 429, "capacity_exceeded"),
    (e.FetchTimedOut, 504, "fetch_timed_out"),
    (e.FetchRefused, 403, "browsing_refused"),
    (e.FetchFailed, 502, "fetch_failed"),
    (e.ShuttingDown, 503, "shutting_down"),
    (e.SandboxUnavailable, 503, "sandbox_unavailable"),
    (e.StateUnavailable, 503, "state_unavailable"),
    (e.KernelStartFailed, 503, "kernel_start_failed"),
    (e.SandboxError, 500, "internal_error"),
)


def status_of(exc: e.CorralError) -> tuple[int, str]:
    for cls, status, code in STATUSES:
        if isinstance(exc, cls):
            return status, code
    return 500, "internal_error"


async def corral_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, e.CorralError):
        return await unexpected_error(request, exc)
    status, code = status_of(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
    response = error_response(status, code, str(exc))
    if status == 408:  # the rest of the body will not come: nothing more to read here
        response.headers["connection"] = "close"
    return response


async def validation_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ValidationError):
        return await unexpected_error(request, exc)
    problems = "; ".join(_problem(err) for err in exc.errors(include_url=False))
    return error_response(422, "invalid_body", problems)


def _problem(err: Any) -> str:
    """'tasks: Input should be greater than or equal to 8 (got 4)': where, what, the value."""
    where = ".".join(str(part) for part in err["loc"]) or "body"
    given = err.get("input")
    shown = f" (got {given!r:.80})" if isinstance(given, str | int | float) and err["loc"] else ""
    return f"{where}: {err['msg']}{shown}"


async def client_went_away(request: Request, exc: Exception) -> Response:
    log.info(
        "%s %s: the client went away before its body arrived", request.method, request.url.path
    )
    # Nobody reads it: uvicorn drops what is sent on a closed connection.
    return Response(status_code=400)


async def routing_error(request: Request, exc: Exception) -> Response:
    """No route for the path (404), or not for its method (405, with the methods it takes)."""
    if not isinstance(exc, HTTPException):
        return await unexpected_error(request, exc)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        allowed = _methods_for(request)
        headers["Allow"] = allowed
        message = f"{request.method} is not allowed on {request.url.path}; it takes {allowed}"
        return error_response(405, "method_not_allowed", message, headers)
    if exc.status_code == 404:
        return error_response(404, "not_found", f"no route {request.url.path}", headers)
    return error_response(exc.status_code, "http_error", str(exc.detail), headers)


def _methods_for(request: Request) -> str:
    """Every method some route takes at this path (Starlette names the first route's only)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if route.matches(request.scope)[0] == Match.PARTIAL:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s crashed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "corral hit an unexpected error; see its log")


HANDLERS = {
    ClientDisconnect: client_went_away,
    e.CorralError: corral_error,
    ValidationError: validation_error,
    HTTPException: routing_error,
    Exception: unexpected_error,
}
