"""The python kernel's entry point inside a sandbox (run as a script, never imported by corral).

It is ipykernel's own launcher with the costs left out that an agent never benefits from and
every session and every call would pay for:

- the Jupyter debugger: ipykernel loads debugpy and pydevd at start, about half of an idle
  kernel's memory (60 -> 31 MiB PSS here). Code run in the kernel can still import debugpy.
- the history database: a thread writing SQLite after every cell. `In`, `Out` and `%history`
  of the running kernel still work from memory.
- empty flushes: ipykernel flushes stdout and stderr several times per execution, and each
  flush waits for a round trip through its IOPub thread even when nothing was written. A
  flush with nothing buffered now returns at once.
- the IOPub thread's hop for the main thread's own messages: a status, a result or an error
  made by the cell's thread waited for the GIL until the cell's thread went idle, so all of
  them reached the client after the cell had ended (about 1 ms of a `1+1`). They now leave
  at once from the thread that made them when nothing is queued before them (see
  `_DirectIOPub`); output of other threads and forked children still goes through the IOPub
  thread, and ipykernel flushes printed text before every result, display and status.
- a half-millisecond sleep after every execution, and debug log records built for a handler
  that drops them.
- imports an idle kernel never uses: jupyter_client's client side (see
  `_defer_jupyter_clients_package`) and pdb with IPython's debugger, which ipykernel imports
  at start to make pdb interruptible (done when pdb is first imported instead, see
  `_InterruptiblePdbOnImport`): about 2 MiB of every idle kernel together.

`tests/kernels/test_output_order.py` holds the order of what a cell sends.
"""

import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this script's folder: the agent's imports must not see it


def _defer_jupyter_clients_package() -> None:
    """Let the kernel import jupyter_client's modules without the package's `__init__`.

    That `__init__` imports the client side of Jupyter (clients, managers, provisioners,
    kernel specs, importlib.metadata: 42 modules, 1.8 MiB of an idle kernel's memory)
    for the two names ipykernel takes from it at start, `write_connection_file` and
    `find_connection_file`. The package is registered unexecuted; those names come from
    their module, and the first use of any other name (code in the kernel importing
    jupyter_client, say) runs the `__init__` as usual.
    """
    spec = importlib.util.find_spec("jupyter_client")
    if spec is None or spec.loader is None or "jupyter_client" in sys.modules:
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def first_use(name: str) -> Any:
        if name in _CONNECT_NAMES:  # (`from jupyter_client import connect` would ask for
            # the name "connect" here first)
            return getattr(importlib.import_module("jupyter_client.connect"), name)
        del package.__getattr__  # the real names from now on
        loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = first_use  # type: ignore[method-assign]
    sys.modules["jupyter_client"] = package


_CONNECT_NAMES = ("write_connection_file", "find_connection_file")
_defer_jupyter_clients_package()  # before ipykernel is imported: the rest comes after

import zmq  # noqa: E402
from ipykernel import iostream, kernelapp  # noqa: E402
from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from traitlets.config import Config  # noqa: E402
from zmq.eventloop.zmqstream import ZMQStream  # noqa: E402

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


class _LockedStream(ZMQStream):
    """A stream whose every turn on its socket holds `lock` (the socket is shared)."""

    def __init__(self, socket: Any, io_loop: Any, lock: threading.RLock) -> None:
        self._socket_lock = lock
        super().__init__(socket, io_loop)

    def _handle_events(self, fd: Any, events: int) -> None:
        with self._socket_lock:
            super()._handle_events(fd, events)  # type: ignore[no-untyped-call]


