"""The egress tests reuse the server fixtures (one real server for this folder)."""

from tests.server.conftest import server, server_settings, sid

__all__ = ["server", "server_settings", "sid"]
