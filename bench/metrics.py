"""The reported metrics: each figure's title, unit, description, rows shown and aims."""

from __future__ import annotations

from collections.abc import Callable

from bench.aims import Aim
from bench.footprint import WORKLOAD_TEXT
from bench.measure import Paired, Plan
from bench.report import Metric
from bench.stats import Summary

Both = Callable[[str], tuple[Summary, Summary]]
P50_P95 = ((50, "p50"), (95, "p95"))
P50_P99 = ((50, "p50"), (99, "p99"))
P50_P95_P99 = ((50, "p50"), (95, "p95"), (99, "p99"))
MEDIAN = ((50, "median"),)
AIM_FLEET_SESSIONS = 64
AIM_FLEET_MIB = 4096.0
AIM_SESSION_MIB = 30.0  # per idle session among them


def build_metrics(samples: dict[str, Paired], plan: Plan) -> list[Metric]:
    """The reported metrics from the samples `collect(plan)` took, in report order."""

    def both(key: str) -> tuple[Summary, Summary]:
        return Summary.of(samples[key].corral), Summary.of(samples[key].baseline)

    return [
        *_start_metrics(both),
        *_served_metrics(both),
        *_new_session_metrics(both),
        *_concurrency_metrics(both, plan),
        *_memory_metrics(both, plan),
        *_egress_metrics(both, plan),
        *_disk_metrics(both),
    ]


def _start_metrics(both: Both) -> list[Metric]:
    """Cold start and the in-process round trip against the baseline; start from the pool."""
    return [
        Metric(
            "cold_start",
            "Cold session start",
            "ms",
            "From asking for a new session to a kernel that answers kernel_info. corral: "
            "SessionManager.create() with the warm pool off; baseline: start_kernel() + "
            "wait_for_ready().",
            *both("cold_start"),
            shown=P50_P95,
            digits=1,
            aims=(Aim(50, 400.0),),  # issue 17
        ),
        Metric(
            "round_trip_1plus1",
            "`1+1` round trip",
            "ms",
            "One execution of 1+1 until iopub is idle and the shell reply is in. corral: "
            "CallRunner.execute(); baseline: client.execute() and reading the replies.",
            *both("round_trip"),
            shown=P50_P99,
            digits=2,
        ),
        Metric(
            "pool_start",
            "Session start from the pool",
            "ms",
            "SessionManager.create(start=True) until it returns a session whose python kernel "
            "answers, with the warm pool full (waited for before each sample, not timed). "
            "from the pool: a manager with the default pool, every sample checked from_pool; "
            "cold: the bench's manager with the pool off, sampled in rotation with it.",
            *both("pool_start"),
            shown=P50_P95,
            digits=1,
            table="pool",
            aims=(Aim(50, 20.0),),
        ),
    ]


def _served_metrics(both: Both) -> list[Metric]:
    """`1+1` through the real server, over REST and over MCP, against in-process calls."""
    return [
        Metric(
            "round_trip_rest",
            "`1+1` round trip via REST",
            "ms",
            'POST /v1/sessions/{id}/execute with {"code": "1+1"} on one keep-alive '
            "HTTP/1.1 connection (bench.http1), to `corral serve` in its own process on "
            "127.0.0.1, until the JSON result is read. corral: through the server; "
            "baseline: in-process CallRunner.execute(), sampled in rotation with REST and MCP.",
            *both("round_trip_rest"),
            shown=P50_P99,
            digits=2,
            table="served",
            aims=(Aim(50, 5.0), Aim(50, 2.5)),  # issue 7, then issue 17
        ),
        Metric(
            "round_trip_mcp",
            "`1+1` round trip via MCP",
            "ms",
            "The execute_python_code tool with command 1+1, called by the MCP SDK's Client "
            "over streamable HTTP (one httpx2 client) on the same server and session as REST. "
            "corral: through the server; baseline: in-process CallRunner.execute(), "
            "sampled in rotation with REST and MCP.",
            *both("round_trip_mcp"),
            shown=P50_P99,
            digits=2,
            table="served",
            aims=(Aim(50, 10.0), Aim(50, 3.5)),  # issue 7, then issue 17
        ),
    ]


