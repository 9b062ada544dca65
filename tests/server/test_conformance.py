"""schemathesis run against a real server, the way a client author checks an API first.

Every check (`--checks all`) in every phase: examples, coverage (boundary values of each
schema), fuzzing (random valid and invalid requests) and stateful (sequences that feed one
response's ids into the next request, through the document's links). Once with the agent's
token over the agent's operations, once with the admin token over `/v1/admin/`. The seed is
fixed and printed, so a failure replays with the command shown; `CORRAL_CONFORMANCE_SEED`
picks another (a random one when set to "random").

What a check cannot see from the document (a refusal for a value's meaning, the size limit)
is excused in `schemathesis.toml` beside this file, per operation, with the reason; the same
file bounds each request (a session's event stream never ends by itself) and makes the
stateful phase's sequences long enough to follow every link.

It is part of `make test`: about four minutes for the agent token and twenty seconds for the
admin one here, on one worker that starts it first (tests/conftest.py orders it so), beside
the rest of the suite.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import RunningServer, generated_requests_server

SEED = 20_261_203
EXAMPLES = 15  # per operation and phase
RUN_TIMEOUT_S = 600
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")

pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 60)


def seed() -> int:
    chosen = os.environ.get("CORRAL_CONFORMANCE_SEED", "")
    if chosen == "random":
        return secrets.randbelow(1 << 31)
    return int(chosen) if chosen else SEED


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with generated_requests_server(tmp_path_factory.mktemp("conformance")) as running:
        yield running


@pytest.mark.parametrize("who", ["agent", "admin"])
def test_schemathesis_finds_nothing_in_any_phase(
    who: str, server: RunningServer, tmp_path: Path
) -> None:
    assert server.tokens is not None
    token = server.tokens.admin if who == "admin" else server.tokens.agent
    scope = "--include-path-regex" if who == "admin" else "--exclude-path-regex"
    chosen = seed()
    argv = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(chosen),
        "--workers",
        "1",
        scope,
        "^/v1/admin/",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    shown = " ".join(argv).replace(token, "$TOKEN")
    print(f"seed {chosen}: {shown}")
    done = subprocess.run(
        [*argv, "-H", f"Authorization: Bearer {token}"],
        cwd=tmp_path,  # schemathesis keeps a cache of past crashes in its working directory
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = done.stdout.replace(token, "$TOKEN")
    (tmp_path / "output.txt").write_text(output)
    assert done.returncode == 0, f"seed {chosen}\n{output[-20_000:]}\n{done.stderr[-2000:]}"
