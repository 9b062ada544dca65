"""Host variables in real sandboxes: only the operator's list enters, never a proxy setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import InvalidInput
from corral.kernels.sessions import SessionManager
from corral.sandbox.profile import PROXY_ENV
from corral.service import Service
from tests.server.conftest import free_port

EXEC_S = 30.0
SECRET = "s3cr3t-credential"

ENVIRON = """
import json, os
seen = {}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                seen[pid] = f.read().decode('utf-8', 'replace')
        except OSError:
            pass
print(json.dumps({'own': dict(os.environ), 'procs': seen}))
"""


async def test_only_listed_variables_enter_and_proxies_are_corrals_own(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_T_FORWARDED", "forwarded value")
    monkeypatch.setenv("CORRAL_T_UNLISTED", "unlisted value")
    for name in ("HTTPS_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://user:{SECRET}@proxy.example:1")
    monkeypatch.setenv("NO_PROXY", f"{SECRET}.example")
    listed = replace(settings, forward_env="CORRAL_T_FORWARDED, CORRAL_T_NOT_SET")
    async with Service(listed) as service:
        await service.create_session("env")
        result = await service.executions.run(ENVIRON, session_id="env", timeout_s=EXEC_S)
        assert result.status == "ok", result.text()
        shell = await service.executions.run(
            "env", session_id="env", language="bash", timeout_s=EXEC_S
        )
        assert shell.status == "ok", shell.text()
    seen = json.loads(result.stdout)
    own = seen["own"]
    assert own["CORRAL_T_FORWARDED"] == "forwarded value"
    assert "CORRAL_T_UNLISTED" not in own and "CORRAL_T_NOT_SET" not in own
    assert {name: own.get(name) for name, _ in PROXY_ENV} == dict(PROXY_ENV)
    assert own["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert seen["procs"], "no process environment was readable inside"
    for text in [json.dumps(own), *seen["procs"].values(), shell.stdout]:
        assert SECRET not in text
        assert "unlisted value" not in text


REFUSED = {
    "HTTP_PROXY": "HTTP_PROXY is a proxy setting: proxy settings never enter a sandbox",
    "https_proxy": "https_proxy is a proxy setting",
    "ALL_PROXY": "ALL_PROXY is a proxy setting",
    "no_proxy": "no_proxy is a proxy setting",
    "PATH": "PATH is set by corral inside the sandbox and cannot be forwarded",
    "LD_PRELOAD": "LD_PRELOAD is set by corral inside the sandbox",
    "SSH_AUTH_SOCK": "SSH_AUTH_SOCK is set by corral inside the sandbox",
    "BAD-NAME": "'BAD-NAME' is not an environment variable name",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_name_stops_the_server_from_being_built(settings: Settings, name: str) -> None:
    bad = replace(settings, forward_env=f"LANG,{name}")
    with pytest.raises(InvalidInput, match=REFUSED[name]):
        SessionManager(bad)
    with pytest.raises(InvalidInput, match=REFUSED[name]):
        Service(bad)


def test_the_environment_form_is_checked_too() -> None:
    settings = Settings.from_env({"CORRAL_FORWARD_ENV": "LANG,HTTP_PROXY"})
    with pytest.raises(InvalidInput, match="HTTP_PROXY is a proxy setting"):
        settings.forwarded_names  # noqa: B018


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--forward-env", "https_proxy"], {}), ([], {"CORRAL_FORWARD_ENV": "LD_PRELOAD"})],
)
def test_serve_refuses_a_refused_name_with_a_usage_error(
    tmp_path: Path, run_root: Path, args: list[str], env: dict[str, str]
) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    full.update(
        CORRAL_STATE_DIR=str(tmp_path / "state"),
        CORRAL_CONFIG_DIR=str(tmp_path / "config"),
        CORRAL_RUN_ROOT=str(run_root),
        CORRAL_PORT=str(free_port()),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-m", "corral", "serve", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Error:" in done.stderr and "agent token" not in done.stderr