class _DirectIOPub(iostream.IOPubThread):
    """ipykernel's IOPub thread, except that the main thread sends its own messages at once
    when nothing is waiting to go out before them.

    Every use of the socket holds `_socket_lock`: the direct sends, the thread's sends, its
    subscription listener and a stream's flush (which empties a buffer, then queues its
    message). `_queued` counts what was handed to the thread and has not run yet; a main
    thread message goes through the thread too while it is not zero, so nothing overtakes
    output already on its way. A forked child never takes the lock (a fork may have copied
    it held): it sends through its pipe to the parent as before.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._socket_lock = threading.RLock()
        self._queued = 0
        self._main = threading.main_thread()
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _master(self) -> bool:
        """False in a forked child."""
        return bool(self._is_master_process())  # type: ignore[no-untyped-call]

    def _setup_xpub_listener(self) -> None:
        """Listen for subscriptions as ipykernel does, through a stream that takes the lock."""
        if hasattr(self.socket, "getsockopt") and self.socket.getsockopt(zmq.TYPE) == zmq.XPUB:
            self._xpub_stream = _LockedStream(self.socket, self.io_loop, self._socket_lock)
            self._xpub_stream.on_recv(self._handle_subscription)

    def schedule(self, f: Callable[[], None]) -> None:
        if not self._master() or not self.thread.is_alive():
            super().schedule(f)  # type: ignore[no-untyped-call]
            return

        def run_then_count() -> None:
            try:
                f()
            finally:
                with self._socket_lock:
                    self._queued -= 1

        with self._socket_lock:
            self._queued += 1
        super().schedule(run_then_count)  # type: ignore[no-untyped-call]

    def send_multipart(self, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread() is self._main and self._master():
            with self._socket_lock:
                if self._queued == 0:
                    self._really_send(*args, **kwargs)
                    return
        super().send_multipart(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _really_send(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not self._master():
            super()._really_send(msg, *args, **kwargs)  # type: ignore[no-untyped-call]
            return
        with self._socket_lock:
            super()._really_send(msg, *args, **kwargs)  # type: ignore[no-untyped-call]

    def holding_socket(self, work: Callable[[], None]) -> None:
        """Run `work` under the socket's lock (in a forked child, without it)."""
        if not self._master():
            work()
            return
        with self._socket_lock:
            work()


_stream_flush = iostream.OutStream._flush


def _flush_holding_socket(stream: iostream.OutStream) -> None:
    """`OutStream._flush` with the socket's lock held from emptying the buffer to queueing
    its message, so that no main thread message slips between the two."""
    pub = stream.pub_thread
    if isinstance(pub, _DirectIOPub):
        pub.holding_socket(lambda: _stream_flush(stream))  # type: ignore[no-untyped-call]
    else:
        _stream_flush(stream)  # type: ignore[no-untyped-call]


class _InterruptiblePdbOnImport:
    """ipykernel's `init_pdb`, done when pdb is first imported instead of at start.

    ipykernel makes `pdb.set_trace` and `pdb.Pdb` IPython's interruptible debugger at
    start, importing pdb, bdb, cmd and IPython's debugger (0.35 MiB of an idle kernel)
    that an agent seldom uses. This finder, first on `sys.meta_path`, lets pdb and IPython's
    debugger load as usual and makes the same change once both have (whichever comes
    first imports the other), before the code that imported them goes on.
    """

    MODULES = ("pdb", "IPython.core.debugger")

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            loader: Any = spec.loader
            run = loader.exec_module

            def run_then_patch(module: Any) -> None:
                run(module)
                self.patch()

            loader.exec_module = run_then_patch
        return spec

    def patch(self) -> None:
        """ipykernel's change, once pdb and IPython's debugger have both loaded whole."""
        pdb: Any = sys.modules.get("pdb")
        debugger: Any = sys.modules.get("IPython.core.debugger")
        if pdb is None or (debugger is not None and not hasattr(debugger, "set_trace")):
            return  # one of them is still being run: done when it ends
        if debugger is None:
            importlib.import_module("IPython.core.debugger")  # patched when it ends
            return
        if hasattr(debugger, "InterruptiblePdb"):
            debugger.Pdb = debugger.InterruptiblePdb
            pdb.Pdb = debugger.Pdb
            pdb.set_trace = debugger.set_trace
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def main() -> None:
    iostream.OutStream.flush = _flush_if_written  # type: ignore[method-assign]
    iostream.OutStream._flush = _flush_holding_socket  # type: ignore[method-assign]
    kernelapp.IOPubThread = _DirectIOPub  # type: ignore[attr-defined]
    IPKernelApp.init_pdb = lambda self: None  # type: ignore[method-assign]
    sys.meta_path.insert(0, _InterruptiblePdbOnImport())
    config = Config()
    config.HistoryManager.enabled = False
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # the debugger stays off
    # The kernel is never a client of itself: the client class its connection mixin names
    # is not resolved (the name alone would load jupyter_client's package after all).
    IPKernelApp.class_traits()["blocking_class"].default_value = object
    try:
        app = IPKernelApp.instance(config=config)
        app.initialize(sys.argv[1:])  # type: ignore[no-untyped-call]
    finally:
        del sys.modules["debugpy"]
    app.kernel._execute_sleep = 0
    app.log.setLevel(logging.WARNING)  # its handler drops the rest anyway
    app.start()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
