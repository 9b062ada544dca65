"""Admin routes the operator's CLI needs besides those in `rest.py`: delete any session, and
add a skill archive. The guard lets only the admin token reach `/v1/admin/`.

The CLI never opens a second service on the state; these routes are how `corral sessions
delete` and `corral skills add` reach the one the server owns. Errors are mapped at the app's
edge (`corral.server.errors`).
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.errors import InvalidInput
from corral.server.rest import service_of
from corral.skills import user_dir
from corral.skills.archive import unpack_skill_zip

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
    data = await request.body()
    folder = user_dir(service_of(request).settings.config_dir)
    added = await asyncio.to_thread(_unpack, data, name, folder)
    return JSONResponse(SkillAdded(name=added.name, path=str(added)).model_dump(), status_code=201)


def _unpack(data: bytes, name: str, folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-skill-") as tmp:
        archive = Path(tmp) / name
        archive.write_bytes(data)
        return unpack_skill_zip(archive, folder)


ROUTES = [
    Route("/v1/admin/sessions/{id}", delete_session, methods=["DELETE"]),
    Route("/v1/admin/skills", add_skill, methods=["POST"]),
]