def _new_session_metrics(both: Both) -> list[Metric]:
    """A new session's first result over REST and MCP, and churn, against plain kernels."""
    baseline = (
        "baseline: the first `1+1` of a plain jupyter_client kernel started just before "
        "(not timed), as a pool holds one."
    )
    first = (
        "From asking for a new session to the result of its first `1+1`, {how}, against "
        "`corral serve` with its default warm pool, full before each sample (not timed); "
        + baseline
    )
    return [
        Metric(
            "first_result_rest",
            "Time to first result via REST",
            "ms",
            first.format(how="POST /v1/sessions then POST /v1/sessions/{id}/execute"),
            *both("first_result_rest"),
            shown=P50_P95,
            digits=1,
            table="fresh",
            aims=(Aim(50, 10.0),),
        ),
        Metric(
            "first_result_mcp",
            "Time to first result via MCP",
            "ms",
            first.format(how="the start_python_session then execute_python_code tools"),
            *both("first_result_mcp"),
            shown=P50_P95,
            digits=1,
            table="fresh",
            aims=(Aim(50, 10.0),),
        ),
        Metric(
            "churn_cycle",
            "Churn: create, `1+1`, delete",
            "ms",
            "One cycle over REST (POST /v1/sessions, execute 1+1, DELETE the session), "
            "cycles back to back with nothing waited for between them, so the pool refills "
            "as it can; baseline: start a plain kernel, 1+1, stop it.",
            *both("churn_cycle"),
            shown=P50_P95,
            digits=1,
            table="fresh",
            aims=(Aim(50, 100.0),),
        ),
        Metric(
            "churn_rate",
            "Churn: sessions per second",
            "sessions/s",
            "Cycles of churn_cycle per second of a round's wall time, one sample per round.",
            *both("churn_rate"),
            shown=MEDIAN,
            digits=1,
            table="fresh",
            aims=(Aim(50, 5.0, above=True),),
        ),
    ]


def _concurrency_metrics(both: Both, plan: Plan) -> list[Metric]:
    """Per level: executions per second in total, and the latency of each execution."""
    metrics: list[Metric] = []
    for level in plan.concurrency:
        sessions = f"{level} session{'s' if level > 1 else ''}"
        metrics += [
            Metric(
                f"exec_rate_{level}",
                f"Executions/s, {sessions}",
                "exec/s",
                f"{sessions} at once, each running `1+1` after `1+1`; one sample per round of "
                f"{plan.conc_execs} executions split evenly over the sessions, executions "
                "divided by the round's wall time. corral: CallRunner.execute() on "
                f"{sessions}; baseline: as many unsandboxed kernels.",
                *both(f"exec_rate_{level}"),
                shown=MEDIAN,
                digits=0,
                table="concurrency",
            ),
            Metric(
                f"exec_latency_{level}",
                f"`1+1` latency, {sessions}",
                "ms",
                f"Each execution's round trip while {sessions} run at once (the rounds "
                f"of exec_rate_{level}).",
                *both(f"exec_latency_{level}"),
                shown=P50_P95_P99,
                digits=2,
                table="concurrency",
            ),
        ]
    return metrics


def _memory_metrics(both: Both, plan: Plan) -> list[Metric]:
    """Idle and busy memory of one session at a time, and the idle fleet."""
    tree = (
        "summed over the kernel's whole process tree (corral: the outer bwrap and its "
        "descendants, the spawner with the egress forwarder's relay included), one kernel "
        "at a time"
    )
    return [
        *_per_session_memory(both, "", "Idle", f"{tree}, after `1+1`"),
        *_per_session_memory(both, "busy_", "Busy", f"{tree}, after {WORKLOAD_TEXT}"),
        Metric(
            "processes_per_session",
            "Processes per session",
            "processes",
            "Processes in one idle session's tree (corral: bwrap, its child, the spawner, "
            "which also relays egress, and the kernel; baseline: the kernel).",
            *both("processes"),
            shown=MEDIAN,
            digits=0,
            in_table=False,
            table="memory",
        ),
        *_fleet_metrics(both, plan),
    ]


