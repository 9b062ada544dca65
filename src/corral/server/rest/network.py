"""A session's network: the agent's access requests, and the operator's policy and
decisions."""

from __future__ import annotations

from starlette.requests import Request

from corral.egress.network import NetworkStatus, PolicyChange
from corral.server import queries as q
from corral.server import schemas as s
from corral.server.operation import Api, service_of
from corral.server.queries import int_param
from corral.store import NetRequest

api = Api()


@api(
    "POST",
    "/v1/sessions/{id}/network/requests",
    "Ask the operator for network access (grants nothing by itself)",
    body=s.NetworkAccessRequest,
    ok=(202, s.NetworkRequestModel),
)
async def request_network(request: Request, body: s.NetworkAccessRequest) -> NetRequest:
    """The agent asks for access; the answer comes from the operator, later."""
    return await service_of(request).network.request_access(
        request.path_params["id"], body.hosts, body.reason
    )


@api(
    "GET",
    "/v1/admin/sessions/{id}/network",
    "A session's network policy (admin)",
    ok=(200, s.NetworkPolicyModel),
)
async def admin_get_network(request: Request) -> NetworkStatus:
    return service_of(request).network.policy(request.path_params["id"])


@api(
    "PUT",
    "/v1/admin/sessions/{id}/network",
    "Replace a session's policy (admin)",
    body=s.NetworkPolicyRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_set_network(request: Request, body: s.NetworkPolicyRequest) -> PolicyChange:
    return await service_of(request).network.set(request.path_params["id"], body.mode, body.allow)


@api(
    "POST",
    "/v1/admin/sessions/{id}/network/allow",
    "Allow hosts (admin)",
    body=s.NetworkHostsRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_allow_network(request: Request, body: s.NetworkHostsRequest) -> PolicyChange:
    return await service_of(request).network.allow(request.path_params["id"], body.hosts)


@api(
    "POST",
    "/v1/admin/sessions/{id}/network/deny",
    "Remove hosts (admin)",
    body=s.NetworkHostsRequest,
    ok=(200, s.NetworkPolicyModel),
)
async def admin_deny_network(request: Request, body: s.NetworkHostsRequest) -> PolicyChange:
    return await service_of(request).network.deny(request.path_params["id"], body.hosts)


@api(
    "GET",
    "/v1/admin/network/requests",
    "Agents' access requests (admin)",
    query=q.NetworkRequestsQuery,
    ok=(200, s.NetworkRequestList),
)
async def admin_network_requests(
    request: Request, query: q.NetworkRequestsQuery
) -> dict[str, list[NetRequest]]:
    return {"requests": await service_of(request).network.requests(query.status)}


@api(
    "POST",
    "/v1/admin/network/requests/{rid}/approve",
    "Approve a request (admin)",
    ok=(200, s.NetworkRequestModel),
)
async def admin_approve_request(request: Request) -> NetRequest:
    return await _decide_request(request, approve=True)


@api(
    "POST",
    "/v1/admin/network/requests/{rid}/reject",
    "Reject a request (admin)",
    ok=(200, s.NetworkRequestModel),
)
async def admin_reject_request(request: Request) -> NetRequest:
    return await _decide_request(request, approve=False)


async def _decide_request(request: Request, *, approve: bool) -> NetRequest:
    request_id = int_param(request.path_params["rid"], default=0)
    return await service_of(request).network.decide(request_id, approve)
