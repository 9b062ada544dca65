"""/health tells the truth: 503 with the reason when sandboxes cannot start."""

from __future__ import annotations

from pathlib import Path

import httpx

from corral.config import Settings
from tests.server.conftest import (
    RunningServer,
    variant_server,
)


def test_health_reports_version_and_ok(server: RunningServer) -> None:
    body = httpx.get(f"{server.base_url}/health").json()
    assert body["status"] == "ok"
    assert body["version"]


def test_health_is_ok_without_a_browser(server_settings: Settings, tmp_path: Path) -> None:
    """No Chromium (a user whose administrator has not installed it): only the fetch fails."""
    with variant_server(server_settings, browser_chromium=str(tmp_path / "no-chromium")) as running:
        health = httpx.get(f"{running.base_url}/health")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok"


def test_health_is_503_with_the_reason_when_sandboxes_cannot_start(
    server_settings: Settings, tmp_path: Path
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap 0.11.0' && exit 0\n"
        "echo 'bwrap: No permissions to create new namespace' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    with variant_server(server_settings, bwrap=str(fake)) as running:
        health = httpx.get(f"{running.base_url}/health")
        assert health.status_code == 503
        body = health.json()
        assert body["status"] == "unavailable"
        assert "No permissions to create new namespace" in body["checks"]["user namespaces"]
        with running.client() as http:
            failed = http.post("/v1/execute", json={"code": "1"})
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "kernel_start_failed"
        assert "kernels" in httpx.get(f"{running.base_url}/health").json()["checks"]
