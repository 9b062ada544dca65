"""The lines under the tables: headline ratios, and how each figure was taken."""

from __future__ import annotations

from bench.baseline import home_parent
from bench.fleet import STARTS_AT_ONCE
from bench.footprint import WORKLOAD_TEXT
from bench.measure import SERVED_BLOCK, Plan
from bench.metrics import AIM_FLEET_MIB, AIM_FLEET_SESSIONS
from bench.report import Metric


def notes(plan: Plan, metrics: list[Metric]) -> list[str]:
    """Every note of the report, in the order of the tables."""
    by_key = {metric.key: metric for metric in metrics}
    return [
        *_start_notes(plan, by_key),
        _served_note(plan, by_key),
        _new_session_note(plan, by_key),
        *_concurrency_notes(plan, by_key),
        *_memory_notes(plan, by_key),
        *_egress_notes(plan, by_key),
    ]


def _start_notes(plan: Plan, by_key: dict[str, Metric]) -> list[str]:
    trip = by_key["round_trip_1plus1"]
    pool = by_key["pool_start"]
    return [
        f"In-process round-trip overhead, sandboxed/baseline at p50: "
        f"**{_ratio_text(trip.ratio(50))}** ({trip.difference(50):+.2f} ms per execution; "
        f"p99 ratio {_ratio_text(trip.ratio(99))}).",
        "Baseline: an unsandboxed kernel from plain jupyter_client (`AsyncKernelManager`, "
        "the same interpreter and kernel program as corral's, i.e. corral's unsandboxed "
        "`kernel_spec`, ipc transport, a fresh home per "
        f"kernel under {home_parent()}, as the sandbox's home is a fresh tmpfs), measured in "
        "the same run, alternating with corral run by run. corral runs as in `corral serve`: "
        "the session manager of a `Service`, so every sandbox has its egress forwarder and "
        "a proxy socket; its warm pool is off except where the pool is measured.",
        f"Cold start: {plan.cold_runs} runs per side after {plan.cold_warmup} discarded "
        "warm-up; a new session or kernel each time, stopped outside the timed part.",
        f"Session start from the warm pool: **{pool.corral.p(50):.1f} ms** at p50 against "
        f"{pool.baseline.p(50):.0f} ms cold ({_speedup(pool.ratio(50))}). "
        f"{plan.pool_runs} runs per side after {plan.pool_warmup} warm-up, alternating; "
        "before each sample of either side the pool was waited for until full, so no kernel "
        "was starting in the background; each session was deleted outside the timed part.",
        f"Round trip: {plan.rt_runs} runs per side after {plan.rt_warmup} warm-up runs, on "
        "one session and one baseline kernel.",
    ]


def _served_note(plan: Plan, by_key: dict[str, Metric]) -> str:
    parts = [
        f"{name} adds {by_key[key].difference(50):+.2f} ms at p50"
        for name, key in (("REST", "round_trip_rest"), ("MCP", "round_trip_mcp"))
    ]
    return (
        "Through the server: `corral serve` in a process of its own on 127.0.0.1 (agent "
        "token, pool off) with one session; REST is `POST /v1/sessions/{id}/execute` on one "
        "keep-alive HTTP/1.1 connection from a minimal client (`bench.http1`; httpx adds "
        "about 1 ms per request of its own here), MCP the `execute_python_code` tool from "
        "the SDK's `Client` over streamable HTTP. The in-process column is retaken in the "
        f"same rotation (in-process, REST, MCP taking turns in blocks of {SERVED_BLOCK} "
        f"consecutive calls, each first in turn; {plan.rt_runs} runs per side after "
        f"{plan.rt_warmup} warm-up), so it can differ a little from the first table's "
        f"figure. {'; '.join(parts)}."
    )


