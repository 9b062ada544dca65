"""The audit writer against a real SQLite file and journal: entries journaled before the
database has them, a journal replayed after a crash, a clean close, compaction.

A crash is what the server's SIGKILL leaves: a writer never closed, its journal as written.
The real-process version of it is in tests/endurance/test_never_stall.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from corral import audit_writer
from corral.audit import AuditEntry, AuditLog
from corral.audit_entries import AdminAction, ExecutionBegun, ExecutionEnded, SessionChanged
from corral.audit_writer import AuditWriter
from corral.journal import Journal


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def started(state: Path) -> tuple[AuditLog, AuditWriter]:
    log = AuditLog(state / "corral.db")
    writer = AuditWriter(log, state / "audit.journal")
    writer.open()
    return log, writer


def crashed(log: AuditLog, writer: AuditWriter) -> None:
    """What SIGKILL leaves: the thread stops at once, nothing is closed or marked."""
    writer._queue.put(audit_writer._Stop())  # the thread only; the process would be gone
    assert writer._thread is not None
    writer._thread.join()
    log.close()


def entries(state: Path, kind: str | None = None) -> list[AuditEntry]:
    with AuditLog(state / "corral.db") as log:
        return list(reversed(log.query(kind=kind, limit=1000).entries))


def lock(state: Path) -> sqlite3.Connection:
    """Another program taking the database's write lock (until it rolls back)."""
    holder = sqlite3.connect(state / "corral.db", isolation_level=None, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_an_execution_is_running_once_begun_and_complete_once_ended(state: Path) -> None:
    log, writer = started(state)
    begun = writer.submit(ExecutionBegun(session="s1", language="python", code="1 + 1"))
    writer.written()
    (entry,) = log.query(kind="execution").entries
    assert (entry.status, entry.code, entry.duration_s) == ("running", "1 + 1", None)
    writer.submit(ExecutionEnded(begun=begun, status="ok", duration_s=0.5, output_bytes=3))
    writer.written()
    (entry,) = log.query(kind="execution").entries
    assert (entry.status, entry.duration_s, entry.output_bytes) == ("ok", 0.5, 3)
    writer.close()
    log.close()
    assert (state / "audit.journal").read_bytes() == b""  # a clean close
    assert entries(state, "server") == []


def test_a_crash_leaves_running_code_interrupted_and_says_the_run_ended_uncleanly(
    state: Path,
) -> None:
    log, writer = started(state)
    writer.submit(ExecutionBegun(session="s1", language="python", code="sleep(40)"))
    done = writer.submit(ExecutionBegun(session="s2", language="bash", code="true"))
    writer.submit(ExecutionEnded(begun=done, status="ok", duration_s=0.1, output_bytes=0))
    writer.written()
    crashed(log, writer)

    log, writer = started(state)
    recovered = entries(state, "execution")
    assert [(e.session, e.status) for e in recovered] == [("s1", "interrupted"), ("s2", "ok")]
    assert recovered[0].detail["interrupted"] == "server stopped"
    (server,) = entries(state, "server")
    assert server.action == "stopped-uncleanly" and server.actor == "system"
    assert server.detail["interrupted_executions"] == 1
    writer.close()
    log.close()


def test_entries_the_locked_database_refused_survive_a_crash(state: Path) -> None:
    log, writer = started(state)
    before = len(entries(state))
    holder = lock(state)
    begun = writer.submit(ExecutionBegun(session="s1", language="python", code="print(1)"))
    writer.submit(ExecutionEnded(begun=begun, status="ok", duration_s=0.2, output_bytes=2))
    writer.submit(SessionChanged(session="s1", event="created", actor="agent"))
    # Not in the database, but in the journal before submit returned.
    calls = [record.get("call") for record in Journal(state / "audit.journal").records()]
    assert calls[-3:] == ["begin_execution", "end_execution", "record_session"]
    drop_what_is_queued(writer)  # the crash comes before the thread gets to them
    holder.execute("ROLLBACK")
    holder.close()
    crashed(log, writer)

    log, writer = started(state)
    after = entries(state)[before:]
    assert [e.kind for e in after] == ["execution", "session", "server"]
    assert after[0].status == "ok"  # it ended before the crash: not interrupted
    writer.close()
    log.close()


def drop_what_is_queued(writer: AuditWriter) -> None:
    while not writer._queue.empty():
        writer._queue.get_nowait()


def test_a_journal_replayed_twice_writes_each_entry_once(state: Path) -> None:
    log, writer = started(state)
    writer.submit(AdminAction(action="set_limits", target="s1", detail={"n": 1}))
    writer.written()
    crashed(log, writer)
    journal = (state / "audit.journal").read_bytes()
    log, writer = started(state)
    crashed(log, writer)
    (state / "audit.journal").write_bytes(journal)  # the same entries once more
    log, writer = started(state)
    assert [e.action for e in entries(state, "admin")] == ["set_limits"]
    writer.close()
    log.close()


def test_a_torn_last_line_is_left_out(state: Path) -> None:
    log, writer = started(state)
    writer.submit(AdminAction(action="kept", target="s1"))
    writer.written()
    crashed(log, writer)
    with (state / "audit.journal").open("ab") as journal:
        journal.write(b'{"key":"torn","call":"record_ad')  # a machine crash mid-write
    log, writer = started(state)
    assert [e.action for e in entries(state, "admin")] == ["kept"]
    writer.close()
    log.close()


def test_a_long_journal_is_cut_to_the_executions_still_running(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_writer, "COMPACT_BYTES", 4096)
    log, writer = started(state)
    running = writer.submit(ExecutionBegun(session="s1", language="python", code="x"))
    for n in range(100):
        writer.submit(AdminAction(action="note", target=f"t{n}", detail={"pad": "x" * 100}))
    writer.written()
    records = Journal(state / "audit.journal").records()
    assert [r["call"] for r in records] == ["opened", "begin_execution"]
    assert records[1]["key"] == running
    crashed(log, writer)
    log, writer = started(state)
    assert len(entries(state, "admin")) == 100
    (execution,) = entries(state, "execution")
    assert execution.status == "interrupted"
    writer.close()
    log.close()


def test_a_journal_record_of_an_unknown_entry_is_left_out_and_the_rest_replayed(
    state: Path,
) -> None:
    log, writer = started(state)
    writer.submit(AdminAction(action="kept", target="s1"))
    writer.written()
    crashed(log, writer)
    with (state / "audit.journal").open("ab") as journal:
        for record in (
            {"key": "k1", "call": "query", "args": {"kind": "admin"}},
            {"key": "k2", "call": "record_admin", "args": {"action": "x", "colour": "red"}},
            {"key": "k3", "call": "record_admin", "args": {"action": "after", "target": "s2"}},
        ):
            journal.write(json.dumps(record).encode() + b"\n")
    log, writer = started(state)
    assert [e.action for e in entries(state, "admin")] == ["kept", "after"]
    writer.close()
    log.close()


def test_the_journal_holds_the_code_as_sent(state: Path) -> None:
    log, writer = started(state)
    code = "print('\udcff lone surrogate')"  # valid in JSON, not in UTF-8
    writer.submit(ExecutionBegun(session="s1", language="python", code=code))
    raw = (state / "audit.journal").read_bytes().splitlines()[-1]
    assert json.loads(raw)["args"]["code"] == code
    writer.close()
    log.close()


def test_an_append_never_waits_for_a_sync_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's event loop appends while the writer's thread syncs: a slow disk's
    fdatasync must hold up neither. (The disk is made slow by a stand-in for fdatasync that
    waits for the test: a real one cannot be held still here.)"""
    journal = Journal(tmp_path / "audit.journal")
    syncing, release = threading.Event(), threading.Event()

    def held_fdatasync(fd: int) -> None:
        syncing.set()
        release.wait(30)

    monkeypatch.setattr(os, "fdatasync", held_fdatasync)
    syncer = threading.Thread(target=journal.sync)
    syncer.start()
    try:
        assert syncing.wait(30)
        appender = threading.Thread(target=journal.append, args=({"call": "x"},))
        appender.start()
        appender.join(10)
        assert not appender.is_alive(), "the append waited for the sync"
    finally:
        release.set()
        syncer.join(30)
    assert journal.records() == [{"call": "x"}]
    monkeypatch.undo()
    journal.close()
