"""`/v1/browser/fetch`: a web page loaded in a sandboxed browser."""

from __future__ import annotations

from starlette.requests import Request

from corral.browser.fetch import PageResult
from corral.server import schemas as s
from corral.server.operation import Api, service_of

api = Api()

FETCH_ERRORS = (
    ("403", "The browsing policy refused the page's host; the message says how to allow it"),
    ("502", "The page could not be loaded; the message says why"),
    ("504", "The page did not load within the timeout"),
)


@api(
    "POST",
    "/v1/browser/fetch",
    "Load a web page in a sandboxed browser: title, final URL, text, links",
    body=s.FetchRequest,
    ok=(200, s.PageModel),
    extra_errors=FETCH_ERRORS,
)
async def browser_fetch(request: Request, body: s.FetchRequest) -> PageResult:
    return await service_of(request).browser.fetch(
        body.url, screenshot=body.screenshot, timeout_s=body.timeout_s
    )
