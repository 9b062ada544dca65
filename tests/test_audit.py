"""The audit log against a real SQLite file: recording, filters, paging, rotation, bounds."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.audit import MAX_CODE_BYTES, MAX_QUERY_LIMIT, ROTATE_EVERY_WRITES, AuditLog
from corral.config import Settings
from corral.errors import InvalidInput, SandboxError
from corral.server.operation import wire
from corral.server.schemas import AuditEntryModel, AuditPageModel
from corral.service import Service
from corral.store import SessionRecord, Store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "corral.db"


@pytest.fixture
def audit(db_path: Path) -> Iterator[AuditLog]:
    with AuditLog(db_path) as log:
        yield log


def test_execution_is_read_back_with_every_field(audit: AuditLog) -> None:
    new_id = audit.record_execution(
        "s1", "python", "print(1)", status="ok", duration_s=0.25, output_bytes=2, at=1000.0
    )
    (entry,) = audit.query().entries
    assert wire(AuditEntryModel, entry) == {
        "id": new_id,
        "at": 1000.0,
        "kind": "execution",
        "session": "s1",
        "actor": "agent",
        "action": "execute",
        "target": None,
        "detail": {},
        "language": "python",
        "code": "print(1)",
        "duration_s": 0.25,
        "status": "ok",
        "output_bytes": 2,
    }


def test_session_event_is_read_back(audit: AuditLog) -> None:
    audit.record_session("s1", "idle-stopped", actor="system", detail={"idle_s": 3600})
    (entry,) = audit.query().entries
    assert (entry.kind, entry.session, entry.action, entry.actor) == (
        "session",
        "s1",
        "idle-stopped",
        "system",
    )
    assert entry.detail == {"idle_s": 3600}
    assert entry.code is None and entry.status is None


def test_admin_action_is_read_back_with_its_json_detail(audit: AuditLog) -> None:
    detail = {"policy": "allowlist", "domains": ["pypi.org", "*.github.com"], "ports": [443]}
    audit.record_admin("set-network-policy", "s1", actor="cli", detail=detail, session="s1")
    (entry,) = audit.query().entries
    assert (entry.kind, entry.action, entry.target, entry.actor) == (
        "admin",
        "set-network-policy",
        "s1",
        "cli",
    )
    assert entry.detail == detail
    assert json.loads(json.dumps(wire(AuditEntryModel, entry)))["detail"] == detail


def test_network_decision_fits_the_generic_record(audit: AuditLog) -> None:
    detail = {"host": "pypi.org", "port": 443, "address": "151.101.0.223", "allowed": True}
    audit.record(
        "network", actor="agent", action="allow", session="s1", target="pypi.org:443", detail=detail
    )
    (entry,) = audit.query(kind="network").entries
    assert (entry.action, entry.target, entry.detail) == ("allow", "pypi.org:443", detail)


def test_entries_are_frozen(audit: AuditLog) -> None:
    audit.record_session("s1", "created", actor="agent", detail={"a": 1})
    (entry,) = audit.query().entries
    with pytest.raises(AttributeError):
        entry.action = "deleted"  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry.detail["a"] = 2  # type: ignore[index]


def test_query_filters_by_kind_session_and_time(audit: AuditLog) -> None:
    audit.record_session("a", "created", actor="agent", at=100.0)
    audit.record_execution("a", "python", "1", status="ok", duration_s=0, output_bytes=0, at=200.0)
    audit.record_execution(
        "b", "bash", "ls", status="error", duration_s=1, output_bytes=9, at=300.0
    )
    audit.record_admin("stop-session", "b", at=400.0)

    def actions(**filters: object) -> list[tuple[str, float]]:
        page = audit.query(**filters)  # type: ignore[arg-type]
        return [(entry.kind, entry.at) for entry in page.entries]

    assert actions(kind="execution") == [("execution", 300.0), ("execution", 200.0)]
    assert actions(session="a") == [("execution", 200.0), ("session", 100.0)]
    assert actions(kind="execution", session="b") == [("execution", 300.0)]
    assert actions(since=200.0, until=400.0) == [("execution", 300.0), ("execution", 200.0)]
    assert actions(since=400.0) == [("admin", 400.0)]
    assert actions(until=100.0) == []
    assert actions(kind="network") == []


def test_paging_with_before_id_has_no_duplicates_or_gaps(audit: AuditLog) -> None:
    ids = [audit.record_session(f"s{n}", "created", actor="agent") for n in range(25)]
    seen: list[int] = []
    before: int | None = None
    pages = 0
    while True:
        page = audit.query(before_id=before, limit=10)
        seen.extend(entry.id for entry in page.entries)
        pages += 1
        if page.next_before_id is None:
            break
        before = page.next_before_id
    assert seen == sorted(ids, reverse=True)
    assert pages == 3


def test_next_before_id_is_none_when_the_page_ends_exactly(audit: AuditLog) -> None:
    for n in range(10):
        audit.record_session(f"s{n}", "created", actor="agent")
    page = audit.query(limit=10)
    assert len(page.entries) == 10
    assert page.next_before_id is None


def test_paging_respects_filters(audit: AuditLog) -> None:
    for n in range(12):
        audit.record_session("even" if n % 2 == 0 else "odd", "started", actor="agent")
    first = audit.query(session="odd", limit=4)
    second = audit.query(session="odd", limit=4, before_id=first.next_before_id)
    entries = first.entries + second.entries
    assert len(entries) == 6
    assert {entry.session for entry in entries} == {"odd"}
    assert second.next_before_id is None


def test_limit_is_capped(audit: AuditLog) -> None:
    for n in range(MAX_QUERY_LIMIT + 5):
        audit.record_session(f"s{n}", "created", actor="agent")
    page = audit.query(limit=MAX_QUERY_LIMIT * 10)
    assert len(page.entries) == MAX_QUERY_LIMIT
    assert page.next_before_id == page.entries[-1].id


@pytest.mark.parametrize(
    "filters",
    [
        {"limit": 0},
        {"limit": -1},
        {"kind": "bogus"},
        {"before_id": 0},
        {"since": 10.0, "until": 5.0},
    ],
)
def test_invalid_query_arguments_are_refused(audit: AuditLog, filters: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        audit.query(**filters)  # type: ignore[arg-type]


def test_invalid_record_arguments_are_refused(audit: AuditLog) -> None:
    with pytest.raises(InvalidInput, match="session event"):
        audit.record_session("s1", "exploded", actor="agent")
    with pytest.raises(InvalidInput, match="actor"):
        audit.record_session("s1", "created", actor="somebody")
    with pytest.raises(InvalidInput, match="status"):
        audit.record_execution("s1", "python", "1", status="fine", duration_s=0, output_bytes=0)
    with pytest.raises(InvalidInput, match="kind"):
        audit.record("gossip", actor="agent", action="x")
    with pytest.raises(InvalidInput, match="record_execution"):
        audit.record("execution", actor="agent", action="execute")
    with pytest.raises(InvalidInput, match="JSON"):
        audit.record_admin("x", None, detail={"when": object()})
    with pytest.raises(InvalidInput, match="JSON"):
        audit.record_admin("x", None, detail={"ratio": float("nan")})
    assert audit.query().entries == ()


@pytest.mark.parametrize(
    "code",
    [
        "print('héllo wörld ✓ 🐍 日本語')\n",
        "for i in range(3):\r\n\tprint(i)\n\n\n",
        "  leading and trailing whitespace  \n",
        "",
        "x = '\\x00 stays an escape'\n",
    ],
)
def test_code_is_stored_exactly_as_sent(audit: AuditLog, code: str) -> None:
    audit.record_execution("s1", "python", code, status="ok", duration_s=0, output_bytes=0)
    (entry,) = audit.query().entries
    assert entry.code == code
    assert entry.detail == {}


def test_code_at_the_cap_is_stored_whole(audit: AuditLog) -> None:
    code = "x" * MAX_CODE_BYTES
    audit.record_execution("s1", "python", code, status="ok", duration_s=0, output_bytes=0)
    assert audit.query().entries[0].code == code


def test_oversize_code_is_truncated_with_a_marker(audit: AuditLog) -> None:
    code = "é" * MAX_CODE_BYTES  # two bytes each: 2 MiB
    audit.record_execution("s1", "python", code, status="ok", duration_s=0, output_bytes=0)
    (entry,) = audit.query().entries
    assert entry.code is not None
    kept, marker = entry.code.rsplit("\n", 1)
    assert kept == "é" * (MAX_CODE_BYTES // 2)
    cut = MAX_CODE_BYTES
    assert marker == f"[corral audit: {cut} more bytes of code not stored]"
    assert entry.detail == {"code_bytes": 2 * MAX_CODE_BYTES, "code_cut_bytes": cut}


def test_truncation_never_splits_a_character(audit: AuditLog) -> None:
    code = "a" + "🐍" * (MAX_CODE_BYTES // 4)  # the cap falls inside the last snake
    audit.record_execution("s1", "python", code, status="ok", duration_s=0, output_bytes=0)
    (entry,) = audit.query().entries
    assert entry.code is not None
    kept = entry.code.rsplit("\n", 1)[0]
    assert code.startswith(kept)
    assert len(kept.encode()) == MAX_CODE_BYTES - 3
    assert entry.detail["code_cut_bytes"] == len(code.encode()) - len(kept.encode())


def test_code_with_lone_surrogates_is_stored_escaped(audit: AuditLog) -> None:
    audit.record_execution(
        "s1", "python", "x = '\ud800'", status="ok", duration_s=0, output_bytes=0
    )
    (entry,) = audit.query().entries
    assert entry.code == "x = '\\ud800'"
    assert entry.detail == {"code_escaped": True}


def test_rotation_keeps_the_newest_max_rows(db_path: Path) -> None:
    with AuditLog(db_path, max_rows=5) as audit:
        ids = [audit.record_session(f"s{n}", "created", actor="agent") for n in range(8)]
        assert audit.rotate() == 3
        assert [entry.id for entry in audit.query().entries] == ids[:2:-1]


def test_rotation_removes_rows_older_than_max_age(db_path: Path) -> None:
    now = time.time()
    with AuditLog(db_path, max_age_s=60) as audit:
        audit.record_session("old", "created", actor="agent", at=now - 120)
        audit.record_session("older", "created", actor="agent", at=now - 3600)
        audit.record_session("new", "created", actor="agent", at=now - 30)
        assert audit.rotate(now=now) == 2
        assert [entry.session for entry in audit.query().entries] == ["new"]


def test_rotation_runs_on_open(db_path: Path) -> None:
    with AuditLog(db_path) as audit:
        for n in range(6):
            audit.record_session(f"s{n}", "created", actor="agent")
        audit.record_session("ancient", "created", actor="agent", at=time.time() - 7200)
    with AuditLog(db_path, max_rows=3, max_age_s=3600) as audit:
        assert [entry.session for entry in audit.query().entries] == ["s5", "s4", "s3"]


def test_rotation_runs_every_batch_of_writes_not_on_each(db_path: Path) -> None:
    with AuditLog(db_path, max_rows=10) as audit:
        for n in range(ROTATE_EVERY_WRITES - 1):
            audit.record_session(f"s{n}", "created", actor="agent")
        assert len(audit.query(limit=MAX_QUERY_LIMIT).entries) == ROTATE_EVERY_WRITES - 1
        audit.record_session("last", "created", actor="agent")
        entries = audit.query(limit=MAX_QUERY_LIMIT).entries
        assert len(entries) == 10
        assert entries[0].session == "last"


def test_ids_keep_growing_after_everything_is_rotated_away(db_path: Path) -> None:
    with AuditLog(db_path, max_age_s=60) as audit:
        first = audit.record_session("s1", "created", actor="agent", at=time.time() - 3600)
        audit.rotate()
        assert audit.query().entries == ()
        assert audit.record_session("s2", "created", actor="agent") > first


def test_two_logs_on_one_file_see_each_others_writes(db_path: Path) -> None:
    with AuditLog(db_path) as one, AuditLog(db_path) as two:
        a = one.record_session("s1", "created", actor="agent")
        b = two.record_admin("stop-session", "s1")
        assert [entry.id for entry in one.query().entries] == [b, a]
        assert [entry.id for entry in two.query().entries] == [b, a]
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_shares_the_database_file_with_the_session_store(db_path: Path) -> None:
    store = Store(db_path)
    try:
        with AuditLog(db_path) as audit:
            store.put(SessionRecord("s1", 1.0, 1.0, "idle"))
            audit.record_session("s1", "created", actor="agent")
            assert [record.id for record in store.all()] == ["s1"]
            assert audit.query().entries[0].session == "s1"
    finally:
        store.close()


@pytest.mark.parametrize("state", ["starting", "idle", "busy"])
def test_the_store_keeps_running_not_a_live_state(db_path: Path, state: str) -> None:
    """busy or idle is the server's to say: stored, it would be stale at the next call."""
    store = Store(db_path)
    try:
        store.put(SessionRecord("s1", 1.0, 1.0, state))
        store.put(SessionRecord("s2", 1.0, 1.0, "stopped"))
        assert [(r.id, r.state) for r in store.all()] == [("s1", "running"), ("s2", "stopped")]
    finally:
        store.close()


