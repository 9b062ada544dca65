"""The kernel factory: sessions' sandboxed kernels, assembled on the server's host.

One `KernelFactory` per server builds a session's sandbox on the `SandboxHost` (runtime,
bwrap, limit mechanism, identity files) with what sessions add: the operator's forwarded
variables, project mounts and protected names, the skill binds and the egress sockets. The
session registry and the warm pool's hand-over use it; it never looks at the registry. What
it has to report (the agent bridge used, protected files changed) goes to the `on_event`
callback.

A session's run (`SessionRun`: limit box, bridge, prepared mounts, and the one sandbox all
its kernels start in) opens with its first kernel and closes with its last; the factory keeps
the open runs so that no two running sessions mount overlapping folders read-write.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from corral.config import Settings
from corral.egress.vault import OPTION as SECRETS_OPTION
from corral.errors import InvalidInput, KernelStartFailed
from corral.fsafe import UnsafePath
from corral.kernels.kernel import SandboxedKernel
from corral.kernels.projects import PreparedMount, prepare_mounts
from corral.kernels.run import SessionRun, open_bridge
from corral.kernels.sandbox import SessionSandbox, make_run_dir
from corral.kernels.session import Session
from corral.mounts import overlapping
from corral.protect import escape_name, validate_protected_names
from corral.sandbox.host import SandboxHost
from corral.sandbox.policy import Bind
from corral.sandbox.profile import forwarded_env, skill_binds
from corral.sandbox.runtime import create_session_env, repair_note, repair_session_env

log = logging.getLogger(__name__)


# Called as (kind, session, action, detail) for the audit log: "bridge", "protected".
EventHook = Callable[[str, str, str, dict[str, Any]], None]
KEPT_NAMES_SHOWN = 10  # names a session note lists of the paths kept from the host


def kept_note(mount: str, shown: list[str]) -> str:
    """What the agent reads when a path it wrote in a read-write mount stays in the sandbox."""
    names = ", ".join(shown[:KEPT_NAMES_SHOWN])
    if len(shown) > KEPT_NAMES_SHOWN:
        names += f" and {len(shown) - KEPT_NAMES_SHOWN} more"
    return (
        f"kept from the host folder of mount {mount!r}: {names}. These are files the host "
        "would run or read as settings (git's control files, agent and editor settings); "
        "this session sees its own version, the host folder keeps its own"
    )


SANDBOX_CA_BUNDLE = "/opt/corral/tls/ca-bundle.pem"
SANDBOX_CA_CERT = "/opt/corral/tls/corral-ca.pem"
CA_BUNDLE_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
)


class EgressSockets(Protocol):
    """Gives a session's proxy socket, listening; the network layer implements it."""

    async def socket_for(self, session_id: str) -> Path: ...

    async def forget(self, session_id: str) -> None: ...

    def rename(self, old_id: str, new_id: str) -> None: ...

    def trust_files(self) -> tuple[Path, Path]:
        """(a bundle of the system's roots and corral's CA, corral's CA certificate)."""
        ...

    def reads_https(self, session_id: str) -> bool:
        """Whether the session's policy has entries the proxy checks request by request."""
        ...


