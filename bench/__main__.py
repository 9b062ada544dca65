"""`python -m bench [--quick | --smoke]`: run the benchmarks, print Markdown, write
bench/results/. `--smoke` measures every row once or twice with tiny sizes: it shows that
the bench runs (the suite runs it), never what corral's figures are."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.measure import Plan, log
from bench.metrics import build_metrics
from bench.notes import notes
from bench.plot import draw_latencies
from bench.report import markdown_report, results_document, write_results
from bench.runner import collect, run_config
from bench.system import system_info
from corral.errors import CorralError

RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK = Plan(
    cold_runs=3,
    pool_runs=3,
    rt_runs=30,
    memory_sessions=2,
    fleet_sessions=8,
    concurrency=(1, 8, 32),
    conc_execs=100,
    conc_rounds=2,
    egress_mib=50,
    egress_downloads=3,
    egress_connections=60,
    egress_blocks=2,
    disk_runs=2,
    first_runs=5,
    churn_rounds=1,
)
SMOKE = Plan(
    cold_runs=1,
    cold_warmup=0,
    pool_runs=1,
    pool_warmup=0,
    rt_runs=2,
    rt_warmup=1,
    memory_sessions=1,
    settle_s=0.1,
    fleet_sessions=2,
    concurrency=(1, 2),
    conc_execs=2,
    conc_rounds=1,
    egress_mib=1,
    egress_downloads=1,
    egress_download_warmup=0,
    egress_connections=2,
    egress_connect_warmup=0,
    egress_blocks=1,
    disk_runs=1,
    first_runs=1,
    first_warmup=0,
    churn_cycles=2,
    churn_rounds=1,
)
# Command-line option (without the dashes) for each count of the plan it can override.
COUNTS = {
    "cold_runs": "cold starts per side",
    "pool_runs": "session starts from the pool (and cold) per side",
    "rt_runs": "1+1 round trips per side",
    "memory_sessions": "kernels per side read idle and busy, one at a time",
    "fleet_sessions": "idle sessions (and baseline kernels) read together",
    "conc_execs": "executions per concurrency round, split over its sessions",
    "conc_rounds": "concurrency rounds per side and level",
    "egress_mib": "MiB per egress download",
    "egress_downloads": "egress downloads per route",
    "egress_connections": "new egress connections per route",
    "first_runs": "first results (new session, then 1+1) per side and transport",
    "churn_cycles": "create / 1+1 / delete cycles per churn round",
    "churn_rounds": "churn rounds per side",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: --quick, optional counts overriding the plan, the results folder."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="few runs, for iterating")
    modes.add_argument(
        "--smoke", action="store_true", help="every row once or twice, tiny sizes: does it run?"
    )
    for name, text in COUNTS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=_positive, help=text)
    parser.add_argument(
        "--concurrency",
        type=_levels,
        help="sessions at once, comma-separated (default: 1,8,32)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where latest.json, latest.md and latest.png go (default: {RESULTS_DIR})",
    )
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count")
    return value


def _levels(text: str) -> tuple[int, ...]:
    """ "1,8,32" as (1, 8, 32): positive, without repeats, in increasing order."""
    try:
        levels = sorted({_positive(part) for part in text.split(",")})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts") from exc
    return tuple(levels)


def plan_from(args: argparse.Namespace) -> Plan:
    """The default or quick plan, with any counts given on the command line.

    Raises `ValueError` when the counts do not fit together (see `Plan`).
    """
    plan = SMOKE if args.smoke else QUICK if args.quick else Plan()
    overrides = {name: getattr(args, name) for name in (*COUNTS, "concurrency")}
    return replace(plan, **{key: value for key, value in overrides.items() if value is not None})


def main(argv: list[str] | None = None) -> int:
    """Run everything; 0 on success, 1 when corral could not run a kernel, 2 for counts
    that do not fit together, 130 on Ctrl-C."""
    args = parse_args(argv)
    try:
        plan = plan_from(args)
    except ValueError as exc:
        log(f"bench: {exc}")
        return 2
    system = system_info()
    started = time.perf_counter()
    try:
        samples = asyncio.run(collect(plan))
    except CorralError as exc:
        log(f"bench: corral failed: {exc}")
        return 1
    except KeyboardInterrupt:
        log("bench: interrupted; kernels stopped and temporary directories removed")
        return 130
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    config = run_config(plan, mode=mode, total_s=time.perf_counter() - started)
    metrics = build_metrics(samples, plan)
    markdown = markdown_report(system, config, metrics, notes(plan, metrics))
    paths = write_results(args.results_dir, results_document(system, config, metrics), markdown)
    paths.append(draw_latencies(system, config, metrics, args.results_dir / "latest.png"))
    print(markdown)
    log("wrote " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
