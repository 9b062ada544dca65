"""The audit log's one writer: every entry journaled first, written to the database in order
by a thread of its own, and recovered after a crash.

`submit` appends the entry (a typed `corral.audit_entries.AuditEntry` and a key of its
own) to the journal (`corral.journal`) and queues it; it never waits for the database. So
the entry of an execution is in the journal before its code is sent to the kernel, and a
server killed at any moment loses no entry, whatever the database was doing at the time:
locked by another program, on a full disk, or fine.

The thread writes each entry with its key, so writing one twice changes nothing. After each
batch it syncs the journal; once the journal has grown past `COMPACT_BYTES` and the database
holds all of it, it is cut down to the executions still running.

`open`, before anything runs, writes the journal the last run left to the database, marks
the executions still `running` as interrupted (`server stopped`) and, when that run did not
close cleanly, records a `server` entry saying so. A clean `close` leaves an empty journal.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from corral.audit import AuditLog
from corral.audit_entries import AuditEntry, Event, ExecutionBegun, ExecutionEnded, from_journal
from corral.errors import CorralError, StateUnavailable
from corral.journal import Journal

log = logging.getLogger(__name__)

COMPACT_BYTES: Final = 4 << 20
INTERRUPTED: Final = "server stopped"
OPENED: Final = "opened"  # the first record of a journal in use
CLOSED: Final = "closed"  # the last record of one closed with entries the database refused


@dataclass(frozen=True)
class Recovery:
    """What `open` found of the last run: entries written again, executions it marked
    interrupted, and whether that run stopped without closing."""

    replayed: int
    interrupted: int
    unclean: bool


class _Stop:
    pass


@dataclass(frozen=True)
class _Queued:
    """An entry on its way to the database, and its record as the journal holds it."""

    key: str
    entry: AuditEntry
    record: dict[str, Any]


_Item = _Queued | threading.Event | _Stop


class AuditWriter:
    """Writes `audit`'s entries through the journal at `path`."""

    def __init__(self, audit: AuditLog, path: Path) -> None:
        self.audit = audit
        self.journal = Journal(path)
        # Held while an entry is journaled and queued, so the queue's order is the journal's
        # and an empty queue means the database has seen everything journaled.
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._running: dict[str, dict[str, Any]] = {}  # begun, not ended (the thread's own)
        self._opened: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def open(self) -> Recovery:
        """Recover what the last run left, then start writing."""
        recovery = self._recover()
        self._thread = threading.Thread(
            target=self._write_forever, name="corral-audit", daemon=True
        )
        self._thread.start()
        return recovery

    def submit(self, entry: AuditEntry) -> str:
        """Journal `entry` and queue it for the database; its key.

        Raises `StateUnavailable` when the journal cannot be written (a full disk): the
        caller decides whether to go on without the entry."""
        queued = _queued(uuid.uuid4().hex, entry)
        with self._lock:
            self.journal.append(queued.record)
            self._queue.put(queued)
        return queued.key

    def written(self) -> None:
        """Wait until every entry submitted so far went to the database, or was refused."""
        if self._thread is None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        """Write what is queued, mark what still runs interrupted, and leave the journal
        empty when the database took everything."""
        if self._thread is not None:
            self._queue.put(_Stop())
            self._thread.join()
        self._apply_quietly(lambda: self.audit.mark_interrupted(INTERRUPTED))
        with self._lock:
            if self.audit.pending == 0 and self.audit.dropped == 0:
                self.journal.replace([])
            else:
                self.journal.append({"call": CLOSED, "at": time.time()})
            self.journal.close()

    # -- the thread ------------------------------------------------------------------------

    def _write_forever(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, _Stop):
                return
            if isinstance(item, _Queued):
                self._apply(item)
            if self._queue.empty():  # the end of a batch
                self.journal.sync()
                self._compact_if_due()
            if isinstance(item, threading.Event):
                item.set()

    def _apply(self, queued: _Queued) -> bool:
        """Write one journaled entry; False when the database refused it (logged)."""
        entry = queued.entry
        if isinstance(entry, ExecutionBegun):
            self._running[queued.key] = queued.record
        elif isinstance(entry, ExecutionEnded):
            self._running.pop(entry.begun, None)
        return self._apply_quietly(lambda: entry.write(self.audit, queued.key))

    def _apply_quietly(self, write: Callable[[], object]) -> bool:
        try:
            write()
        except StateUnavailable as exc:  # kept in memory, and in the journal
            log.warning("%s", exc)
            return False
        except (CorralError, TypeError) as exc:
            log.error("the audit log refused an entry: %s", exc)
            return False
        return True

    def _compact_if_due(self) -> None:
        if self.journal.size < COMPACT_BYTES or self.audit.pending or self.audit.dropped:
            return
        with self._lock:
            if self._queue.empty():
                self.journal.replace([self._opened, *self._running.values()])

    # -- recovery --------------------------------------------------------------------------

    def _recover(self) -> Recovery:
        records = self.journal.records()
        unclean = bool(records) and records[-1].get("call") != CLOSED
        replayed = sum(1 for queued in map(_read, records) if queued and self._apply(queued))
        self._running.clear()  # whatever the last run began is over
        marked: list[int] = []
        self._apply_quietly(lambda: marked.append(self.audit.mark_interrupted(INTERRUPTED)))
        interrupted = sum(marked)
        if unclean:
            detail = {"interrupted_executions": interrupted, "replayed_entries": replayed}
            entry = Event(kind="server", actor="system", action="stopped-uncleanly", detail=detail)
            queued = _queued(uuid.uuid4().hex, entry)
            self.journal.append(queued.record)
            self._apply(queued)
        self._opened = {"call": OPENED, "at": time.time()}
        if self.audit.pending == 0:
            self.journal.replace([self._opened])
        else:  # the database refused some: the journal keeps them for the next start
            self.journal.append(self._opened)
        return Recovery(replayed, interrupted, unclean)


def _queued(key: str, entry: AuditEntry) -> _Queued:
    return _Queued(key, entry, {"key": key, "call": entry.TAG, "args": entry.fields()})


# Records of the journal's own (when it was opened and closed) hold no entry.
_MARKS: Final = frozenset({OPENED, CLOSED})


def _read(record: dict[str, Any]) -> _Queued | None:
    """The entry a journal record holds; None for the journal's own marks, and for a record
    this server cannot read (logged)."""
    if record.get("call") in _MARKS:
        return None
    key = record.get("key")
    entry = from_journal(record.get("call"), record.get("args"))
    if entry is None or not isinstance(key, str):
        log.error("the audit journal holds an entry it cannot read: %.200r", record)
        return None
    return _Queued(key, entry, record)
