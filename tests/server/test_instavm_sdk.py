"""The InstaVM SDK, coderunner's Python client, against a real corral server: unchanged but
for the token, which it sends as X-API-Key.

Browsing uses the server of tests/server/test_browser_api.py (public addresses plus
127.0.0.2) and a page served on 127.0.0.2.
"""

from __future__ import annotations

import pytest
from instavm import InstaVM
from instavm.exceptions import AuthenticationError

from corral.browser.fetch import find_chromium
from tests.server.conftest import RunningServer
from tests.server.test_browser_api import TITLE, browsing, page_url

__all__ = ["browsing", "page_url"]  # the fixtures this module borrows

pytestmark = pytest.mark.bwrap


def sdk(server: RunningServer, key: str | None = None) -> InstaVM:
    assert server.tokens is not None
    return InstaVM(local=True, local_url=server.base_url, api_key=key or server.tokens.agent)


def test_execute_with_the_sdk_returns_coderunners_fields(server: RunningServer) -> None:
    client = sdk(server)
    answer = client.execute("import sys\nprint(6 * 7)\nprint('note', file=sys.stderr)")
    assert (answer["stdout"], answer["stderr"]) == ("42\n", "note\n")
    assert answer["execution_time"] >= 0 and answer["cpu_time"] >= 0
    failed = client.execute("raise ValueError('expected')")
    assert failed["stderr"].startswith("Error: Execution Error:")
    assert "ValueError: expected" in failed["stderr"]


def test_the_sdk_with_a_wrong_key_is_refused(server: RunningServer) -> None:
    with pytest.raises(AuthenticationError):
        sdk(server, key="not-the-token").execute("print(1)")


@pytest.mark.timeout(60)
@pytest.mark.skipif(find_chromium(None) is None, reason="no Chromium installed on this host")
def test_the_sdks_browser_reads_a_page(browsing: RunningServer, page_url: str) -> None:
    client = sdk(browsing)
    # Local mode's browsing calls (BrowserManager.navigate would open a cloud session).
    page = client.browser_navigate(page_url)
    assert (page["status"], page["title"]) == ("success", TITLE)
    content = client.browser.extract_content(url=page_url)
    assert content["status"] == "success"
    assert "Text the browser sees." in content["readable_content"]["content"]
