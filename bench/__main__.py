"""`python -m bench [--quick]`: run the benchmarks, print Markdown, write bench/results/."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.measure import Plan, log
from bench.report import markdown_report, results_document, write_results
from bench.runner import build_metrics, collect, notes, run_config
from bench.system import system_info
from corral.errors import CorralError

RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK = Plan(
    cold_runs=3,
    rt_runs=30,
    memory_sessions=3,
    egress_mib=50,
    egress_downloads=3,
    egress_connections=60,
    egress_blocks=2,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: --quick, optional counts overriding the plan, the results folder."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few runs, for iterating")
    parser.add_argument("--cold-runs", type=_positive, help="cold starts per side")
    parser.add_argument("--rt-runs", type=_positive, help="1+1 round trips per side")
    parser.add_argument("--memory-sessions", type=_positive, help="idle kernels per side")
    parser.add_argument("--egress-mib", type=_positive, help="MiB per egress download")
    parser.add_argument("--egress-downloads", type=_positive, help="egress downloads per route")
    parser.add_argument(
        "--egress-connections", type=_positive, help="new egress connections per route"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where latest.json and latest.md go (default: {RESULTS_DIR})",
    )
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count")
    return value


def plan_from(args: argparse.Namespace) -> Plan:
    """The default or quick plan, with any counts given on the command line."""
    plan = QUICK if args.quick else Plan()
    overrides = {
        "cold_runs": args.cold_runs,
        "rt_runs": args.rt_runs,
        "memory_sessions": args.memory_sessions,
        "egress_mib": args.egress_mib,
        "egress_downloads": args.egress_downloads,
        "egress_connections": args.egress_connections,
    }
    return replace(plan, **{key: value for key, value in overrides.items() if value is not None})


def main(argv: list[str] | None = None) -> int:
    """Run everything; 0 on success, 1 when corral could not run a kernel, 130 on Ctrl-C."""
    args = parse_args(argv)
    plan = plan_from(args)
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
    config = run_config(plan, quick=args.quick, total_s=time.perf_counter() - started)
    metrics = build_metrics(samples, plan)
    markdown = markdown_report(system, config, metrics, notes(plan, metrics))
    paths = write_results(args.results_dir, results_document(system, config, metrics), markdown)
    print(markdown)
    log("wrote " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