def _per_session_memory(both: Both, prefix: str, state: str, how: str) -> list[Metric]:
    """PSS (in the table), USS and RSS (JSON only) of one session in `state`."""
    names = {
        "pss": "Proportional set size",
        "uss": "Unique set size",
        "rss": "Resident set size (shared pages counted in full by every process)",
    }
    return [
        Metric(
            f"{prefix or 'idle_'}{field}_per_session",
            f"{state} {field.upper()} per session",
            "MiB",
            f"{names[field]} {how}.",
            *both(prefix + field),
            shown=MEDIAN,
            digits=1,
            in_table=field == "pss",
            table="memory",
        )
        for field in ("pss", "uss", "rss")
    ]


def _fleet_metrics(both: Both, plan: Plan) -> list[Metric]:
    """The idle fleet: PSS per session within it, and the total against the aim."""
    count = plan.fleet_sessions
    unchecked = None
    if count < AIM_FLEET_SESSIONS:
        unchecked = f"{count} sessions measured, the aim is about {AIM_FLEET_SESSIONS}"
    return [
        Metric(
            "fleet_pss_per_session",
            f"PSS per session among {count} idle",
            "MiB",
            f"{count} sessions started and idle at once (each ran `1+1`), then as many "
            "baseline kernels; one sample per session, its whole process tree.",
            *both("fleet_pss"),
            shown=((50, "median"), (95, "p95")),
            digits=1,
            table="memory",
            aims=(Aim(50, AIM_SESSION_MIB, unchecked=unchecked),),  # issue 17
        ),
        Metric(
            "fleet_pss_total",
            f"{count} idle sessions, total PSS",
            "MiB",
            f"The sum of the PSS of every process of {count} idle sessions running at once "
            "(bwrap, the spawner and the kernel); baseline: as many idle unsandboxed "
            f"kernels. One sample per side. The aim is about {AIM_FLEET_SESSIONS} sessions "
            "and is checked only when at least that many ran.",
            *both("fleet_total"),
            shown=((50, "total"),),
            digits=0,
            table="memory",
            aims=(Aim(50, AIM_FLEET_MIB, unchecked=unchecked),),
        ),
    ]


def _egress_metrics(both: Both, plan: Plan) -> list[Metric]:
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
    download_aims = {"proxy": (Aim(50, 0.8, of="ratio", above=True),)}
    connect_aims = {"proxy": (Aim(50, 1.0, of="difference"), Aim(95, 1.0, of="difference"))}
    metrics = [
        Metric(
            f"egress_download_{route}",
            f"Download, {titles[route]}",
            "MiB/s",
            download.format(mib=plan.egress_mib, route=routes[route]),
            *both(f"egress_download_{route}"),
            shown=MEDIAN,
            digits=0,
            table="egress",
            aims=download_aims.get(route, ()),
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
            shown=P50_P95,
            digits=2,
            table="egress",
            aims=connect_aims.get(route, ()),
        )
        for route in ("proxy", "served", "sandbox")
    ]
    return metrics


def _disk_metrics(both: Both) -> list[Metric]:
    """Per writer: MiB on disk past a 64 MiB workspace limit when the patrol stopped it."""
    writers = {
        "python": "Python writing 1 MiB files in a loop",
        "dd": "a shell loop of dd (16 MiB each) started by subprocess.run",
        "dd4": "four such shell loops at once",
    }
    return [
        Metric(
            f"disk_overshoot_{name}",
            f"Past the workspace limit: {what}",
            "MiB",
            "MiB the session held past its 64 MiB workspace limit right after the result "
            "came back (the patrol's own measurement; a fresh session per sample). written in "
            "one tick: what that writer writes in one 10 ms patrol tick at the rate it wrote "
            "in the sample, so the ratio is the overshoot in ticks of writing.",
            *both(f"disk_overshoot_{name}"),
            shown=((50, "median"), (100, "max")),
            digits=1,
            table="disk",
        )
        for name, what in writers.items()
    ]
