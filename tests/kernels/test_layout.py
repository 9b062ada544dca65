"""The session core's seams hold: the factory and the warm hand-over never load the session
registry, and the browser builds its sandboxes without it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module", ["corral.kernels.factory", "corral.kernels.warm", "corral.browser.fetch"]
)
def test_a_module_below_the_registry_does_not_load_it(module: str) -> None:
    probe = f"import sys, {module}; print('corral.kernels.sessions' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False"
