"""Admin routes the operator's CLI needs besides those in `corral.server.rest`: delete any
session, and add a skill archive. The guard lets only the admin token reach `/v1/admin/`.

The CLI never opens a second service on the state; these routes are how `corral sessions
delete` and `corral skills add` reach the one the server owns. Errors are mapped at the app's
edge (`corral.server.errors`).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from corral.server.operation import Api, service_of
from corral.server.queries import SkillArchiveQuery

api = Api()


class SkillAdded(BaseModel):
    name: str = Field(description="The skill's name (its folder under the user's skills).")
    path: str = Field(description="Where the server unpacked it.")


@api(
    "DELETE",
    "/v1/admin/sessions/{id}",
    "Stop any session and delete its files (admin)",
    ok=(204, None),
)
async def delete_session(request: Request) -> Response:
    await service_of(request).delete_session(request.path_params["id"], actor="admin")
    return Response(status_code=204)


@api(
    "POST",
    "/v1/admin/skills",
    "Add a skill from a .zip body, unpacked with the size, count and path checks (admin)",
    query=SkillArchiveQuery,
    ok=(201, SkillAdded),
    raw_body=True,
    description="A body that is not a zip archive of one skill, or that fails the size, "
    "count or path checks, gets 400 `invalid_input` naming the check.",
)
async def add_skill(request: Request, query: SkillArchiveQuery) -> Response:
    """The body is a skill .zip; `name` (the archive's file name) names a skill whose
    SKILL.md sits at the archive's root. Unpacked with every check of `unpack_skill_zip`."""
    added = await service_of(request).skills.add(query.name, await request.body())
    return JSONResponse(SkillAdded(name=added.name, path=str(added)).model_dump(), status_code=201)
