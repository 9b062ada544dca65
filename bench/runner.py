"""One benchmark run: set up both sides, take every measurement, clean up, build metrics."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.baseline import BaselineRoots, home_parent
from bench.egress import measure_egress
from bench.measure import (
    Paired,
    Plan,
    measure_cold_start,
    measure_memory,
    measure_round_trip,
    measure_served_round_trip,
)
from bench.report import Metric
from bench.sandboxed import corral_manager
from bench.stats import Summary


async def collect(plan: Plan) -> dict[str, Paired]:
    """All samples of one run, keyed by measurement.

    The keys are "cold_start", "round_trip", "round_trip_rest", "round_trip_mcp", "pss",
    "uss", "rss", and "egress_" + each key of `measure_egress`.

    Temporary state, run and baseline directories are removed, the bench's server is shut
    down and every kernel is stopped before this returns or raises.
    """
    workdir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    roots = BaselineRoots(
        sockets=Path(tempfile.mkdtemp(prefix="crbb", dir="/tmp")),
        homes=Path(tempfile.mkdtemp(prefix="crbh", dir=home_parent())),
    )
    try:
        async with corral_manager(workdir) as manager:
            samples = {
                "cold_start": await measure_cold_start(manager, roots, plan),
                "round_trip": await measure_round_trip(manager, roots, plan),
            }
            served = await measure_served_round_trip(manager, workdir / "served", plan)
            samples.update({f"round_trip_{key}": paired for key, paired in served.items()})
            samples.update(await measure_memory(manager, roots, plan))
        egress = await measure_egress(workdir / "egress", plan)
        samples.update({f"egress_{key}": paired for key, paired in egress.items()})
        return samples
    finally:
        shutil.rmtree(roots.sockets, ignore_errors=True)
        shutil.rmtree(roots.homes, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def build_metrics(samples: dict[str, Paired], plan: Plan) -> list[Metric]:
    """The reported metrics from the samples `collect(plan)` took."""

    def both(key: str) -> tuple[Summary, Summary]:
        return Summary.of(samples[key].corral), Summary.of(samples[key].baseline)

    memory_shown = ((50, "median"),)
    return [
        Metric(
            "cold_start",
            "Cold session start",
            "ms",
            "From asking for a new session to a kernel that answers kernel_info. corral: "
            "SessionManager.create(); baseline: start_kernel() + wait_for_ready().",
            *both("cold_start"),
            shown=((50, "p50"), (95, "p95")),
            digits=1,
        ),
        Metric(
            "round_trip_1plus1",
            "`1+1` round trip",
            "ms",
            "One execution of 1+1 until iopub is idle and the shell reply is in. corral: "
            "SessionManager.execute(); baseline: client.execute() and reading the replies.",
            *both("round_trip"),
            shown=((50, "p50"), (99, "p99")),
            digits=2,
        ),
        Metric(
            "round_trip_rest",
            "`1+1` round trip via REST",
            "ms",
            'POST /v1/sessions/{id}/execute with {"code": "1+1"} on one keep-alive '
            "httpx client, to a real server (uvicorn in a thread on 127.0.0.1), until the "
            "JSON result is read. corral: through the server; baseline: in-process "
            "SessionManager.execute(), sampled in rotation with REST and MCP.",
            *both("round_trip_rest"),
            shown=((50, "p50"), (99, "p99")),
            digits=2,
            table="served",
        ),
        Metric(
            "round_trip_mcp",
            "`1+1` round trip via MCP",
            "ms",
            "The execute_python_code tool with command 1+1, called by the MCP SDK's Client "
            "over streamable HTTP (one httpx2 client) on the same server and session as REST. "
            "corral: through the server; baseline: in-process SessionManager.execute(), "
            "sampled in rotation with REST and MCP.",
            *both("round_trip_mcp"),
            shown=((50, "p50"), (99, "p99")),
            digits=2,
            table="served",
        ),
        Metric(
            "idle_pss_per_session",
            "Idle PSS per session",
            "MiB",
            "Proportional set size summed over the kernel's whole process tree (corral: the "
            "outer bwrap and its descendants), one idle kernel at a time.",
            *both("pss"),
            shown=memory_shown,
            digits=1,
        ),
        Metric(
            "idle_uss_per_session",
            "Idle USS per session",
            "MiB",
            "Unique set size summed over the same process tree.",
            *both("uss"),
            shown=memory_shown,
            digits=1,
            in_table=False,
        ),
        Metric(
            "idle_rss_per_session",
            "Idle RSS per session",
            "MiB",
            "Resident set size summed over the same process tree (shared pages counted in "
            "full by every process).",
            *both("rss"),
            shown=memory_shown,
            digits=1,
            in_table=False,
        ),
        *_egress_metrics(both, plan),
    ]


def _egress_metrics(both: Callable[[str], tuple[Summary, Summary]], plan: Plan) -> list[Metric]:
    """The egress table: each route through a proxy beside direct connections on the host."""
    download = (
        "One new connection downloading {mib} MiB (generated by an origin process on "
        "127.0.0.2, one sample = connect to last byte, as MiB/s). {route}; direct: the same "
        "download by a host process connecting to the origin itself."
    )
    connect = (
        "One new connection doing a tiny GET (2-byte body) and closing, connect to last byte. "
        "{route}; direct: a host process connecting to the origin itself, in the same run."
    )
    routes = {
        "proxy": "Through the proxy: a host process, CONNECT on a bare EgressProxy's unix "
        "socket (policy allowlisting 127.0.0.2:PORT, no audit)",
        "served": "Through the server's proxy: the same host process on a Service "
        "session's proxy socket (stored policy, one audit record per decision)",
        "sandbox": "From the sandbox: python sockets in the session's kernel, CONNECT via "
        "the forwarder at 127.0.0.1:3128 to the Service's proxy",
    }
    titles = {
        "proxy": "host → proxy",
        "served": "host → server's proxy",
        "sandbox": "sandbox → forwarder → proxy",
    }
    metrics = [
        Metric(
            f"egress_download_{route}",
            f"Download, {titles[route]}",
            "MiB/s",
            download.format(mib=plan.egress_mib, route=routes[route]),
            *both(f"egress_download_{route}"),
            shown=((50, "median"),),
            digits=0,
            table="egress",
        )
        for route in ("proxy", "sandbox")
    ]
    metrics += [
        Metric(
            f"egress_connect_{route}",
            f"New connection, {titles[route]}",
            "ms",
            connect.format(route=routes[route]),
            *both(f"egress_connect_{route}"),
            shown=((50, "p50"), (95, "p95")),
            digits=2,
            table="egress",
        )
        for route in ("proxy", "served", "sandbox")
    ]
    return metrics


def run_config(plan: Plan, *, quick: bool, total_s: float) -> dict[str, Any]:
    """The plan as recorded in the results, with the mode and the run's wall time."""
    return {"quick": quick, **asdict(plan), "total_s": round(total_s, 1)}


