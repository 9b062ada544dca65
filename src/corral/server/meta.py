"""The server's own routes: `/health` (open, for liveness checks and coderunner's clients)
and `/openapi.json` (the document of every operation, built once per app)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from corral import __version__
from corral.config import Settings
from corral.doctor import run_checks
from corral.server import schemas as s
from corral.server.operation import Api, service_of

# Checks whose failure leaves every route but one working: the browser fetch says why itself
# (a user whose administrator has not installed Chromium still has a healthy server).
OPTIONAL = frozenset({"browser"})

api = Api()


@dataclass
class Health:
    """What /health reports: the doctor's failures at start, and the last kernel start failure."""

    failures: dict[str, str] = field(default_factory=dict)

    async def refresh(self, settings: Settings) -> None:
        checks = await asyncio.to_thread(run_checks, settings)
        self.failures = {c.name: c.detail for c in checks if not c.ok and c.name not in OPTIONAL}


@api("GET", "/health", "Liveness and what works", ok=(200, s.HealthModel), open=True)
async def health(request: Request) -> Response:
    failures = dict(request.app.state.health.failures)
    last_failure = service_of(request).kernel_start_failure
    if last_failure:
        failures["kernels"] = last_failure
    body = {
        "status": "unavailable" if failures else "ok",
        "version": __version__,
        "checks": failures or {"sandbox": "ok"},
    }
    return JSONResponse(body, status_code=503 if failures else 200)


@api("GET", "/openapi.json", "This document", ok=(200, None))
async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)
