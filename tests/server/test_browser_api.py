"""The browser fetch over the wire: REST, coderunner's browser routes and the MCP tool.

A real server (its own, browsing public addresses plus 127.0.0.2) fetches a page served on
127.0.0.2 with the system Chromium; the refused URL is the server's own port on 127.0.0.1.
Each fetch starts a sandbox and a Chromium, so every test fetches at most two pages.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from mcp.types import ImageContent, TextContent

from corral.browser.fetch import find_chromium
from corral.config import Settings
from corral.server.schemas import PageModel
from tests.loopback import HOST, serve_directory
from tests.server.conftest import RunningServer, variant_server
from tests.server.test_mcp import connect, structured, text_of

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_chromium(None) is None, reason="no Chromium installed on this host"),
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TITLE = "Corral API page"
INDEX = f"""<!DOCTYPE html>
<html><head><title>{TITLE}</title></head>
<body><p>Text the browser sees.</p>
<div style="display:none">text nobody sees</div>
<a href="/first.html">First</a> <a href="/second.html">Second</a>
</body></html>
"""
FAILED = "Error: Failed to retrieve all visible text: "


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("pages")
    (root / "index.html").write_text(INDEX)
    with serve_directory(root) as port:
        yield f"http://{HOST}:{port}/"


@pytest.fixture(scope="module")
def browsing(server_settings: Settings) -> Iterator[RunningServer]:
    with variant_server(server_settings, browser_allow=HOST) as running:
        yield running


def own_url(server: RunningServer) -> str:
    """The server's own address: loopback, so the browsing policy refuses it."""
    return f"http://127.0.0.1:{server.settings.port}/health"


# -- REST ----------------------------------------------------------------------------------


def test_fetch_returns_the_page_with_a_screenshot(browsing: RunningServer, page_url: str) -> None:
    with browsing.client() as http:
        response = http.post("/v1/browser/fetch", json={"url": page_url, "screenshot": True})
    assert response.status_code == 200, response.text
    page = response.json()
    assert set(page) == set(PageModel.model_fields)
    assert (page["title"], page["url"], page["status"]) == (TITLE, page_url, 200)
    assert "Text the browser sees." in page["text"] and "text nobody sees" not in page["text"]
    assert [link["text"] for link in page["links"]] == ["First", "Second"]
    assert (page["loaded"], page["truncated"], page["refused"], page["notes"]) == (
        True,
        False,
        [],
        [],
    )
    assert base64.b64decode(page["screenshot_png_base64"]).startswith(PNG_MAGIC)


def test_fetch_of_a_file_url_is_422_saying_why(browsing: RunningServer) -> None:
    with browsing.client() as http:
        response = http.post("/v1/browser/fetch", json={"url": "file:///etc/passwd"})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "invalid_body",
        "message": "url: Value error, only http and https URLs can be fetched, not file: "
        "(got 'file:///etc/passwd')",
    }


def test_fetch_the_policy_refuses_is_403_naming_it(browsing: RunningServer) -> None:
    # A refusal by policy is the client's to resolve (the message says how); 502 is kept for
    # a page that could not be loaded.
    with browsing.client() as http:
        response = http.post("/v1/browser/fetch", json={"url": own_url(browsing)})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "browsing_refused"
    assert "CORRAL_BROWSER_NET" in error["message"]
    assert f"the browsing policy refused 127.0.0.1:{browsing.settings.port}" in error["message"]


def test_a_timeout_past_the_cap_loads_with_the_cap(browsing: RunningServer, page_url: str) -> None:
    with browsing.client() as http:
        response = http.post("/v1/browser/fetch", json={"url": page_url, "timeout_s": 10_000})
        assert response.status_code == 200, response.text
        assert response.json()["loaded"] is True
        response = http.post("/v1/browser/fetch", json={"url": page_url, "timeout_s": 0})
    assert response.status_code == 422


def test_fetch_without_a_token_is_401(browsing: RunningServer, page_url: str) -> None:
    with browsing.client(token=None) as http:
        for path in ("/v1/browser/fetch", "/v1/browser/interactions/navigate"):
            assert http.post(path, json={"url": page_url}).status_code == 401, path


