"""The one JSON error shape every route and middleware answers with."""

from __future__ import annotations

from starlette.responses import JSONResponse


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """`{"error": {"code": ..., "message": ...}}` with `status`."""
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )
