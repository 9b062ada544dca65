"""The operator's secrets: defined, listed, removed, attached to and detached from sessions
(admin only; no agent route or MCP tool reaches them)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from corral.areas.secrets import Attachment, SecretListing
from corral.server import schemas as s
from corral.server.operation import Api, service_of

api = Api()

SECRET_LINKS = (
    (
        "AttachSecret",
        "put_v1_admin_sessions_id_secrets_secret",
        (("secret", "$response.body#/name"), ("id", "default")),
    ),
    ("RemoveSecret", "delete_v1_admin_secrets_secret", (("secret", "$response.body#/name"),)),
)


@api("GET", "/v1/admin/secrets", "List the secrets (admin)", ok=(200, s.SecretListModel))
async def admin_list_secrets(request: Request) -> dict[str, list[SecretListing]]:
    return {"secrets": service_of(request).secrets.listed()}


@api(
    "PUT",
    "/v1/admin/secrets/{secret}",
    "Define a secret by where its value comes from and where it may go (admin)",
    body=s.SecretRequest,
    ok=(200, s.SecretModel),
    links=SECRET_LINKS,
    description="corral keeps the reference, never the value: the server reads it from its "
    "source at each request that carries the secret's placeholder to one of its hosts.",
)
async def admin_put_secret(request: Request, body: s.SecretRequest) -> SecretListing:
    source, location = ("env", body.from_env) if body.from_env else ("file", body.from_file)
    return await service_of(request).secrets.add(
        request.path_params["secret"], source, location or "", body.hosts
    )


@api(
    "DELETE",
    "/v1/admin/secrets/{secret}",
    "Remove a secret: detached from every session, refused from the next request (admin)",
    ok=(204, None),
)
async def admin_delete_secret(request: Request) -> Response:
    await service_of(request).secrets.remove(request.path_params["secret"])
    return Response(status_code=204)


@api(
    "PUT",
    "/v1/admin/sessions/{id}/secrets/{secret}",
    "Attach a secret to a session, from its next kernel start (admin)",
    ok=(200, s.SecretAttachmentModel),
)
async def admin_attach_secret(request: Request) -> Attachment:
    params = request.path_params
    return await service_of(request).secrets.attach(params["id"], params["secret"])


@api(
    "DELETE",
    "/v1/admin/sessions/{id}/secrets/{secret}",
    "Detach a secret from a session (admin)",
    ok=(200, s.SecretAttachmentModel),
)
async def admin_detach_secret(request: Request) -> Attachment:
    params = request.path_params
    return await service_of(request).secrets.detach(params["id"], params["secret"])
