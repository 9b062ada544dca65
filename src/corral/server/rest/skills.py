"""The skills: their listing, a skill and its files."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from corral.server import schemas as s
from corral.server.operation import Api, service_of
from corral.skills.catalog import SkillInfo, SkillListing

api = Api()

SKILL_LINKS = (
    (
        "GetSkillFile",
        "get_v1_skills_name_files_filename",
        (("name", "$response.body#/skills/0/name"), ("filename", "SKILL.md")),
    ),
)


@api(
    "GET",
    "/v1/skills",
    "The skills, public and the user's",
    ok=(200, s.SkillList),
    links=SKILL_LINKS,
)
async def list_skills(request: Request) -> SkillListing:
    return await service_of(request).skills.list()


@api("GET", "/v1/skills/{name}", "A skill and its SKILL.md", ok=(200, s.SkillInfo))
async def skill_info(request: Request) -> SkillInfo:
    return await service_of(request).skills.info(request.path_params["name"])


@api(
    "GET",
    "/v1/skills/{name}/files/{filename:path}",
    "A file of a skill (its path inside the skill folder)",
    ok=(200, None),
    raw_response=True,
)
async def skill_file(request: Request) -> Response:
    params = request.path_params
    data = await service_of(request).skills.file(params["name"], params["filename"])
    return Response(data, media_type="application/octet-stream")