def notes(plan: Plan, metrics: list[Metric]) -> list[str]:
    """The lines under the table: the overhead ratio and how the figures were taken."""
    by_key = {metric.key: metric for metric in metrics}
    trip = by_key["round_trip_1plus1"]
    overhead = trip.ratio(50)
    overhead_text = "n/a" if overhead is None else f"{overhead:.2f}×"
    return [
        f"In-process round-trip overhead, sandboxed/baseline at p50: **{overhead_text}** "
        f"({trip.difference(50):+.2f} ms per execution; p99 ratio "
        f"{_ratio_text(trip.ratio(99))}).",
        "Baseline: an unsandboxed kernel from plain jupyter_client (`AsyncKernelManager`, "
        "the same interpreter and `ipykernel_launcher`, ipc transport, a fresh home per "
        f"kernel under {home_parent()}, as the sandbox's home is a fresh tmpfs), measured in "
        "the same run, alternating with corral run by run.",
        f"Cold start: {plan.cold_runs} runs per side after {plan.cold_warmup} discarded "
        "warm-up; a new session or kernel each time, stopped outside the timed part.",
        f"Round trip: {plan.rt_runs} runs per side after {plan.rt_warmup} warm-up runs, on "
        "one session and one baseline kernel.",
        "Through the server: a real server (uvicorn in a thread on 127.0.0.1, agent token) "
        "with one session; REST is `POST /v1/sessions/{id}/execute` on one keep-alive httpx "
        "client, MCP the `execute_python_code` tool from the SDK's `Client` over streamable "
        "HTTP. The in-process column is retaken in the same rotation (in-process, REST, MCP, "
        f"each first in turn; {plan.rt_runs} runs per side after {plan.rt_warmup} warm-up), "
        "so it can differ a little from the first table's figure. "
        f"{_transport_text(by_key)}",
        f"Memory: median of {plan.memory_sessions} kernels per side, each alone and measured "
        f"{plan.settle_s:g} s after it first answered; psutil `memory_full_info()` over "
        "`children(recursive=True)` plus the root. USS and RSS are in latest.json.",
        *_egress_notes(plan, by_key),
    ]


def _egress_notes(plan: Plan, by_key: dict[str, Metric]) -> list[str]:
    """The egress figures against their aims, and how they were taken."""

    def share(route: str) -> str:
        value = by_key[f"egress_download_{route}"].ratio(50)
        return "n/a" if value is None else f"{value:.0%}"

    def added(route: str) -> str:
        metric = by_key[f"egress_connect_{route}"]
        return f"{metric.difference(50):+.2f} ms at p50 and {metric.difference(95):+.2f} ms at p95"

    return [
        f"Egress download through the proxy: **{share('proxy')}** of direct at the median "
        f"(aim: above 80%); from the sandbox {share('sandbox')}. A new connection through the "
        f"proxy adds **{added('proxy')}** (aim: under 1 ms); through the server's proxy "
        f"{added('served')}; from the sandbox {added('sandbox')}.",
        "Egress method: an origin process on 127.0.0.2 generates each response (no file); "
        "the proxies run in the bench's event loop, as in `corral serve`, and every client is "
        "a process of its own (a host process, or the session's kernel). "
        f"{plan.egress_downloads} downloads of {plan.egress_mib} MiB per route after "
        f"{plan.egress_download_warmup} warm-up round, and {plan.egress_connections} new "
        f"connections per route in {plan.egress_blocks} blocks ({plan.egress_connect_warmup} "
        "warm-up each). The host process rotates its routes sample by sample; host and sandbox "
        "blocks take turns going first. The sandbox has no direct route, so its rows compare "
        "with the host's direct samples. All traffic stays on loopback.",
    ]


def _transport_text(by_key: dict[str, Metric]) -> str:
    """What REST and MCP add to an in-process `1+1`, at p50."""
    parts = [
        f"{name} adds {by_key[key].difference(50):+.2f} ms at p50"
        for name, key in (("REST", "round_trip_rest"), ("MCP", "round_trip_mcp"))
    ]
    return "; ".join(parts) + "."


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"
