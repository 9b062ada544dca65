"""The corral command, run as a user would run it: a real process, real sandboxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CORRAL = [sys.executable, "-m", "corral"]


def _corral(
    *args: str, state: Path, run_root: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "CORRAL_STATE_DIR": str(state),
        "CORRAL_RUN_ROOT": str(run_root),
        **env,
    }
    return subprocess.run(
        [*CORRAL, *args], capture_output=True, text=True, env=environ, timeout=120, check=False
    )


@pytest.fixture
def cli(tmp_path: Path, run_root: Path):  # type: ignore[no-untyped-def]
    def call(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return _corral(*args, state=tmp_path / "state", run_root=run_root, **env)

    return call


def test_run_prints_the_result(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "print(1+1)")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2\n"


def test_run_exit_code_reflects_an_error(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "raise KeyError('k')")
    assert done.returncode == 1
    assert "KeyError" in done.stderr


def test_run_bash_that_exits_prints_its_output_and_fails(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "-l", "bash", "echo hi; exit 3")
    assert done.returncode == 1, done.stderr
    assert done.stdout == "hi\n"
    assert "bash exited with status 3" in done.stderr
    assert "Restarting" not in done.stdout + done.stderr


def test_run_bash_failure_says_its_exit_status(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "-l", "bash", "ls /nonexistent")
    assert done.returncode == 1
    assert "exit status 2" in done.stderr
    assert ": 2" not in done.stdout + done.stderr


def test_run_exit_code_reflects_a_timeout(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", "--timeout", "1", "import time; time.sleep(30)")
    assert done.returncode == 3
    assert "time limit" in done.stderr


def test_run_a_file_in_bash_as_json(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "s.sh"
    script.write_text("echo from-bash; pwd\n")
    done = cli("run", "--language", "bash", "--json", "--file", str(script))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stdout"].split() == ["from-bash", "/workspace"]
    assert result["status"] == "ok"


def test_run_needs_code_or_file(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run")
    assert done.returncode == 2
    assert "either CODE or --file" in done.stderr


def test_doctor_reports_a_working_sandbox(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("doctor", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert all(c["ok"] for c in checks.values())
    expected = {"bwrap", "seccomp", "user namespaces", "overlay", "sandbox python", "limits"}
    assert expected | {"kernel runtime", "runtime", "isolated", "tools"} <= set(checks)


def test_doctor_says_how_to_install_a_missing_kernel_runtime(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    done = cli("doctor", "--json", CORRAL_KERNEL_RUNTIME=str(tmp_path / "none"))
    assert done.returncode == 1
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert not checks["kernel runtime"]["ok"]
    assert "make serve" in checks["kernel runtime"]["detail"]
    assert "sandbox python" not in checks  # the sandbox probe needs the runtime


def test_doctor_explains_a_bwrap_that_cannot_make_namespaces(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap 0.11.0' && exit 0\n"
        "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    done = cli("doctor", "--json", CORRAL_BWRAP=str(fake))
    assert done.returncode == 1
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    userns = checks["user namespaces"]
    assert not userns["ok"]
    assert "Permission denied" in userns["detail"]
    assert userns["fix"]


def test_bad_setting_is_a_usage_error(cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("doctor", CORRAL_MAX_SESSIONS="many")
    assert done.returncode == 2
    assert "CORRAL_MAX_SESSIONS" in done.stderr


def test_sessions_without_a_server_list_and_delete_from_the_state(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, run_root: Path
) -> None:
    import asyncio

    from corral.config import Settings
    from corral.service import Service

    settings = Settings.from_env(
        {"CORRAL_STATE_DIR": str(tmp_path / "state"), "CORRAL_RUN_ROOT": str(run_root)}
    )

    async def make() -> None:
        async with Service(settings) as service:
            await service.create_session("listed")

    asyncio.run(make())
    listed = cli("sessions", "list", "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == ["listed"]
    assert json.loads(listed.stdout)[0]["state"] == "stopped"
    # Nothing runs without a server, so there is nothing to stop: one line says why.
    unknown = cli("sessions", "stop", "listed")
    assert unknown.returncode == 1
    assert unknown.stderr.count("\n") == 1 and "no corral server is running" in unknown.stderr
    deleted = cli("sessions", "delete", "--yes", "listed")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(cli("sessions", "list", "--json").stdout) == []
    missing = cli("sessions", "delete", "--yes", "nope")
    assert missing.returncode == 5 and "Session 'nope' not found." in missing.stderr
