"""The python kernel's entry point inside a sandbox (run as a script, never imported by corral).

It is ipykernel's own launcher with the costs left out that an agent never benefits from and
every session and every call would pay for:

- the Jupyter debugger: ipykernel loads debugpy and pydevd at start, about half of an idle
  kernel's memory (60 -> 31 MiB PSS here). Code run in the kernel can still import debugpy.
- the history database: a thread writing SQLite after every cell. `In`, `Out` and `%history`
  of the running kernel still work from memory.
- empty flushes: ipykernel flushes stdout and stderr several times per execution, and each
  flush waits for a round trip through its IOPub thread even when nothing was written (a
  quarter of the kernel's time for `1+1`). A flush with nothing buffered now returns at once;
  order is kept, since every message still leaves through that one thread in order.
"""

import os
import sys

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the agent's imports must not see it

from ipykernel import iostream
from ipykernel.kernelapp import IPKernelApp
from traitlets.config import Config

_flush = iostream.OutStream.flush


def _flush_if_written(stream: iostream.OutStream) -> None:
    """`OutStream.flush`, skipped when this process has buffered nothing since the last one."""
    lock = getattr(stream, "_buffer_lock", None)
    master = getattr(stream, "_is_master_process", None)
    if lock is not None and master is not None and stream.echo is None:
        with lock:
            if not getattr(stream, "_buffers", True) and master():
                return
    _flush(stream)  # type: ignore[no-untyped-call]


def main() -> None:
    iostream.OutStream.flush = _flush_if_written  # type: ignore[method-assign]
    config = Config()
    config.HistoryManager.enabled = False
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # the debugger stays off
    try:
        app = IPKernelApp.instance(config=config)
        app.initialize(sys.argv[1:])  # type: ignore[no-untyped-call]
    finally:
        del sys.modules["debugpy"]
    app.start()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
