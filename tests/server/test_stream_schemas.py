"""Every event a stream sends is one the OpenAPI document declares for that stream.

The document gives each stream's event data as `contentSchema` (one of the event models);
here real executions and a real session's feed are read over HTTP and each event's data is
checked against that schema with a JSON Schema validator, as a generated client would.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.server.conftest import RunningServer
from tests.server.test_rest import sse_events

DOC = "urn:corral-openapi"
# Output of every kind: stdout, stderr, a display bundle, then an exception.
EVERY_KIND = (
    "import sys\nprint('out', flush=True)\nprint('err', file=sys.stderr, flush=True)\n"
    "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\n"
    "raise ValueError('bad')"
)


def _data_validator(doc: dict[str, Any], path: str, method: str) -> jsonschema.Validator:
    """A validator of one stream's event data, refs resolved in the served document."""
    registry = Registry().with_resource(DOC, Resource.from_contents(doc, DRAFT202012))
    sse_data = "text~1event-stream/schema/properties/data/contentSchema"
    pointer = "/".join(
        ["#/paths", path.replace("/", "~1"), method, "responses/200/content", sse_data]
    )
    return jsonschema.Draft202012Validator({"$ref": DOC + pointer}, registry=registry)


def _matches(validator: jsonschema.Validator, name: str, data: dict[str, Any]) -> None:
    errors = [error.message for error in validator.iter_errors(data)]
    assert not errors, f"event {name!r} does not fit the document: {data}: {errors}"


def test_execution_events_fit_the_documented_schemas(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        doc = http.get("/openapi.json").json()
        with http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json={"code": EVERY_KIND},
            headers={"Accept": "text/event-stream"},
        ) as response:
            events = sse_events(response.iter_lines())
    validator = _data_validator(doc, "/v1/sessions/{id}/execute", "post")
    names = {name for name, _ in events}
    assert {"execution", "stdout", "stderr", "display", "error", "result"} <= names
    for name, data in events:
        _matches(validator, name, data)
    assert list(validator.iter_errors({"seq": 0, "text": "x"})), "the check checks nothing"


def test_session_events_fit_the_documented_schemas(server: RunningServer, sid: str) -> None:
    with server.client() as http:
        doc = http.get("/openapi.json").json()
        assert http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}).status_code == 200
        assert http.post(f"/v1/sessions/{sid}/restart").status_code == 200
        events = []
        with http.stream(
            "GET", f"/v1/sessions/{sid}/events", headers={"Accept": "application/x-ndjson"}
        ) as response:
            for line in response.iter_lines():
                if line.strip():
                    events.append(json.loads(line))
                    if events[-1]["type"] == "restarted":
                        break
    validator = _data_validator(doc, "/v1/sessions/{id}/events", "get")
    assert {"created", "busy", "idle", "restarted"} <= {event["type"] for event in events}
    for event in events:
        name = event.pop("type")
        _matches(validator, name, event)
