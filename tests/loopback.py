"""Host-side servers for network tests, on 127.0.0.2.

Inside a sandbox 127.0.0.1 is the sandbox's own loopback (and bypasses the proxy), so host
services that a test lets a sandbox reach live on another loopback address, which the test
lists explicitly in the session's policy.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

HOST = "127.0.0.2"


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep test output clean: requests are checked by the tests, not logged."""


@contextlib.contextmanager
def serve(
    handler: Callable[..., http.server.BaseHTTPRequestHandler],
    tls: ssl.SSLContext | None = None,
) -> Iterator[int]:
    """An HTTP server on 127.0.0.2 answering with `handler` (HTTPS with `tls`); yields its
    port, stops on exit."""
    httpd = http.server.ThreadingHTTPServer((HOST, 0), handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[int]:
    """A static file server for `root` on 127.0.0.2; yields its port, stops on exit."""
    with serve(functools.partial(_QuietFiles, directory=str(root))) as port:
        yield port
