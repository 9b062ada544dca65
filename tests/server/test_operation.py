"""The operation declarations alone (no server): the calls a client makes from them, and
the rule that every REST operation has one handler and one declaration."""

from __future__ import annotations

import pytest

from corral.server import admin, rest
from corral.server.routes import OPERATIONS, operation_of


def test_a_call_fills_the_path_quoted_and_leaves_out_absent_query_values() -> None:
    op = operation_of(rest.operator.admin_audit)
    assert (op.method, op.url(query={"kind": "admin", "session": None, "limit": 5})) == (
        "GET",
        "/v1/admin/audit?kind=admin&limit=5",
    )
    stop = operation_of(rest.operator.admin_stop_session)
    assert stop.url({"id": "a/../b"}) == "/v1/admin/sessions/a%2F..%2Fb/stop"
    assert operation_of(rest.skills.skill_file).url({"name": "s", "filename": "d/f.py"}) == (
        "/v1/skills/s/files/d/f.py"
    )


def test_a_call_with_the_wrong_path_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match="takes"):
        operation_of(admin.delete_session).url({"session": "x"})
    with pytest.raises(LookupError):
        operation_of(rest.executions.execution_view)


def test_each_operation_is_declared_once_with_its_own_handler() -> None:
    keys = [(op.method, op.documented_path) for op in OPERATIONS]
    assert len(keys) == len(set(keys))
    handlers = [op.handler for op in OPERATIONS]
    assert None not in handlers
    assert len({id(h) for h in handlers}) == len(handlers)
