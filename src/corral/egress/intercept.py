"""A CONNECT tunnel the proxy reads: TLS toward the sandbox with corral's certificate for
the target, one request read and judged, its own verified TLS toward the origin.

Only tunnels to hosts where a session's secret may go, or whose methods and paths the
policy limits, are intercepted (`EgressProxy` decides); every other tunnel stays opaque.
The sandbox trusts corral's CA; the origin is verified against the system's roots (and
the operator's extra CA file, if any): a failed check is a 502 to the sandbox, never a
connection without verification. Like a plain-HTTP proxy connection, an intercepted one
carries one request (`Connection: close`), so each request is judged and has its secrets
put in on its own.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h11

from corral.egress import protocol as p
from corral.egress.forward import Exchange, forward
from corral.egress.rules import IPAddress

# What to send for a request: the request to send on (its secrets put in), or why not.
Injector = Callable[[h11.Request], "h11.Request | str"]


@dataclass(frozen=True)
class Interception:
    server_context: ssl.SSLContext  # corral's certificate for the target
    upstream_context: ssl.SSLContext
    header_timeout_s: float
    connect_timeout_s: float
    idle_timeout_s: float


def upstream_context(extra_ca: Path | None = None) -> ssl.SSLContext:
    """Verification toward origins: the system's roots, and `extra_ca` when given."""
    context = ssl.create_default_context()
    if extra_ca is not None:
        context.load_verify_locations(cafile=str(extra_ca))
    context.set_alpn_protocols(["http/1.1"])
    return context


async def intercept(
    down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    target: p.Target,
    address: IPAddress,
    tls: Interception,
    inject: Injector,
    counters: tuple[Callable[[int], None], Callable[[int], None]],
) -> None:
    """Serve one request of a tunnel whose `200 Connection established` was sent."""
    reader, writer = down
    await writer.start_tls(tls.server_context, ssl_handshake_timeout=tls.header_timeout_s)
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), tls.header_timeout_s)
        request = p.parse_tunnelled(head, target)
    except (asyncio.LimitOverrunError, p.ProtocolError) as exc:
        await _reply(writer, 400, "Bad Request", f"corral proxy: {exc}\n")
        return
    if request.upstream is None or request.client is None:  # pragma: no cover - never, parsed
        return
    outgoing = inject(request.upstream)
    if isinstance(outgoing, str):
        await _reply(writer, 403, "Forbidden", f"corral proxy: refused: {outgoing}\n")
        return
    try:
        up = await asyncio.wait_for(
            asyncio.open_connection(
                str(address),
                target.port,
                ssl=tls.upstream_context,
                server_hostname=target.host,
            ),
            tls.connect_timeout_s,
        )
    except ssl.SSLCertVerificationError as exc:
        why = f"its certificate failed verification ({exc.verify_message})"
        await _reply(writer, 502, "Bad Gateway", f"corral proxy: {target.host}: {why}\n")
        return
    except (OSError, TimeoutError) as exc:
        await _reply(writer, 502, "Bad Gateway", f"corral proxy: {target.host}: {exc}\n")
        return
    exchange = Exchange(request.client, down, up, tls.idle_timeout_s, *counters)
    try:
        await forward(exchange, outgoing)
    finally:
        up[1].close()


async def _reply(writer: asyncio.StreamWriter, status: int, reason: str, text: str) -> None:
    writer.write(p.http_reply(status, reason, text))
    await writer.drain()
