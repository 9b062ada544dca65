"""Browser fetches: Chromium, driven by Playwright, inside a sandbox of its own per fetch.

Each fetch gets a fresh sandbox (the default profile with a throw-away workspace, its own
limit box) whose only way out is the egress proxy under an identity that carries the
browsing policy (default `public`: global addresses only). The in-sandbox `runner.py` loads
the page and prints JSON; the host validates the URL before anything starts, bounds the time
and the number of fetches at once, kills the sandbox on timeout, and turns the proxy's
refusals into a clear error.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import math
import os
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.config import Settings
from corral.egress.network import BROWSER_PREFIX, Network
from corral.egress.protocol import Target
from corral.egress.rules import Decision
from corral.errors import (
    FetchFailed,
    FetchRefused,
    FetchTimedOut,
    InvalidInput,
    SandboxUnavailable,
)
from corral.sandbox.boxes import LimitBox
from corral.sandbox.host import SandboxHost
from corral.sandbox.limits import Limits
from corral.sandbox.policy import Bind, SandboxPolicy
from corral.sandbox.process import kill_group
from corral.sandbox.profile import SessionPaths
from corral.sandbox.runtime import create_session_env

RUNNER = Path(__file__).resolve().with_name("runner.py")
SANDBOX_RUNNER = "/opt/corral/bin/browser_runner.py"
CHROMIUM_CANDIDATES = (
    "/usr/lib/chromium/chromium",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
)
MAX_URL_CHARS = 8192
MAX_LINKS = 500
START_MARGIN_S = 30.0  # for the sandbox, Playwright's driver and Chromium to start
TASKS = 2048  # Chromium runs many processes and threads
TMP_BYTES = 512 * 1024 * 1024
# Chromium's own update and safe-browsing services, which it contacts whatever the page: still
# refused and audited, but not reported as something the page wanted.
BROWSER_SERVICE_HOSTS = frozenset(
    {"update.googleapis.com", "clients2.google.com", "clients1.google.com", "redirector.gvt1.com"}
)
HOME_BYTES = 256 * 1024 * 1024


@dataclass
class PageResult:
    """What one fetch found. `refused` lists connections the browsing policy refused."""

    requested_url: str
    url: str
    title: str
    status: int | None
    text: str
    text_chars: int
    truncated: bool
    loaded: bool
    links: list[dict[str, str]]
    refused: list[str] = field(default_factory=list)
    screenshot_png: bytes | None = None
    elapsed_s: float = 0.0

    def notes(self) -> list[str]:
        """Sentences about what is missing from the result, for the agent."""
        notes = []
        if self.truncated:
            notes.append(
                f"text cut at {len(self.text):,} characters of {self.text_chars:,}; "
                "the rest of the page is not included"
            )
        if not self.loaded:
            notes.append("the page did not finish loading in time; this is what it showed then")
        if self.refused:
            notes.append("the browsing policy refused: " + ", ".join(self.refused[:20]))
        return notes


def validate_url(url: object) -> str:
    """`url` if it is an http(s) URL with a host; raises `InvalidInput` before anything starts."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput("give a URL to fetch, such as https://example.org/")
    url = url.strip()
    if len(url) > MAX_URL_CHARS or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise InvalidInput("the URL is too long or contains spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise InvalidInput(f"the URL {url!r} is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f"{scheme}:" if scheme else "a URL without a scheme"
        raise InvalidInput(f"only http and https URLs can be fetched, not {shown}")
    if not parts.hostname:
        raise InvalidInput(f"the URL {url!r} has no host")
    return url


def find_chromium(configured: str | None) -> str | None:
    """The Chromium binary to run: the configured one (only it), else the system's, else None."""
    candidates = (configured,) if configured else (*CHROMIUM_CANDIDATES, shutil.which("chromium"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Browser:
    """Runs browser fetches for one server, at most `browser_max_concurrent` at once."""

    def __init__(self, settings: Settings, host: SandboxHost, network: Network) -> None:
        self.settings = settings
        self.host = host
        self.network = network
        self.root = settings.state_dir / "browser"
        self.gate = asyncio.Semaphore(settings.browser_max_concurrent)
        self.refusals: dict[str, list[str]] = {}
        self._numbers = itertools.count(1)

    @property
    def chromium(self) -> str | None:
        return find_chromium(self.settings.browser_chromium)

    def note_decision(self, identity: str, target: Target, decision: Decision) -> None:
        """Called for every proxy decision; keeps the refusals of running fetches, once each."""
        refused = self.refusals.get(identity)
        text = f"{target.host}:{target.port} ({decision.rule})"
        if decision.allowed or refused is None or target.host in BROWSER_SERVICE_HOSTS:
            return
        if text not in refused:
            refused.append(text)

    async def fetch(
        self, url: str, *, screenshot: bool = False, timeout_s: float | None = None
    ) -> PageResult:
        """Load `url` in a fresh sandboxed Chromium. Raises `InvalidInput` (bad URL or
        timeout), `SandboxUnavailable` (no Chromium), `FetchFailed`, `FetchTimedOut`."""
        url = validate_url(url)
        timeout_s = self._timeout(timeout_s)
        chromium = self.chromium
        if chromium is None:
            raise SandboxUnavailable(
                "no Chromium found: install Debian's chromium package (apt install chromium) "
                "or set CORRAL_BROWSER_CHROMIUM to a Chromium binary"
            )
        request = {
            "url": url,
            "timeout_s": timeout_s,
            "launch_timeout_s": START_MARGIN_S,  # starting is not the page's time
            "chromium": chromium,
            "max_chars": self.settings.browser_max_chars,
            "max_links": MAX_LINKS,
            "screenshot": screenshot,
        }
        async with self.gate:
            identity = f"{BROWSER_PREFIX}{next(self._numbers)}"
            self.refusals[identity] = []
            try:
                answer = await self._run(identity, request, timeout_s + START_MARGIN_S)
                return self._result(url, answer, self.refusals[identity])
            finally:
                self.refusals.pop(identity, None)

    def _timeout(self, timeout_s: float | None) -> float:
        limit = self.settings.browser_timeout_s
        if timeout_s is None:
            return limit
        if not 0 < timeout_s < math.inf:
            raise InvalidInput("the page timeout must be a positive number of seconds")
        return min(timeout_s, limit)

    async def _run(self, identity: str, request: dict[str, Any], deadline_s: float) -> Any:
        runner = [self.host.runtime.sandbox_python, SANDBOX_RUNNER, json.dumps(request)]
        stdout, stderr = await self.run_in_sandbox(identity, runner, deadline_s)
        try:
            return json.loads(stdout)
        except ValueError as exc:
            why = stderr.decode("utf-8", "replace").strip()[-500:] or "no output"
            raise FetchFailed(f"the browser sandbox failed: {why}") from exc

    async def run_in_sandbox(
        self, identity: str, command: list[str], deadline_s: float
    ) -> tuple[bytes, bytes]:
        """Run `command` (behind the egress forwarder) in a fresh browser sandbox under
        `identity`; its stdout and stderr. Raises `FetchTimedOut` past `deadline_s`."""
        workdir = self.root / identity.removeprefix("@")
        box = self.host.make_box(identity.removeprefix("@"), self._limits())
        try:
            socket = await self.network.socket_for(identity)
            policy = await asyncio.to_thread(self._policy, workdir, socket)
            await asyncio.to_thread(box.create)
            return await self._spawn(policy, self.host.egress_command(command), box, deadline_s)
        finally:
            await asyncio.to_thread(box.remove)
            await self.network.proxy.close(identity)
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _policy(self, workdir: Path, socket: Path) -> SandboxPolicy:
        """A fresh workspace and package prefix per fetch: nothing one page's sandbox writes
        is seen by the next."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)  # left by a server that died mid-fetch
        (workdir / "workspace").mkdir(mode=0o700, parents=True)
        env = workdir / "env"
        create_session_env(env, self.host.runtime)
        return self.host.policy(
            SessionPaths(workspace=workdir / "workspace", env=env),
            tmp_size_bytes=TMP_BYTES,
            home_size_bytes=HOME_BYTES,
            egress_socket=socket,
            extra_binds=(Bind(RUNNER, SANDBOX_RUNNER),),
        )

    def _limits(self) -> Limits:
        defaults = self.settings.limits
        return Limits(
            memory_bytes=self.settings.browser_memory_bytes,
            cpus=defaults.cpus,
            tasks=TASKS,
            workspace_bytes=defaults.workspace_bytes,
            tmp_bytes=TMP_BYTES,
            exec_timeout_s=self.settings.browser_timeout_s,
            idle_timeout_s=defaults.idle_timeout_s,
            output_bytes=defaults.output_bytes,
        )

    async def _spawn(
        self, policy: SandboxPolicy, command: list[str], box: LimitBox, deadline_s: float
    ) -> tuple[bytes, bytes]:
        process = self.host.start(
            policy, command, box=box, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # Popen's pipes are read in a thread; the deadline and cancellation stay here.
        reader = asyncio.ensure_future(asyncio.to_thread(process.communicate))
        try:
            return await asyncio.wait_for(asyncio.shield(reader), deadline_s)
        except TimeoutError as exc:
            raise FetchTimedOut(
                f"the browser did not finish within {deadline_s:g} s and was stopped"
            ) from exc
        finally:
            if not reader.done():
                kill_group(process.pid)
                await reader

    def _result(self, url: str, answer: dict[str, Any], refused: list[str]) -> PageResult:
        if "error" in answer:
            raise _failure(url, str(answer["error"]), refused)
        refused = list(refused)
        result = PageResult(
            requested_url=url,
            url=str(answer["url"]),
            title=str(answer["title"]),
            status=answer["status"],
            text=str(answer["text"]),
            text_chars=int(answer["text_chars"]),
            truncated=int(answer["text_chars"]) > len(answer["text"]),
            loaded=bool(answer["loaded"]),
            links=list(answer["links"]),
            refused=refused,
            screenshot_png=_png(answer.get("screenshot_png")),
            elapsed_s=float(answer.get("elapsed_s", 0.0)),
        )
        final = _host_port(result.url)
        if result.status == 403 and any(r.startswith(f"{final} ") for r in refused):
            raise _failure(result.url, "refused by the browsing policy", refused)
        return result


def _host_port(url: str) -> str:
    """'host:port' of `url` as the proxy names a target (default ports filled in)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return f"{parts.hostname or ''}:{port}"


def _failure(url: str, error: str, refused: list[str]) -> FetchFailed:
    """The error for a fetch that reached no page: `FetchRefused` when the browsing policy
    refused the page's own host, saying how to change it; else `FetchFailed`."""
    target = _host_port(url)
    own = [r for r in refused if r.startswith(f"{target} ")]
    if own:
        return FetchRefused(
            f"could not load {url}: the browsing policy refused {own[0]}; the operator can "
            "change it with CORRAL_BROWSER_NET / CORRAL_BROWSER_ALLOW"
        )
    if refused:
        return FetchFailed(
            f"could not load {url}: {error} (the browsing policy refused {', '.join(refused[:5])})"
        )
    return FetchFailed(f"could not load {url}: {error}")


def _png(encoded: object) -> bytes | None:
    return base64.b64decode(encoded) if isinstance(encoded, str) else None
