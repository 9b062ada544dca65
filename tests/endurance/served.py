"""`corral serve` as a real process, for tests that stop, break and restart the server.

`Served` owns one server's directories (state, config, run root), its port and its
environment; it starts the process, waits for `GET /health`, hands out the tokens the server
wrote, sends SIGTERM and starts it again on the same state. `served()` gives one and, on exit,
kills whatever is left of it (the server and every process naming its directories).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests.server.conftest import free_port

START_TIMEOUT_S = 60.0


@dataclass
class Served:
    """One `corral serve` process and the directories it keeps between restarts."""

    state_dir: Path
    config_dir: Path
    run_root: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    settings: Mapping[str, str] = field(default_factory=dict)  # extra CORRAL_* variables
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The host environment without any CORRAL_* variable, then this server's own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(
            CORRAL_STATE_DIR=str(self.state_dir),
            CORRAL_CONFIG_DIR=str(self.config_dir),
            CORRAL_RUN_ROOT=str(self.run_root),
            **self.settings,
        )
        return env

    def start(
        self, timeout_s: float = START_TIMEOUT_S, preexec: Callable[[], None] | None = None
    ) -> None:
        """Start the server (same state, same port) and wait until /health answers 200;
        `preexec` runs in the child before it execs (to lower a limit, say)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the server is already running")
        self.starts += 1
        with self.log_path.open("a") as log:
            log.write(f"\n--- start {self.starts} ---\n")
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "corral", "serve", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=preexec,
            )
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                break
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"corral serve did not become healthy; its log:\n{self.log()}")

    def token(self, role: str = "agent") -> str:
        """The token the server wrote for `role` ("agent" or "admin")."""
        return (self.config_dir / f"{role}.token").read_text().strip()

    def client(self, role: str = "agent", timeout_s: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(role)}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def corral(
        self, *args: str, timeout_s: float = 120.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`corral ARGS...` run as the operator runs it beside this server (its folders, or
        `env` instead)."""
        return subprocess.run(
            [sys.executable, "-m", "corral", *args],
            env={**(self.env if env is None else env), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def terminate(self, timeout_s: float = 60.0) -> float:
        """SIGTERM the server and wait for it to exit; returns the seconds it took.

        Raises AssertionError (after killing it) when it does not exit in `timeout_s`.
        """
        process = self._running()
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.wait(10)
            raise AssertionError(
                f"the server did not exit within {timeout_s} s of SIGTERM"
            ) from exc
        return time.monotonic() - started

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """SIGTERM, wait, start again on the same state; returns the seconds the exit took."""
        took = self.terminate()
        self.start(timeout_s)
        return took

    def sandboxes(self) -> list[psutil.Process]:
        """Live processes anywhere on the host whose command line names this server's run
        root or state directory (bwrap, gates, kernels), the server itself excluded."""
        marks = (str(self.run_root), str(self.state_dir))
        own = self.process.pid if self.process is not None else None
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                line = " ".join(proc.info["cmdline"] or ())
                if proc.pid != own and any(mark in line for mark in marks) and alive(proc):
                    found.append(proc)
        return found

    def descendants(self) -> list[psutil.Process]:
        """The server's live descendants (empty when it is not running)."""
        if self.process is None or self.process.poll() is not None:
            return []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.process.pid).children(recursive=True)
            return [child for child in children if alive(child)]
        return []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill_everything(self) -> None:
        """Kill the server and every process naming its directories (clean-up only)."""
        leftovers = self.descendants() + self.sandboxes()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    @property
    def pid(self) -> int:
        """The server process's pid; raises `RuntimeError` when it is not running."""
        return self._running().pid

    def _running(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("the server is not running")
        return self.process


@contextlib.contextmanager
def served(
    root: Path, *, state_dir: Path | None = None, start: bool = True, **settings: str
) -> Iterator[Served]:
    """A `corral serve` under `root` (state, config, log) with a fresh short run root.

    `settings` become CORRAL_<NAME> variables; `state_dir` puts the state elsewhere (a small
    filesystem, say). On exit everything it started is killed and the run root removed.
    """
    run_root = Path(tempfile.mkdtemp(prefix="cre", dir="/tmp"))
    server = Served(
        state_dir=state_dir or root / "state",
        config_dir=root / "config",
        run_root=run_root,
        log_path=root / "serve.log",
        settings={f"CORRAL_{name.upper()}": value for name, value in settings.items()},
    )
    try:
        if start:
            server.start()
        yield server
    finally:
        server.kill_everything()
        shutil.rmtree(run_root, ignore_errors=True)


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie is dead, only not yet reaped)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