# -- coderunner's routes -------------------------------------------------------------------


def test_navigate_answers_coderunners_success_shape(browsing: RunningServer, page_url: str) -> None:
    with browsing.client() as http:
        response = http.post(
            "/v1/browser/interactions/navigate", json={"url": page_url, "wait_timeout": 20_000}
        )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"status", "url", "title", "content"}
    assert (answer["status"], answer["url"], answer["title"]) == ("success", page_url, TITLE)
    assert "Text the browser sees." in answer["content"]


def test_navigate_to_a_refused_url_is_an_error_with_status_200(
    browsing: RunningServer,
) -> None:
    with browsing.client() as http:
        response = http.post("/v1/browser/interactions/navigate", json={"url": own_url(browsing)})
    assert response.status_code == 200
    answer = response.json()
    assert set(answer) == {"status", "error"} and answer["status"] == "error"
    assert answer["error"].startswith(FAILED + "could not load")
    assert f"refused 127.0.0.1:{browsing.settings.port}" in answer["error"]


def test_content_answers_readable_content_and_the_anchors_asked_for(
    browsing: RunningServer, page_url: str
) -> None:
    body = {"url": page_url, "include_anchors": True, "max_anchors": 1}
    with browsing.client() as http:
        response = http.post("/v1/browser/interactions/content", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"status", "readable_content", "anchors"}
    assert answer["status"] == "success"
    assert "Text the browser sees." in answer["readable_content"]["content"]
    assert answer["anchors"] == [{"href": f"{page_url}first.html", "text": "First"}]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"url": "file:///etc/passwd"}, FAILED + "only http and https URLs"),
        ({}, "Error: Missing 'url' field in request body"),
        ({"url": 5}, "Error: Invalid request body"),
    ],
    ids=["file-url", "no-url", "not-a-string"],
)
def test_content_errors_answer_status_200_with_coderunners_shape(
    browsing: RunningServer, body: dict[str, object], error: str
) -> None:
    with browsing.client() as http:
        response = http.post("/v1/browser/interactions/content", json=body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["status"] == "error" and answer["error"].startswith(error), answer


# -- MCP -----------------------------------------------------------------------------------


async def test_the_mcp_tool_returns_text_and_a_screenshot_image(
    browsing: RunningServer, page_url: str
) -> None:
    async with connect(browsing) as client:
        listed = await client.list_tools()
        assert "navigate_and_get_all_visible_text" in {tool.name for tool in listed.tools}
        result = await client.call_tool(
            "navigate_and_get_all_visible_text", {"url": page_url, "screenshot": True}
        )
    assert not result.is_error, text_of(result)
    assert isinstance(result.content[0], TextContent)
    assert "Text the browser sees." in text_of(result)
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
    page = structured(result)
    assert (page["title"], page["url"]) == (TITLE, page_url)


async def test_the_mcp_tool_without_screenshot_returns_no_image(
    browsing: RunningServer, page_url: str
) -> None:
    async with connect(browsing) as client:
        result = await client.call_tool("navigate_and_get_all_visible_text", {"url": page_url})
    assert not result.is_error, text_of(result)
    assert all(isinstance(block, TextContent) for block in result.content)
    assert structured(result)["screenshot_png_base64"] is None


async def test_the_mcp_tool_reports_a_refused_url_as_an_error(browsing: RunningServer) -> None:
    async with connect(browsing) as client:
        result = await client.call_tool(
            "navigate_and_get_all_visible_text", {"url": own_url(browsing)}
        )
    assert result.is_error
    text = text_of(result)
    assert text.startswith(FAILED + "could not load"), text
    assert f"refused 127.0.0.1:{browsing.settings.port}" in text


async def test_the_mcp_tool_refuses_a_file_url(browsing: RunningServer) -> None:
    async with connect(browsing) as client:
        result = await client.call_tool(
            "navigate_and_get_all_visible_text", {"url": "file:///etc/passwd"}
        )
    assert result.is_error
    assert text_of(result) == FAILED + "only http and https URLs can be fetched, not file:"
