"""The python kernel's entry point inside a sandbox (run as a script, never imported by corral).

It is ipykernel's own launcher with two things left out that an agent never uses and every
session would pay for: the Jupyter debugger (ipykernel loads debugpy and pydevd at start,
about half of an idle kernel's memory) and the history database (a thread writing SQLite
after every cell; `In`, `Out` and `%history` of the running kernel still work from memory).
Code run in the kernel can still `import debugpy`.
"""

import os
import sys

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the agent's imports must not see it

from ipykernel.kernelapp import IPKernelApp


def main() -> None:
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # the debugger stays off
    try:
        app = IPKernelApp.instance()
        app.initialize(["--HistoryManager.enabled=False", *sys.argv[1:]])  # type: ignore[no-untyped-call]
    finally:
        del sys.modules["debugpy"]
    app.start()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
