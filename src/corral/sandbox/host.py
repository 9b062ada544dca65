"""The host a server's sandboxes are built on: runtime, bwrap, limit mechanism, identity files.

One `SandboxHost` per server holds what every sandbox of this machine is made from, whatever
runs in it: a session's kernels (`corral.kernels.factory`), a browser fetch
(`corral.browser.fetch`) or the matplotlib font list build. It builds their policies and
limit boxes and starts them; it knows nothing of sessions.

Its life: `prepare()` once before the first sandbox (sweeps what a dead server of this state
left, writes the identity files, finds a kept font list), `close()` once after the last.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import subprocess
from collections.abc import Sequence
from pathlib import Path

from corral.config import Settings
from corral.sandbox import scripts
from corral.sandbox.boxes import LimitBox, make_box, sweep_stale_v1
from corral.sandbox.bwrap import find_bwrap
from corral.sandbox.fontcache import FontCache
from corral.sandbox.launch import Output, start_sandbox
from corral.sandbox.leftovers import Janitor, sweep_leftovers
from corral.sandbox.limits import Limits, choose_mechanism
from corral.sandbox.policy import Mount, SandboxPolicy
from corral.sandbox.profile import (
    SessionPaths,
    default_policy,
    egress_launcher,
    write_identity_files,
)
from corral.sandbox.runtime import PythonRuntime, current_runtime

_HOSTS = itertools.count()
FONT_BUILD_TMP_BYTES = 64 << 20  # the /tmp of the sandbox that builds matplotlib's font list


class SandboxHost:
    """What this machine's sandboxes are made from; raises `SandboxUnavailable` at
    construction when bwrap or the configured limit mechanism is missing."""

    def __init__(self, settings: Settings, *, runtime: PythonRuntime | None = None) -> None:
        self.settings = settings
        self.runtime = runtime or current_runtime(settings.kernel_runtime)
        self.bwrap = find_bwrap(settings.bwrap)
        self.mechanism = choose_mechanism(settings.limit_mechanism)
        self.identity_dir = settings.state_dir / "sandbox-etc"
        self._number = next(_HOSTS)  # of this process's hosts, from 0
        self.janitor: Janitor | None = None  # sweeps after this server if it dies
        self.fonts = FontCache(
            settings.state_dir / "mpl-fonts",
            self.runtime,
            policy_for=functools.partial(self.policy, tmp_size_bytes=FONT_BUILD_TMP_BYTES),
            bwrap=self.bwrap,
            build_on_first_seed=settings.font_list_build,
        )

    async def prepare(self) -> None:
        """Once per server, before the first sandbox: sandboxes and cgroups a dead server
        of this state left, identity files, a kept matplotlib font list."""
        await asyncio.to_thread(sweep_leftovers, self.settings.state_dir, self.settings.run_root)
        self.janitor = Janitor(self.settings.state_dir, self.settings.run_root)
        if self.mechanism.name == "cgroup1" and self.mechanism.path is not None:
            await asyncio.to_thread(sweep_stale_v1, self.mechanism.path)
        write_identity_files(self.identity_dir)
        await asyncio.to_thread(scripts.compile_all)
        await self.fonts.find_kept()

    def close(self) -> None:
        """Once per server, after the last sandbox stopped: the janitor leaves."""
        if self.janitor is not None:
            self.janitor.close()
            self.janitor = None

    def make_box(self, name: str, limits: Limits) -> LimitBox:
        """A limit box (not yet created) of this host's mechanism. The first host of a
        process names a box after its sandbox; a later one (tests run several servers in
        one process) adds its number, so that two servers' "default" never share a cgroup."""
        tag = f"~{self._number}" if self._number else ""
        return make_box(self.mechanism, name + tag, limits)

    def policy(
        self,
        paths: SessionPaths,
        *,
        tmp_size_bytes: int,
        home_size_bytes: int | None = None,
        egress_socket: Path | None = None,
        forward_env: Sequence[tuple[str, str]] = (),
        extra_binds: Sequence[Mount] = (),
    ) -> SandboxPolicy:
        """The default profile over `paths`, with this host's runtime and identity files."""
        return default_policy(
            self.runtime,
            paths,
            self.identity_dir,
            tmp_size_bytes=tmp_size_bytes,
            home_size_bytes=home_size_bytes or self.settings.home_size_bytes,
            egress_socket=egress_socket,
            forward_env=tuple(forward_env),
            extra_binds=tuple(extra_binds),
        )

    def egress_command(self, command: Sequence[str]) -> list[str]:
        """`command` behind the egress forwarder (so the sandbox reaches its proxy)."""
        return [*egress_launcher(self.runtime), *command]

    def start(
        self,
        policy: SandboxPolicy,
        command: Sequence[str],
        *,
        box: LimitBox | None = None,
        stdout: Output = subprocess.DEVNULL,
        stderr: Output = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        """Start `command` in a sandbox with this host's bwrap (`corral.sandbox.launch`)."""
        return start_sandbox(
            policy, command, bwrap=self.bwrap, box=box, stdout=stdout, stderr=stderr
        )
