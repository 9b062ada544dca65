"""`corral doctor` on limits: the mechanism (tried for real) and one check per limit, run as a
user would run it, under the detected mechanism, the forced fallback and a bad setting.

Only the limit checks are asserted: other checks (the browser, for one) depend on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.doctor import Check, status_markup, stronger_limits_fix, user_manager_runs
from corral.sandbox.limits import (
    CGROUP_ROOT,
    best_effort,
    detect_mechanism,
    enforcement,
    own_cgroup1,
)

LIMIT_CHECKS = [
    "limit memory",
    "limit cpu",
    "limit tasks",
    "limit workspace",
    "limit tmpfs",
    "limit time",
    "limit output",
    "limit idle",
]


def doctor(
    tmp_path: Path, run_root: Path, **env: str
) -> tuple[int, dict[str, dict[str, Any]], int]:
    """`corral doctor --json`: (exit code, checks by name, the doctor's pid)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    environ.update(CORRAL_STATE_DIR=str(tmp_path / "state"), CORRAL_RUN_ROOT=str(run_root), **env)
    with subprocess.Popen(
        [sys.executable, "-m", "corral", "doctor", "--json"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        stdout, stderr = process.communicate(timeout=120)
    assert stdout, stderr
    return process.returncode, {c["name"]: c for c in json.loads(stdout)}, process.pid


def test_doctor_reports_the_detected_mechanism_and_each_limit(
    tmp_path: Path, run_root: Path
) -> None:
    detected = detect_mechanism()
    _, checks, _ = doctor(tmp_path, run_root)
    assert checks["limits"]["ok"], checks["limits"]
    assert checks["limits"]["detail"] == f"{detected.name}: {detected.detail}"
    how = enforcement(detected.name)
    weak = best_effort(detected.name)
    for name in LIMIT_CHECKS:
        limit = name.removeprefix("limit ")
        assert checks[name]["ok"], checks[name]
        assert checks[name]["detail"] == how[limit]
        assert checks[name]["strength"] == ("weak" if limit in weak else "ok"), checks[name]
        assert checks[name]["fix"] is None  # said once, on the mechanism's line
    # The workspace is a watchdog everywhere; the mechanism is weak only for its own limits.
    assert checks["limit workspace"]["strength"] == "weak"
    assert "busy or idle" in checks["limit workspace"]["detail"]
    assert checks["limits"]["strength"] == ("weak" if set(weak) - {"workspace"} else "ok")
    names = list(checks)
    assert names[names.index("limits") + 1 :][: len(LIMIT_CHECKS)] == LIMIT_CHECKS


def test_doctor_under_forced_rlimits(tmp_path: Path, run_root: Path) -> None:
    """Forced rlimits (even where they are also what is detected): weak memory, cpu and
    tasks, and the fix for this host said once."""
    _, checks, _ = doctor(tmp_path, run_root, CORRAL_LIMIT_MECHANISM="rlimit")
    assert checks["limits"]["ok"], checks["limits"]
    assert checks["limits"]["detail"] == "rlimit: per-process rlimits and a watchdog (forced)"
    for name in LIMIT_CHECKS:
        assert checks[name]["ok"], checks[name]
    assert "stops (SIGSTOP)" in checks["limit cpu"]["detail"]
    assert "total resident memory" in checks["limit memory"]["detail"]
    assert "watchdog" in checks["limit tasks"]["detail"]
    assert (checks["limits"]["strength"], checks["limits"]["fix"]) == (
        "weak",
        stronger_limits_fix("rlimit"),
    )
    for name in ("limit memory", "limit cpu", "limit tasks", "limit workspace"):
        assert (checks[name]["strength"], checks[name]["fix"]) == ("weak", None), checks[name]
    for name in ("limit tmpfs", "limit time", "limit output", "limit idle"):
        assert (checks[name]["strength"], checks[name]["fix"]) == ("ok", None), checks[name]


def test_the_fix_for_weak_limits_is_possible_on_this_host() -> None:
    """Where a stronger mechanism is detected, forcing rlimits is the thing to undo; else
    `systemd-run --user` is named only where a user manager answers (or after the lingering
    that would start one)."""
    fix = stronger_limits_fix("rlimit")
    detected = detect_mechanism()
    if detected.name != "rlimit":
        assert fix.startswith("unset CORRAL_LIMIT_MECHANISM: " + detected.name)
    elif "systemd-run" in fix and not user_manager_runs():
        assert "loginctl enable-linger" in fix, fix


def test_doctor_shows_weak_in_yellow_and_missing_in_red() -> None:
    assert status_markup(Check("limit cpu", True, "", strength="weak")) == "[yellow]weak[/yellow]"
    assert status_markup(Check("limit cpu", True, "", strength="missing")) == "[red]missing[/red]"
    assert status_markup(Check("limit cpu", True, "", strength="ok")) == "[green]ok[/green]"
    assert status_markup(Check("bwrap", False, "")) == "[red]FAILED[/red]"


def test_doctor_says_forced_when_the_forced_mechanism_is_the_detected_one(
    tmp_path: Path, run_root: Path
) -> None:
    detected = detect_mechanism()
    _, checks, _ = doctor(tmp_path, run_root, CORRAL_LIMIT_MECHANISM=detected.name)
    assert checks["limits"]["detail"] == f"{detected.name}: {detected.detail} (forced)"


@pytest.mark.parametrize(
    ("mechanism", "words"),
    [
        ("bogus", "unknown limit mechanism 'bogus'"),
        ("cgroup3", "unknown limit mechanism 'cgroup3'"),
    ],
)
def test_doctor_fails_the_limits_check_for_a_bad_mechanism(
    tmp_path: Path, run_root: Path, mechanism: str, words: str
) -> None:
    code, checks, _ = doctor(tmp_path, run_root, CORRAL_LIMIT_MECHANISM=mechanism)
    assert code == 1
    assert not checks["limits"]["ok"]
    assert words in checks["limits"]["detail"]
    assert checks["limits"]["fix"] == "set CORRAL_LIMIT_MECHANISM=rlimit"
    assert not any(name in checks for name in LIMIT_CHECKS)
    assert checks["sandbox python"]["ok"]  # the other checks still run


def test_doctor_fails_the_limits_check_for_a_mechanism_this_host_lacks(
    tmp_path: Path, run_root: Path
) -> None:
    missing = "cgroup1" if detect_mechanism().name == "cgroup2" else "cgroup2"
    code, checks, _ = doctor(tmp_path, run_root, CORRAL_LIMIT_MECHANISM=missing)
    assert code == 1
    assert not checks["limits"]["ok"]
    assert f"limit mechanism {missing} is not available here" in checks["limits"]["detail"]


@pytest.mark.skipif(detect_mechanism().name != "cgroup1", reason="checks cgroup v1 directories")
def test_doctor_leaves_no_cgroup_behind(tmp_path: Path, run_root: Path) -> None:
    _, checks, pid = doctor(tmp_path, run_root)
    assert checks["limits"]["ok"], checks["limits"]
    left = [
        own_cgroup1(CGROUP_ROOT, controller) / f"corral-{pid}"
        for controller in ("memory", "pids", "cpu", "freezer")
    ]
    assert [path for path in left if path.exists()] == []
