"""coderunner's REST routes answer with coderunner's shapes and status codes."""

from __future__ import annotations

from tests.server.conftest import RunningServer


def test_execute_with_code_returns_coderunner_fields(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post("/execute", json={"code": "print('hello')"})
    body = response.json()
    assert response.status_code == 200
    assert set(body) == {"stdout", "stderr", "execution_time", "cpu_time"}
    assert body["stdout"] == "hello\n" and body["stderr"] == ""


def test_execute_accepts_command_and_marks_no_output(server: RunningServer) -> None:
    with server.client() as http:
        body = http.post("/execute", json={"command": "x = 1"}).json()
    assert body["stdout"] == "[Execution successful with no output]"


def test_execute_error_goes_to_stderr_with_coderunners_prefix(server: RunningServer) -> None:
    with server.client() as http:
        body = http.post("/execute", json={"code": "1/0"}).json()
    assert body["stderr"].startswith("Error: Execution Error:\n")
    assert "ZeroDivisionError" in body["stderr"]
    assert "\x1b[" not in body["stderr"]


def test_execute_without_code_is_400_in_coderunners_shape(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post("/execute", json={})
    assert response.status_code == 400
    assert response.json()["stderr"] == "Missing 'code' or 'command' field in request body"


def test_execute_with_malformed_json_is_400(server: RunningServer) -> None:
    with server.client() as http:
        response = http.post("/execute", content=b"{", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["stdout"] == ""


def test_session_routes_create_get_list_and_stop(server: RunningServer) -> None:
    with server.client() as http:
        created = http.post("/v1/sessions/session", json={"session_id": "compat-one"})
        assert created.status_code == 201
        assert created.json()["session_id"] == "compat-one"
        assert created.json()["status"] == "active"
        assert "T" in created.json()["created_at"]
        assert (
            http.post("/v1/sessions/session", json={"session_id": "compat-one"}).status_code == 409
        )
        got = http.get("/v1/sessions/session", params={"session_id": "compat-one"})
        assert got.json()["status"] == "active"
        listed = http.get("/v1/sessions/session").json()["sessions"]
        assert "compat-one" in [s["session_id"] for s in listed]
        run = http.post("/execute", json={"code": "v = 3", "session_id": "compat-one"})
        assert run.status_code == 200
        again = http.post("/execute", json={"code": "print(v)", "session_id": "compat-one"})
        assert again.json()["stdout"] == "3\n"
        stopped = http.delete("/v1/sessions/session", params={"session_id": "compat-one"})
        assert stopped.json()["status"] == "stopped"
        http.delete("/v1/sessions/compat-one")


def test_session_errors_use_coderunners_error_shape(server: RunningServer) -> None:
    with server.client() as http:
        missing = http.get("/v1/sessions/session", params={"session_id": "compat-ghost"})
        assert missing.status_code == 404
        assert "compat-ghost" in missing.json()["error"]
        bad = http.post("/v1/sessions/session", json={"session_id": "../bad"})
        assert bad.status_code == 400
        assert isinstance(bad.json()["error"], str)
        assert http.delete("/v1/sessions/session").status_code == 400
        # A body is checked even when the query names the session (found by the stateful
        # phase of the conformance run: it was ignored, and the session stopped).
        both = http.request(
            "DELETE",
            "/v1/sessions/session",
            params={"session_id": "compat-ghost"},
            json={"session_id": "../bad"},
        )
        assert both.status_code == 400
        assert "session_id" in both.json()["error"]


def test_created_session_without_id_gets_one(server: RunningServer) -> None:
    with server.client() as http:
        created = http.post("/v1/sessions/session")
        assert created.status_code == 201
        session_id = created.json()["session_id"]
        http.delete(f"/v1/sessions/{session_id}")


def test_a_stopped_session_is_gone_from_coderunners_routes_until_started_again(
    server: RunningServer,
) -> None:
    with server.client() as http:
        assert http.post("/v1/sessions/session", json={"session_id": "compat-re"}).is_success
        http.post(
            "/execute", json={"code": "open('kept.txt','w').write('k')", "session_id": "compat-re"}
        )
        assert http.delete("/v1/sessions/session", params={"session_id": "compat-re"}).is_success
        listed = http.get("/v1/sessions/session").json()["sessions"]
        assert "compat-re" not in [s["session_id"] for s in listed]
        got = http.get("/v1/sessions/session", params={"session_id": "compat-re"})
        assert (got.status_code, got.json()) == (404, {"error": "Session 'compat-re' not found."})
        again = http.delete("/v1/sessions/session", params={"session_id": "compat-re"})
        assert (again.status_code, again.json()) == (
            404,
            {"error": "Session 'compat-re' not found."},
        )
        closed = http.post("/execute", json={"code": "1", "session_id": "compat-re"})
        assert closed.status_code == 200 and closed.json()["stdout"] == ""
        assert closed.json()["stderr"].startswith("Error: Session 'compat-re' is closed.")
        resumed = http.post("/v1/sessions/session", json={"session_id": "compat-re"})
        assert (resumed.status_code, resumed.json()["status"]) == (201, "active")
        kept = http.post(
            "/execute", json={"code": "print(open('kept.txt').read())", "session_id": "compat-re"}
        )
        assert kept.json()["stdout"] == "k\n"
        http.delete("/v1/sessions/compat-re")


def test_execute_in_an_unknown_session_answers_200_with_the_error_in_stderr(
    server: RunningServer,
) -> None:
    with server.client() as http:
        answer = http.post("/execute", json={"code": "1", "session_id": "compat-nobody"})
        assert answer.status_code == 200
        assert answer.json()["stderr"] == "Error: Session 'compat-nobody' not found."


def test_execute_names_what_the_proxy_refused_in_stderr(server: RunningServer) -> None:
    code = (
        "import urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen('http://example.com/', timeout=20)\n"
        "except Exception as error:\n"
        "    print(type(error).__name__)\n"
    )
    with server.client() as http:
        answer = http.post("/execute", json={"code": code}).json()
    assert answer["stdout"] == "HTTPError\n"
    assert (
        "The network policy refused example.com:80 (mode none: this session has no network)"
        in answer["stderr"]
    )
    assert "request_network_access" in answer["stderr"]


def test_a_session_body_that_is_not_an_object_is_refused_and_starts_nothing(
    server: RunningServer,
) -> None:
    with server.client() as http:
        before = http.get("/v1/sessions").json()["sessions"]
        for body in ([None, None], "s1", 7):
            answer = http.post("/v1/sessions/session", json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json() == {
                "error": 'The body must be a JSON object, such as {"session_id": "s1"}, or empty.'
            }
        assert http.get("/v1/sessions").json()["sessions"] == before


def test_a_session_id_that_is_empty_or_not_text_is_refused_and_starts_nothing(
    server: RunningServer,
) -> None:
    """Found by the conformance run: `""`, 0 or false used to mean "choose an id"."""
    with server.client() as http:
        before = http.get("/v1/sessions").json()["sessions"]
        for session_id in ("", 0, False, "../x", 7):
            answer = http.post("/v1/sessions/session", json={"session_id": session_id})
            assert answer.status_code == 400, answer.text
            assert "invalid session id" in answer.json()["error"]
        assert http.get("/v1/sessions").json()["sessions"] == before
