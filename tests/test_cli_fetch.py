"""`corral fetch` and the doctor's browser check, run as a user would run them: a real process,
the system Chromium in a real sandbox, a page served on 127.0.0.2 (listed in the browsing
policy through CORRAL_BROWSER_ALLOW)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.browser.fetch import find_chromium
from tests.loopback import HOST, serve_directory

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_chromium(None) is None, reason="no Chromium installed on this host"),
]

CORRAL = [sys.executable, "-m", "corral"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TITLE = "Corral CLI page"
EXIT_CORRAL_ERROR = 5
DEBIAN_CHROMIUM = "/usr/lib/chromium/chromium"

Corral = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("pages")
    (root / "index.html").write_text(
        f"<!DOCTYPE html><title>{TITLE}</title><p>Printed by corral fetch.</p>"
    )
    with serve_directory(root) as port:
        yield f"http://{HOST}:{port}/"


@pytest.fixture
def corral(tmp_path: Path, run_root: Path) -> Corral:
    """Runs `corral ARGS` with its state, config and run folders in temporary directories."""

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        environ = {
            **os.environ,
            "CORRAL_STATE_DIR": str(tmp_path / "state"),
            "CORRAL_CONFIG_DIR": str(tmp_path / "config"),
            "CORRAL_RUN_ROOT": str(run_root),
            "CORRAL_BROWSER_ALLOW": HOST,
        }
        return subprocess.run(
            [*CORRAL, *args], capture_output=True, text=True, env=environ, timeout=55, check=False
        )

    return call


def one_line(text: str) -> str:
    """`text` with its line breaks undone (rich wraps stderr at 80 columns off a terminal)."""
    return " ".join(text.split())


def test_fetch_json_prints_the_page_and_saves_the_screenshot(
    corral: Corral, page_url: str, tmp_path: Path
) -> None:
    shot = tmp_path / "page.png"
    done = corral("fetch", page_url, "--json", "--screenshot", str(shot), "-t", "20")
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    assert (page["title"], page["url"], page["status"], page["loaded"]) == (
        TITLE,
        page_url,
        200,
        True,
    )
    assert "Printed by corral fetch." in page["text"]
    assert shot.read_bytes().startswith(PNG_MAGIC)


def test_fetch_of_a_file_url_fails_with_the_reason(corral: Corral) -> None:
    done = corral("fetch", "file:///etc/passwd")
    assert done.returncode == EXIT_CORRAL_ERROR
    assert "corral: only http and https URLs can be fetched, not file:" in one_line(done.stderr)
    assert done.stdout == ""


def test_fetch_of_a_refused_address_fails_naming_it(corral: Corral) -> None:
    done = corral("fetch", "http://127.0.0.1:8222/")
    assert done.returncode == EXIT_CORRAL_ERROR, done.stdout
    assert "the browsing policy refused 127.0.0.1:8222" in one_line(done.stderr)
    assert done.stdout == ""


def test_doctor_names_the_chromium_it_will_run(corral: Corral) -> None:
    done = corral("doctor", "--json")
    checks = {check["name"]: check for check in json.loads(done.stdout)}
    browser = checks["browser"]
    assert browser["ok"], browser
    # Debian's package, the first place corral looks, wherever it is installed.
    expected = DEBIAN_CHROMIUM if os.access(DEBIAN_CHROMIUM, os.X_OK) else find_chromium(None)
    assert browser["detail"].startswith(f"{expected}, driven by Playwright "), browser
