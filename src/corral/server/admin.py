"""Admin routes the operator's CLI needs besides those in `rest.py`: delete any session, and
add a skill archive. The guard lets only the admin token reach `/v1/admin/`.

The CLI never opens a second service on the state; these routes are how `corral sessions
delete` and `corral skills add` reach the one the server owns. Errors are mapped at the app's
edge (`corral.server.errors`).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.errors import InvalidInput
from corral.server.rest import service_of

ARCHIVE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,123}\.zip")


class SkillAdded(BaseModel):
    name: str = Field(description="The skill's name (its folder under the user's skills).")
    path: str = Field(description="Where the server unpacked it.")


async def delete_session(request: Request) -> Response:
    await service_of(request).delete_session(request.path_params["id"], actor="admin")
    return Response(status_code=204)


async def add_skill(request: Request) -> Response:
    """The body is a skill .zip; `name` (the archive's file name) names a skill whose
    SKILL.md sits at the archive's root. Unpacked with every check of `unpack_skill_zip`."""
    name = request.query_params.get("name", "skill.zip")
    if not ARCHIVE_NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is not a skill archive's file name (NAME.zip)")
    added = await service_of(request).add_skill(name, await request.body())
    return JSONResponse(SkillAdded(name=added.name, path=str(added)).model_dump(), status_code=201)


ROUTES = [
    Route("/v1/admin/sessions/{id}", delete_session, methods=["DELETE"]),
    Route("/v1/admin/skills", add_skill, methods=["POST"]),
]
