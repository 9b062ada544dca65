"""Project mounts and the agent bridge over real HTTP, and `corral bridge` against the server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.config import Settings
from tests.server.conftest import RunningServer, corral, variant_server


@pytest.fixture(scope="module")
def mounted(
    server_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A server whose operator configured one read-write project, 'proj'."""
    project = tmp_path_factory.mktemp("project").resolve()
    (project / "README").write_text("hello from the host\n")
    with variant_server(server_settings, mounts=f"proj={project}:rw") as running:
        yield running


@pytest.fixture
def cleanup(mounted: RunningServer) -> Iterator[list[str]]:
    """Session ids to delete after the test (the server is shared by the module)."""
    ids: list[str] = []
    yield ids
    with mounted.client() as http:
        for sid in ids:
            http.delete(f"/v1/sessions/{sid}")


def test_a_session_is_created_with_its_mount(mounted: RunningServer, cleanup: list[str]) -> None:
    cleanup.append("m-one")
    with mounted.client() as http:
        created = http.post("/v1/sessions", json={"id": "m-one", "mounts": ["proj"]})
        assert created.status_code == 201, created.text
        assert created.json()["mounts"] == ["proj"] and created.json()["state"] == "idle"
        assert http.get("/v1/sessions/m-one").json()["mounts"] == ["proj"]
        listed = {s["id"]: s["mounts"] for s in http.get("/v1/sessions").json()["sessions"]}
        assert listed["m-one"] == ["proj"]
        body = http.post(
            "/v1/sessions/m-one/execute",
            json={"code": "print(open('/workspace/proj/README').read(), end='')"},
        ).json()
    assert body["stdout"] == "hello from the host\n"


def test_an_unknown_mount_is_a_404_naming_the_configured_ones(mounted: RunningServer) -> None:
    with mounted.client() as http:
        response = http.post("/v1/sessions", json={"id": "m-unknown", "mounts": ["home"]})
        assert response.status_code == 404
        assert response.json()["error"] == {
            "code": "mount_not_found",
            "message": "unknown mount 'home': the operator's mounts are proj",
        }
        assert http.get("/v1/sessions/m-unknown").status_code == 404


def test_a_mount_given_as_a_path_is_refused(mounted: RunningServer) -> None:
    with mounted.client() as http:
        response = http.post("/v1/sessions", json={"id": "m-path", "mounts": ["/etc"]})
        assert response.status_code == 422
        message = response.json()["error"]["message"]
        assert message.startswith("mounts.0: Value error, mount name /etc is invalid"), message
        twice = http.post("/v1/sessions", json={"id": "m-path", "mounts": ["proj", "proj"]})
        assert twice.status_code == 422
        assert "mount 'proj' is named twice" in twice.json()["error"]["message"]
        assert http.get("/v1/sessions/m-path").status_code == 404


def test_a_busy_read_write_mount_is_a_409(mounted: RunningServer, cleanup: list[str]) -> None:
    cleanup += ["m-holder", "m-waiter"]
    with mounted.client() as http:
        assert http.post("/v1/sessions", json={"id": "m-holder", "mounts": ["proj"]}).is_success
        busy = http.post("/v1/sessions", json={"id": "m-waiter", "mounts": ["proj"]})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "conflict"
        assert "in use read-write by session 'm-holder'" in busy.json()["error"]["message"]
        assert http.post("/v1/sessions/m-holder/stop").status_code == 200
        ran = http.post("/v1/sessions/m-waiter/execute", json={"code": "print('mine now')"})
        assert ran.json()["stdout"] == "mine now\n"


def test_the_operator_sets_the_bridge_and_an_agent_cannot(
    mounted: RunningServer, cleanup: list[str]
) -> None:
    cleanup.append("m-bridge")
    path = "/v1/admin/sessions/m-bridge/bridge"
    with mounted.client() as agent, mounted.client("admin") as admin:
        assert agent.post("/v1/sessions", json={"id": "m-bridge"}).status_code == 201
        refused = agent.put(path, json={"ssh_agent": True})
        assert refused.status_code == 403
        on = admin.put(path, json={"ssh_agent": True})
        assert on.status_code == 200
        assert on.json() == {
            "session_id": "m-bridge",
            "ssh_agent": True,
            "active": False,
            "restart_needed": True,  # running without a bridge: it applies at the next start
        }
        off = admin.put(path, json={"ssh_agent": False}).json()
        assert off["restart_needed"] is False and off["active"] is False
        assert admin.post("/v1/admin/sessions/m-bridge/stop").status_code == 200
        stopped = admin.put(path, json={"ssh_agent": True}).json()
        assert stopped["restart_needed"] is False  # nothing runs: the next start has it
        for bad in ({}, {"ssh_agent": "maybe"}, {"ssh_agent": True, "ssh": True}):
            assert admin.put(path, json=bad).status_code == 422, bad
        assert (
            admin.put("/v1/admin/sessions/ghost/bridge", json={"ssh_agent": True}).status_code
            == 404
        )
        audit = admin.get("/v1/admin/audit", params={"kind": "admin", "session": "m-bridge"})
        actions = [(e["action"], e["detail"]) for e in audit.json()["entries"]]
    assert actions.count(("set_bridge", {"ssh_agent": True})) == 2
    assert actions.count(("set_bridge", {"ssh_agent": False})) == 1


def test_corral_bridge_enable_and_disable(mounted: RunningServer, cleanup: list[str]) -> None:
    cleanup.append("m-cli")
    with mounted.client() as http:
        assert http.post("/v1/sessions", json={"id": "m-cli"}).status_code == 201
    code, text = corral(mounted, "bridge", "enable", "m-cli")
    assert code == 0, text
    assert text == (
        "session m-cli: SSH agent bridge enabled\n"
        "restart the session to apply: corral sessions stop m-cli\n"
    )
    code, text = corral(mounted, "bridge", "disable", "m-cli")
    assert (code, text) == (0, "session m-cli: SSH agent bridge disabled\n")
    code, text = corral(mounted, "bridge", "enable", "ghost")
    assert code == 1 and "Session 'ghost' not found." in text
