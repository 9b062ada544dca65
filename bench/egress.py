"""Egress: a download and many small connections through corral's proxy, beside direct ones.

Every byte stays on loopback. An origin server (`egress_peer.py origin`, its own process)
listens on 127.0.0.2 and generates what it sends. Clients are separate processes, as a
sandbox's are, while the proxies run in this process's event loop, as in `corral serve`:

- "proxy": a bare `EgressProxy` whose policy allowlists 127.0.0.2:PORT explicitly; a host
  process (`egress_peer.py client`) talks to its unix socket;
- "served": the same host process through the proxy socket of a `Service` session (policy
  from the network store, one audit record per decision), for new connections only;
- "sandbox": a sandboxed kernel of that session, its python sockets through the in-sandbox
  forwarder at 127.0.0.1:3128, with `set_network(session, "allowlist", ["127.0.0.2:PORT"])`.

"direct" is the host process connecting to the origin itself. The host process rotates its
routes sample by sample; host and sandbox blocks take turns going first.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench.measure import Paired, Plan, log, split
from bench.sandboxed import bench_settings
from corral.egress.protocol import Target
from corral.egress.proxy import EgressProxy
from corral.egress.rules import Decision, make_policy
from corral.service import Service

PEER = Path(__file__).resolve().parent / "egress_peer.py"
ORIGIN_HOST = "127.0.0.2"
FORWARDER = "tcp:127.0.0.1:3128"
SMALL_BYTES = 2
MIB = 1024 * 1024
START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 10.0
SESSION_ID = "bench-egress"
BARE_SESSION = "bench"


@asynccontextmanager
async def origin_server() -> AsyncIterator[int]:
    """The origin process on 127.0.0.2; yields its port, ends it on exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEER),
        "origin",
        ORIGIN_HOST,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        if not line.strip().isdigit():
            raise RuntimeError(f"the egress origin server did not start: {line!r}")
        yield int(line)
    finally:
        await _stop(process)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()


def _ignore_decision(session_id: str, target: Target, decision: Decision) -> None:
    """The bare proxy's decision hook: nothing recorded (a refusal fails the client)."""


@asynccontextmanager
async def bare_proxy(directory: Path, port: int) -> AsyncIterator[str]:
    """An `EgressProxy` allowing only 127.0.0.2:`port`; yields its `unix:` route."""
    policy = make_policy("allowlist", [f"{ORIGIN_HOST}:{port}"])
    proxy = EgressProxy(lambda _session: policy, on_decision=_ignore_decision)
    path = directory / "bare.sock"
    try:
        await proxy.open(BARE_SESSION, path)
        yield f"unix:{path}"
    finally:
        await proxy.close_all()


@asynccontextmanager
async def served_session(workdir: Path, run_root: Path, port: int) -> AsyncIterator[Service]:
    """A `Service` with one started session allowed 127.0.0.2:`port`; all removed on exit."""
    settings = bench_settings(workdir, run_root)
    try:
        async with Service(settings) as service:
            await service.create_session(SESSION_ID)
            await service.network.set(SESSION_ID, "allowlist", [f"{ORIGIN_HOST}:{port}"])
            yield service
    finally:
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def client_spec(
    port: int, routes: dict[str, str | None], size: int, runs: int, warmup: int, offset: int
) -> dict[str, Any]:
    """What `egress_peer.client_samples` takes."""
    return {
        "host": ORIGIN_HOST,
        "port": port,
        "routes": routes,
        "size": size,
        "runs": runs,
        "warmup": warmup,
        "offset": offset,
    }


async def host_samples(spec: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds per route from a new host client process; `RuntimeError` if it fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEER),
        "client",
        json.dumps(spec),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLIENT_TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the egress client failed: {err.decode(errors='replace')[-2000:]}")
    samples: dict[str, list[float]] = json.loads(out)
    return samples


def kernel_code(spec: dict[str, Any]) -> str:
    """Python for the kernel: the peer's source in a namespace of its own, then the samples."""
    source = PEER.read_text()
    return (
        "import json as _json\n"
        "_peer = {'__name__': 'egress_peer'}\n"
        f"exec(compile({source!r}, 'egress_peer.py', 'exec'), _peer)\n"
        f"print(_json.dumps(_peer['client_samples']({spec!r})))\n"
    )


async def sandbox_samples(service: Service, spec: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds per route, measured by the session's kernel; `RuntimeError` if it fails."""
    result = await service.executions.run(kernel_code(spec), session_id=SESSION_ID)
    if not result.ok or result.kernel_restarted:
        raise RuntimeError(f"the sandbox's egress client ended {result.status}: {result.text()}")
    samples: dict[str, list[float]] = json.loads(result.stdout)
    return samples


async def measure_egress(workdir: Path, plan: Plan) -> dict[str, Paired]:
    """Egress samples keyed "download_proxy" and "download_sandbox" (MiB/s) and
    "connect_proxy", "connect_served" and "connect_sandbox" (ms), each beside "direct".
    """
    size = plan.egress_mib * MIB
    log(
        f"egress: {plan.egress_download_warmup} warm-up + {plan.egress_downloads} downloads of "
        f"{plan.egress_mib} MiB and {plan.egress_connections} new connections per route"
    )
    run_root = Path(tempfile.mkdtemp(prefix="cre", dir="/tmp"))
    try:
        async with (
            origin_server() as port,
            bare_proxy(run_root, port) as proxy,
            served_session(workdir, run_root, port) as service,
        ):
            served = f"unix:{await service.egress.socket_for(SESSION_ID)}"
            sandbox_routes: dict[str, str | None] = {"sandbox": FORWARDER}
            download: dict[str, list[float]] = {"direct": [], "proxy": [], "sandbox": []}
            for index in range(plan.egress_download_warmup + plan.egress_downloads):
                host = client_spec(port, {"direct": None, "proxy": proxy}, size, 1, 0, index)
                inside = client_spec(port, sandbox_routes, size, 1, 0, 0)
                taken = await _both(service, host, inside, host_first=index % 2 == 0)
                if index >= plan.egress_download_warmup:
                    for route, seconds in taken.items():
                        download[route] += [plan.egress_mib / value for value in seconds]
            connect: dict[str, list[float]] = {
                "direct": [],
                "proxy": [],
                "served": [],
                "sandbox": [],
            }
            host_routes = {"direct": None, "proxy": proxy, "served": served}
            blocks = split(plan.egress_connections, plan.egress_blocks)
            for index, runs in enumerate(blocks):
                warmup = plan.egress_connect_warmup
                host = client_spec(port, host_routes, SMALL_BYTES, runs, warmup, index)
                inside = client_spec(port, sandbox_routes, SMALL_BYTES, runs, warmup, 0)
                taken = await _both(service, host, inside, host_first=index % 2 == 0)
                for route, seconds in taken.items():
                    connect[route] += [value * 1000 for value in seconds]
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
    return {
        "download_proxy": Paired(download["proxy"], download["direct"]),
        "download_sandbox": Paired(download["sandbox"], download["direct"]),
        **{
            f"connect_{route}": Paired(connect[route], connect["direct"])
            for route in ("proxy", "served", "sandbox")
        },
    }


async def _both(
    service: Service, host: dict[str, Any], inside: dict[str, Any], *, host_first: bool
) -> dict[str, list[float]]:
    """One block of the host client's routes and the sandbox's, in the order asked."""
    if host_first:
        return {**await host_samples(host), **await sandbox_samples(service, inside)}
    inside_samples = await sandbox_samples(service, inside)
    return {**await host_samples(host), **inside_samples}