class KernelFactory:
    """Builds and starts sandboxed kernels for sessions; raises `InvalidInput` at
    construction for a forwarded variable or protected name the operator may not use."""

    def __init__(
        self,
        settings: Settings,
        host: SandboxHost,
        *,
        egress: EgressSockets | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.egress = egress
        self.on_event = on_event
        self.forward_names = settings.forwarded_names
        self.mounts = dict(settings.mount_specs)
        self.protected_extra = validate_protected_names(settings.protected_names)
        self.skill_binds = skill_binds(settings)
        self._runs: dict[str, SessionRun] = {}  # the open runs, by session id
        self._env_lock = threading.Lock()  # one package prefix written at a time

    # -- a session's kernels --------------------------------------------------------------

    async def launch(self, session: Session, language: str) -> None:
        """Start a kernel cold: package prefix, the run and its sandbox, then the kernel."""
        session.from_pool = False
        font_list = self.host.fonts.seed()
        if repaired := await asyncio.to_thread(self._prepare_env, session, font_list):
            session.notes.append(repair_note(repaired))
        socket = None
        if self.egress is not None:  # listening again if the socket was removed meanwhile
            socket = await self.egress.socket_for(session.id)
        sandbox = await self._sandbox_of(session, socket)
        kernel = SandboxedKernel(language, sandbox)
        await kernel.start(self.settings.kernel_start_timeout_s)
        session.kernels[language] = kernel

    async def _sandbox_of(self, session: Session, socket: Path | None) -> SessionSandbox:
        """The session's running sandbox, started with its run when there is none. A run
        whose sandbox ended (its spawner was killed, say) is closed first: its kernels went
        with it, and each is said to be restarted on its next call."""
        run = session.run
        if run is not None and run.sandbox is not None and not run.sandbox.alive():
            for language in list(session.kernels):
                await self.drop_kernel(session, language)
                session.lost.add(language)
            await self.close_run(session)
        run = await self.open_run(session)
        if run.sandbox is None:
            run.sandbox = await self._start_sandbox(session, run, socket)
        return run.sandbox

    async def _start_sandbox(
        self, session: Session, run: SessionRun, socket: Path | None
    ) -> SessionSandbox:
        extras = run.extras(self.host.runtime.sandbox_python)
        trust_binds, trust_env = self._secrets_env(session)
        run_dir = await asyncio.to_thread(make_run_dir, self.settings.run_root)
        policy = self.host.policy(
            session.paths,
            tmp_size_bytes=session.limits.tmp_bytes,
            egress_socket=socket,
            forward_env=(
                forwarded_env(self.forward_names, dict(os.environ)) + extras.env + trust_env
            ),
            extra_binds=(*self.skill_binds, *extras.binds, *trust_binds),
        )
        sandbox = SessionSandbox(
            policy.with_run_dir(run_dir),
            run_dir,
            bwrap=self.host.bwrap,
            python=self.host.runtime.sandbox_python,
        )
        try:
            sandbox.start([*extras.launcher], run.box, egress=socket is not None)
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    def _secrets_env(
        self, session: Session
    ) -> tuple[tuple[Bind, ...], tuple[tuple[str, str], ...]]:
        """What a session that holds secrets gets: each as `NAME=placeholder`; and, with
        secrets or method and path rules, trust in corral's CA (the proxy reads HTTPS to
        those hosts) through the files and variables common tools read. A session with
        neither gets nothing of it."""
        held = session.options.get(SECRETS_OPTION, {})
        if self.egress is None or not (held or self.egress.reads_https(session.id)):
            return (), ()
        bundle, ca = self.egress.trust_files()
        binds = (Bind(bundle, SANDBOX_CA_BUNDLE), Bind(ca, SANDBOX_CA_CERT))
        env = [(name, SANDBOX_CA_BUNDLE) for name in CA_BUNDLE_VARIABLES]
        env += [("NODE_EXTRA_CA_CERTS", SANDBOX_CA_CERT), *sorted(held.items())]
        return binds, tuple(env)

    def _prepare_env(self, session: Session, font_list: Path | None) -> list[str]:
        """The session's package prefix, created when there is none, and what the sandbox
        broke in it put back (see `repair_session_env`): the paths put back.

        Runs in a worker thread (a new prefix is about 2 ms of file writes that the event
        loop, answering other calls meanwhile, should not wait for), one at a time: two
        starts of one session must not write one prefix together."""
        with self._env_lock:
            create_session_env(session.paths.env, self.host.runtime, font_list=font_list)
            try:
                return repair_session_env(session.paths.env, self.host.runtime)
            except (OSError, UnsafePath) as exc:
                raise KernelStartFailed(
                    f"session {session.id}'s package prefix could not be repaired: {exc}"
                ) from exc

    async def drop_kernel(self, session: Session, language: str) -> None:
        """Stop one kernel; the run closes with the last one (unless one is starting)."""
        kernel = session.kernels.pop(language, None)
        if kernel is not None:
            await kernel.stop()
        if not session.kernels and not session.starting:
            await self.close_run(session)

    async def stop_kernels(self, session: Session) -> None:
        """Stop all the session's kernels and close its run.

        The sandbox ends first, taking every process in it at once: otherwise each kernel
        is stopped and its tree walked and killed one by one, and the limit box then waits
        for the last process to be gone before it can be removed (together 30 of a
        delete's 50 ms). Not while a kernel is starting: its start owns the run."""
        run = session.run
        sandbox = run.sandbox if run is not None else None
        if session.kernels and not session.starting and sandbox is not None:
            await sandbox.stop()
        for language in list(session.kernels):
            await self.drop_kernel(session, language)

    def hand_over(self, source: Session, target: Session) -> None:
        """Move `source`'s run and kernels to `target` (a warm pool slot to its session)."""
        target.run, source.run = source.run, None
        if target.run is not None:
            self._runs.pop(source.id, None)
            self._runs[target.id] = target.run
        target.kernels.update(source.kernels)
        source.kernels.clear()

    # -- a session's run ------------------------------------------------------------------

    async def open_run(self, session: Session) -> SessionRun:
        """The session's run, opened with its first kernel: limit box, bridge, mounts."""
        if session.run is not None:
            return session.run
        loop = asyncio.get_running_loop()
        box = self.host.make_box(session.id, session.limits)
        run = SessionRun(box, asyncio.create_task(box.watch(), name="corral-limit-watchdog"))
        try:
            await asyncio.to_thread(box.create)
            if session.options.get("bridge"):
                hook = functools.partial(self._bridge_used, session.id)
                run.bridge, run.bridge_dir = await open_bridge(self.settings.run_root, hook)
            run.mounts = await asyncio.to_thread(self._prepare_mounts, session, loop)
            run.start_syncing()
        except BaseException:
            await run.close()
            raise
        session.run = self._runs[session.id] = run
        return run

    async def close_run(self, session: Session) -> None:
        """Close the session's run (the overlays' last pass included)."""
        run, session.run = session.run, None
        if run is None:
            return
        if self._runs.get(session.id) is run:
            del self._runs[session.id]
        await run.close()
        await asyncio.to_thread(shutil.rmtree, self._layers_dir(session.id), True)

    def _prepare_mounts(
        self, session: Session, loop: asyncio.AbstractEventLoop
    ) -> list[PreparedMount]:
        names = session.options.get("mounts", [])
        missing = [name for name in names if name not in self.mounts]
        if missing:
            raise InvalidInput(
                f"session {session.id!r} uses mount {missing[0]!r}, which the operator "
                "no longer configures"
            )
        return prepare_mounts(
            [self.mounts[name] for name in names],
            session.paths.workspace,
            self._layers_dir(session.id),
            self.protected_extra,
            functools.partial(self._rw_holder, session.id),
            functools.partial(self._dropped_soon, loop, session),
        )

    def _rw_holder(self, session_id: str, path: Path) -> str | None:
        """Another running session holding a folder overlapping `path` read-write."""
        for other, run in self._runs.items():
            if other == session_id:
                continue
            for mount in run.mounts:
                if mount.spec.writable and overlapping(mount.spec.path, path):
                    return other
        return None

    def _layers_dir(self, session_id: str) -> Path:
        return self.settings.sessions_dir / session_id / "overlay"

    def _dropped_soon(
        self, loop: asyncio.AbstractEventLoop, session: Session, mount: str, paths: list[str]
    ) -> None:
        """From the sync's thread: `_dropped` on the event loop."""
        loop.call_soon_threadsafe(self._dropped, session, mount, paths)

    def _dropped(self, session: Session, mount: str, paths: list[str]) -> None:
        """Paths the sandbox wrote that the host would run or trust, kept from the host:
        logged, audited and told to the session in its next result."""
        shown = [escape_name(path) for path in paths]
        log.warning("session %s: not applied to mount %s: %s", session.id, mount, ", ".join(shown))
        self._emit("protected", session.id, "kept", {"mount": mount, "names": shown})
        session.notes.append(kept_note(mount, shown))

    def _bridge_used(self, session_id: str, service: str, outcome: str) -> None:
        self._emit("bridge", session_id, outcome, {"service": service})

    def _emit(self, kind: str, session_id: str, action: str, detail: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, session_id, action, detail)
