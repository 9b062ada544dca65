"""The generated OpenAPI document keeps every operation of the one published before the
routes were declared once (issue 34), with compatible request and response schemas.

`openapi_baseline.json` is that document, stored as it was served. A later document may add
operations, properties, statuses and wording; it may not drop an operation, a parameter, a
status, a content type or a property, change a type or a constraint, make a request field
or parameter required that was optional, or stop promising a response field it promised.
A request constraint may widen (a larger maximum, a pattern that takes every string drawn
from the old one): what a client sent before is still taken.
Titles and descriptions are wording and are not compared.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from corral.server.openapi import document

BASELINE = Path(__file__).with_name("openapi_baseline.json")
WORDING = frozenset({"title", "description", "summary"})


def _deref(node: Any, schemas: dict[str, Any], depth: int = 0) -> Any:
    """`node` with every `$ref` to the document's schemas replaced by the schema itself."""
    if depth > 40:
        raise RecursionError("the document's schemas refer to themselves too deeply")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            return _deref(schemas[ref.rsplit("/", 1)[1]], schemas, depth + 1)
        return {key: _deref(value, schemas, depth + 1) for key, value in node.items()}
    if isinstance(node, list):
        return [_deref(item, schemas, depth + 1) for item in node]
    return node


def _covers(old: Any, new: Any, where: str, *, request: bool) -> list[str]:
    """The ways `new` breaks a client written against `old` (empty when it does not)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{where}: was an object, now {new!r:.60}"]
        problems: list[str] = []
        for key, value in old.items():
            if key in WORDING:
                continue
            if key == "required" and isinstance(value, list):
                problems += _required(value, new.get("required", []), where, request=request)
            elif key == "properties":
                for name, schema in value.items():
                    if name not in new.get("properties", {}):
                        problems.append(f"{where}: property {name!r} is gone")
                    else:
                        sub = f"{where}.{name}"
                        problems += _covers(schema, new["properties"][name], sub, request=request)
            elif key not in new:
                problems.append(f"{where}: {key!r} is gone")
            elif request and _widened(key, value, new[key]):
                continue  # a request the old document allowed is still allowed
            else:
                problems += _covers(value, new[key], f"{where}/{key}", request=request)
        return problems
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [f"{where}: {old!r:.80} became {new!r:.80}"]
        return [
            problem
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for problem in _covers(a, b, f"{where}[{i}]", request=request)
        ]
    return [] if old == new else [f"{where}: {old!r:.60} became {new!r:.60}"]


LOWER_BOUNDS = frozenset({"minLength", "minItems", "minimum"})
UPPER_BOUNDS = frozenset({"maxLength", "maxItems", "maximum"})
PATTERN_SAMPLES = 150


def _widened(key: str, old: Any, new: Any) -> bool:
    """Whether a request constraint was only widened: a bound moved outward, or a pattern
    that accepts every string drawn from the old one (a sample; a narrowing shows at once)."""
    if key in UPPER_BOUNDS:
        return isinstance(old, int) and isinstance(new, int) and new >= old
    if key in LOWER_BOUNDS:
        return isinstance(old, int) and isinstance(new, int) and new <= old
    if key == "pattern" and isinstance(old, str) and isinstance(new, str):
        return _accepts_samples(old, new)
    return False


@functools.cache
def _accepts_samples(old: str, new: str) -> bool:
    drawn: list[str] = []

    @hypothesis.settings(
        max_examples=PATTERN_SAMPLES,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(st.from_regex(old, fullmatch=True))
    def draw(text: str) -> None:
        drawn.append(text)

    draw()
    widened = re.compile(new)
    return all(widened.search(text) for text in drawn)


def _required(old: list[str], new: list[str], where: str, *, request: bool) -> list[str]:
    if request:
        return [f"{where}: {name!r} is now required" for name in set(new) - set(old)]
    return [f"{where}: {name!r} is no longer promised" for name in set(old) - set(new)]


def _parameters(op: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(p["in"], p["name"]): p for p in op.get("parameters", [])}


def _operation_problems(old: dict[str, Any], new: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    new_parameters = _parameters(new)
    for key, parameter in _parameters(old).items():
        if key not in new_parameters:
            problems.append(f"{where}: parameter {key} is gone")
            continue
        given = new_parameters[key]
        if given.get("required") and not parameter.get("required"):
            problems.append(f"{where}: parameter {key} is now required")
        problems += _covers(parameter["schema"], given["schema"], f"{where} {key}", request=True)
    if "requestBody" in old:
        body, new_body = old["requestBody"], new.get("requestBody", {})
        if new_body.get("required") and not body.get("required"):
            problems.append(f"{where}: the body is now required")
        problems += _content(body["content"], new_body.get("content", {}), where, request=True)
    for status, response in old["responses"].items():
        if status not in new["responses"]:
            problems.append(f"{where}: status {status} is gone")
            continue
        given = new["responses"][status]
        problems += _covers(
            response.get("headers", {}),
            given.get("headers", {}),
            f"{where} {status} headers",
            request=False,
        )
        problems += _content(
            response.get("content", {}),
            given.get("content", {}),
            f"{where} {status}",
            request=False,
        )
    return problems


def _content(old: dict[str, Any], new: dict[str, Any], where: str, *, request: bool) -> list[str]:
    problems: list[str] = []
    for media, entry in old.items():
        if media not in new:
            problems.append(f"{where}: {media} is gone")
        else:
            problems += _covers(
                entry["schema"], new[media]["schema"], f"{where} {media}", request=request
            )
    return problems


def _all_problems(old_doc: dict[str, Any], new_doc: dict[str, Any]) -> list[str]:
    old_schemas = old_doc["components"]["schemas"]
    new_schemas = new_doc["components"]["schemas"]
    problems: list[str] = []
    for path, operations in old_doc["paths"].items():
        for method, old in operations.items():
            where = f"{method.upper()} {path}"
            new = new_doc["paths"].get(path, {}).get(method)
            if new is None:
                problems.append(f"{where} is gone")
                continue
            problems += _operation_problems(
                _deref(old, old_schemas), _deref(new, new_schemas), where
            )
    return problems


def test_the_generated_document_keeps_every_baseline_operation_compatibly() -> None:
    baseline = json.loads(BASELINE.read_text())
    assert _all_problems(baseline, document()) == []


def _hosts(doc: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"]["NetworkHostsRequest"]
    items: dict[str, Any] = schema["properties"]["hosts"]["items"]
    return items


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda doc: doc["paths"].pop("/v1/skills"), "GET /v1/skills is gone"),
        (
            lambda doc: doc["components"]["schemas"]["ExecuteRequest"]["required"].append(
                "language"
            ),
            "'language' is now required",
        ),
        (
            lambda doc: doc["components"]["schemas"]["SessionModel"]["properties"].pop("state"),
            "property 'state' is gone",
        ),
        (
            lambda doc: doc["components"]["schemas"]["SessionModel"]["required"].remove("state"),
            "'state' is no longer promised",
        ),
        (
            lambda doc: _hosts(doc).update(pattern="^[a-z.]+$"),
            "hosts/items/pattern",
        ),
        (lambda doc: _hosts(doc).update(maxLength=100), "maxLength: 253 became 100"),
    ],
)
def test_the_baseline_check_finds_an_incompatible_change(change: Any, problem: str) -> None:
    baseline = json.loads(BASELINE.read_text())
    changed = json.loads(BASELINE.read_text())
    change(changed)
    assert any(problem in found for found in _all_problems(baseline, changed))
