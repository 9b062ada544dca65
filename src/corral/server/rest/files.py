"""A session's workspace files: list, download, upload, delete."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from corral.files import FileEntry, Listing
from corral.server import queries as q
from corral.server import schemas as s
from corral.server.operation import Api, service_of

api = Api()

PATH_TEXT = (
    "`path` is relative to /workspace; one that leaves it (`..`, an absolute path elsewhere, "
    "a link out) or holds a NUL gets 400 `path_refused`."
)


@api(
    "GET",
    "/v1/sessions/{id}/files",
    "List workspace files",
    query=q.FilesQuery,
    ok=(200, s.FileListing),
    description=PATH_TEXT,
)
async def list_files(request: Request, query: q.FilesQuery) -> Listing:
    return service_of(request).files.list(
        request.path_params["id"], query.path, recursive=query.recursive
    )


@api(
    "GET",
    "/v1/sessions/{id}/files/content",
    "Download a workspace file",
    query=q.FileQuery,
    description=PATH_TEXT,
    raw_response=True,
)
async def download_file(request: Request, query: q.FileQuery) -> Response:
    data = service_of(request).files.read(request.path_params["id"], query.path)
    return Response(data, media_type="application/octet-stream")


@api(
    "PUT",
    "/v1/sessions/{id}/files/content",
    "Upload a workspace file (raw body; none writes an empty file)",
    query=q.FileQuery,
    ok=(201, s.FileEntryModel),
    description=PATH_TEXT,
    raw_body=True,
    body_required=False,
)
async def upload_file(request: Request, query: q.FileQuery) -> FileEntry:
    data = await request.body()
    return service_of(request).files.write(request.path_params["id"], query.path, data)


@api(
    "DELETE",
    "/v1/sessions/{id}/files",
    "Delete a workspace file or directory",
    query=q.FileDeleteQuery,
    ok=(204, None),
    description=PATH_TEXT,
)
async def delete_file(request: Request, query: q.FileDeleteQuery) -> Response:
    service_of(request).files.delete(
        request.path_params["id"], query.path, recursive=query.recursive
    )
    return Response(status_code=204)