def test_concurrent_writers_from_threads_all_land(audit: AuditLog) -> None:
    ids: list[int] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        for i in range(50):
            new_id = audit.record_session(f"t{n}-{i}", "started", actor="agent")
            with lock:
                ids.append(new_id)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 200
    assert len(audit.query(limit=MAX_QUERY_LIMIT).entries) == 200


def test_a_failing_write_raises_sandbox_error(db_path: Path) -> None:
    audit = AuditLog(db_path)
    audit.close()
    with pytest.raises(SandboxError, match="audit log"):
        audit.record_session("s1", "created", actor="agent")
    with pytest.raises(SandboxError, match="audit log"):
        audit.query()


def test_an_unopenable_path_raises_sandbox_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(SandboxError, match="cannot open the audit log"):
        AuditLog(tmp_path / "dir.db")


def test_limits_must_be_positive(db_path: Path) -> None:
    with pytest.raises(InvalidInput):
        AuditLog(db_path, max_rows=0)
    with pytest.raises(InvalidInput):
        AuditLog(db_path, max_age_s=0)


@pytest.mark.bwrap
async def test_the_service_writes_records_in_order_and_reads_them_all(settings: Settings) -> None:
    """Records are written by one thread behind the calls; a read sees every earlier one."""
    async with Service(settings) as service:
        await service.create_session("ordered")
        for n in range(12):
            await service.executions.run(f"{n}", session_id="ordered")
        page = wire(
            AuditPageModel, await service.audit.page(kind="execution", session="ordered", limit=50)
        )
        codes = [entry["code"] for entry in reversed(page["entries"])]
        assert codes == [str(n) for n in range(12)]


@pytest.mark.bwrap
async def test_a_locked_audit_database_never_holds_up_an_execution(settings: Settings) -> None:
    async with Service(settings) as service:
        await service.create_session("unheld")
        holder = sqlite3.connect(settings.db_path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            started = time.monotonic()
            result = await service.executions.run("print('ran')", session_id="unheld")
            answered = time.monotonic() - started
        finally:
            holder.execute("COMMIT")
            holder.close()
        assert result.stdout == "ran\n"
        entries = wire(
            AuditPageModel, await service.audit.page(kind="execution", session="unheld")
        )["entries"]
        assert [entry["code"] for entry in entries] == ["print('ran')"]
        print(f"execution answered in {answered:.3f} s while the database was locked")
