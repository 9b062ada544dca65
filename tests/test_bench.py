"""`make bench` runs: its smoke plan measures every row once or twice with tiny sizes and
writes every output. This checks that the bench runs, never a figure or a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bwrap, pytest.mark.timeout(300)]


def test_the_bench_smoke_run_measures_every_row_and_writes_its_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    document = json.loads((tmp_path / "latest.json").read_text())
    assert document["config"]["mode"] == "smoke"
    metrics = document["metrics"]
    assert set(metrics) == set(EXPECTED_ROWS), set(metrics) ^ set(EXPECTED_ROWS)
    for name, metric in metrics.items():
        assert metric["corral"]["n"] >= 1 and metric["corral"]["samples"], name
    markdown = (tmp_path / "latest.md").read_text()
    assert "- Mode: smoke;" in markdown
    shown = [m for m in metrics.values() if m["title"] in markdown]
    assert len(shown) >= len(metrics) - 5  # USS and RSS per session and processes: JSON only
    assert (tmp_path / "latest.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert markdown.strip() in done.stdout


EXPECTED_ROWS = (
    "cold_start",
    "round_trip_1plus1",
    "pool_start",
    "round_trip_rest",
    "round_trip_mcp",
    "first_result_rest",
    "first_result_mcp",
    "churn_cycle",
    "churn_rate",
    "exec_rate_1",
    "exec_latency_1",
    "exec_rate_2",
    "exec_latency_2",
    "idle_pss_per_session",
    "idle_uss_per_session",
    "idle_rss_per_session",
    "busy_pss_per_session",
    "busy_uss_per_session",
    "busy_rss_per_session",
    "processes_per_session",
    "fleet_pss_per_session",
    "fleet_pss_total",
    "egress_download_proxy",
    "egress_download_sandbox",
    "egress_connect_proxy",
    "egress_connect_served",
    "egress_connect_sandbox",
    "disk_overshoot_python",
    "disk_overshoot_dd",
    "disk_overshoot_dd4",
)