def _new_session_note(plan: Plan, by_key: dict[str, Metric]) -> str:
    rest, mcp = by_key["first_result_rest"], by_key["first_result_mcp"]
    churn = by_key["churn_rate"]
    return (
        f"A new session: its first result in **{rest.corral.p(50):.1f} ms** over REST and "
        f"**{mcp.corral.p(50):.1f} ms** over MCP at p50 (a plain kernel's first `1+1`: "
        f"{rest.baseline.p(50):.1f} ms), {plan.first_runs} runs per side after "
        f"{plan.first_warmup} warm-up, REST, MCP and the baseline taking turns; each session "
        "was deleted and the pool waited for until full outside the timed part. Churn: "
        f"**{churn.corral.p(50):.1f} sessions/s** (plain kernels: {churn.baseline.p(50):.1f}), "
        f"{plan.churn_rounds} rounds of {plan.churn_cycles} cycles per side, alternating."
    )


def _concurrency_notes(plan: Plan, by_key: dict[str, Metric]) -> list[str]:
    rates = ", ".join(
        f"{level}: {by_key[f'exec_rate_{level}'].corral.p(50):.0f} exec/s "
        f"({_ratio_text(by_key[f'exec_rate_{level}'].ratio(50))} of the floor)"
        for level in plan.concurrency
    )
    top = max(plan.concurrency)
    return [
        f"Concurrent sessions, median executions/s by sessions at once: {rates}.",
        f"Concurrency method: {top} sessions and {top} baseline kernels started once "
        f"({STARTS_AT_ONCE} at a time, each then ran `1+1` {plan.rt_warmup} times); each "
        f"level uses the first N of each. {plan.conc_rounds} rounds per side and level, "
        f"alternating, each of {plan.conc_execs} executions of `1+1` split evenly over the N "
        "sessions, which run their share back to back, all N at once, from one asyncio "
        "client process. Latency percentiles pool every execution of the level's rounds.",
    ]


def _memory_notes(plan: Plan, by_key: dict[str, Metric]) -> list[str]:
    total = by_key["fleet_pss_total"]
    count = plan.fleet_sessions
    corral_mib = total.corral.p(50)
    if count >= AIM_FLEET_SESSIONS:
        verdict = "met" if corral_mib < AIM_FLEET_MIB else "missed"
        fleet = f"{count} idle sessions hold **{corral_mib:.0f} MiB** in total: aim {verdict}"
    else:
        scaled = corral_mib / count * AIM_FLEET_SESSIONS
        fleet = (
            f"{count} idle sessions (not {AIM_FLEET_SESSIONS}: aim not checked) hold "
            f"**{corral_mib:.0f} MiB** in total; scaled linearly to {AIM_FLEET_SESSIONS}, "
            f"{scaled:.0f} MiB (shared pages split further among more sessions, so more "
            "sessions likely hold less each)"
        )
    processes = by_key["processes_per_session"]
    return [
        f"Memory: {fleet} (aim: {AIM_FLEET_SESSIONS} in under {AIM_FLEET_MIB:.0f} MiB); "
        f"the same number of unsandboxed kernels hold {total.baseline.p(50):.0f} MiB.",
        f"Memory method: PSS from psutil `memory_full_info()` over the kernel's process and "
        f"`children(recursive=True)` ({processes.corral.p(50):.0f} processes per sandbox, "
        f"{processes.baseline.p(50):.0f} per baseline kernel); only one side's kernels run "
        f"while read. Idle and busy: median of {plan.memory_sessions} kernels per side, each "
        f"alone, read {plan.settle_s:g} s after `1+1`, then {plan.settle_s:g} s after the "
        f"busy workload: {WORKLOAD_TEXT}. The fleet: {count} sessions started "
        f"{STARTS_AT_ONCE} at a time, each ran `1+1`, read together {plan.settle_s:g} s after "
        "the last start, then stopped before the baseline fleet started. USS and RSS are in "
        "latest.json.",
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


def _speedup(ratio: float | None) -> str:
    """A ratio below 1 as "N× faster"."""
    return "n/a" if not ratio else f"{1 / ratio:.0f}× faster"


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"
