"""One plain-HTTP request through the proxy: its body to the origin, the answer back, the end.

A proxy connection carries exactly one plain-HTTP request. The origin is asked to close, the
client is told `Connection: close`, and the proxy ends both connections once the answer is
sent, whatever either side would do next. Bytes the client sends after its request's body are
never relayed (they are read and dropped until the client ends its side), so a client's next
request comes on a new connection, where the proxy judges it for its own target: nothing is
ever relayed to an origin the policy did not check for that request.

Both sides are framed by h11, so the request's body and the answer end exactly where their
framing says, and what is sent on is re-framed by the proxy rather than copied.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import h11

from corral.egress import protocol as p

READ_BYTES = 65536


@dataclass
class Exchange:
    """The two connections of one forwarded request and what counts their bytes."""

    client: h11.Connection  # the server role toward the sandbox, past the request head
    down: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    up: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    idle_timeout_s: float
    count_out: Callable[[int], None]
    count_in: Callable[[int], None]

    def __post_init__(self) -> None:
        self.origin = h11.Connection(h11.CLIENT, max_incomplete_event_size=p.MAX_HEAD_BYTES)


async def forward(exchange: Exchange, request: h11.Request) -> None:
    """Send `request` and its body to the origin and its answer to the client, then return.

    The answer may come before the body is sent in full (an early 4xx): then the rest of the
    body is not read. An answer that is not HTTP is a 502 to the client when nothing of it has
    been sent yet; a client or origin idle for `idle_timeout_s` ends the exchange.
    """
    _send_up(exchange, exchange.origin.send(request))
    body = asyncio.create_task(_send_body(exchange))
    answer = asyncio.create_task(_relay_answer(exchange))
    try:
        await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done() or body.exception() is None:
            await answer
    finally:
        for task in (body, answer):
            task.cancel()
        await asyncio.gather(body, answer, return_exceptions=True)


async def _send_body(exchange: Exchange) -> None:
    reader = exchange.down[0]
    while True:
        event = exchange.client.next_event()
        if event is h11.NEED_DATA:
            exchange.client.receive_data(await _read(reader, exchange.idle_timeout_s))
        elif isinstance(event, h11.Data):
            _send_up(exchange, exchange.origin.send(h11.Data(data=event.data)))
            await exchange.up[1].drain()
        elif isinstance(event, h11.EndOfMessage):
            _send_up(exchange, exchange.origin.send(h11.EndOfMessage()))
            await exchange.up[1].drain()
            await _pass_on_the_end(exchange)
            return
        else:  # the client closed before its body ended
            raise ConnectionResetError("the client closed in the middle of its request body")


async def _pass_on_the_end(exchange: Exchange) -> None:
    """After the request: discard what the client sends (a request it pipelined, which it will
    send again on a new connection once told `Connection: close`), and when it ends its side,
    end the origin's side too, as a client connected directly would have."""
    while await exchange.down[0].read(READ_BYTES):
        pass
    if exchange.up[1].can_write_eof():
        exchange.up[1].write_eof()


async def _relay_answer(exchange: Exchange) -> None:
    try:
        await _relay_events(exchange)
    except h11.RemoteProtocolError as error:
        if exchange.client.our_state is h11.SEND_RESPONSE:
            _send_down(exchange, _bad_gateway(error))
            await exchange.down[1].drain()


async def _relay_events(exchange: Exchange) -> None:
    origin, reader = exchange.origin, exchange.up[0]
    while True:
        event = origin.next_event()
        if event is h11.NEED_DATA:
            origin.receive_data(await _read(reader, exchange.idle_timeout_s))
            continue
        if isinstance(event, h11.InformationalResponse):
            event = h11.InformationalResponse(
                status_code=event.status_code,
                headers=p.end_to_end(list(event.headers.raw_items())),
                reason=event.reason,
            )
        elif isinstance(event, h11.Response):
            event = _closing(event)
        elif isinstance(event, h11.Data):
            event = h11.Data(data=event.data)
        elif isinstance(event, h11.EndOfMessage):
            event = h11.EndOfMessage()
        else:
            raise h11.RemoteProtocolError("the origin closed before it answered")
        _send_down(exchange, exchange.client.send(event))
        await exchange.down[1].drain()
        if isinstance(event, h11.EndOfMessage):
            return


def _closing(response: h11.Response) -> h11.Response:
    """The origin's answer as the client gets it: end-to-end headers, `Connection: close`."""
    fields = p.end_to_end(list(response.headers.raw_items()))
    if any(name.lower() == b"transfer-encoding" for name, _ in fields):
        fields = [(name, value) for name, value in fields if name.lower() != b"content-length"]
    fields.append((b"Connection", b"close"))
    return h11.Response(status_code=response.status_code, headers=fields, reason=response.reason)


def _bad_gateway(error: Exception) -> bytes:
    return p.http_reply(
        502,
        "Bad Gateway",
        f"corral proxy: the origin's reply is not a valid HTTP answer: {error}\n",
    )


async def _read(reader: asyncio.StreamReader, idle_timeout_s: float) -> bytes:
    """The next bytes (b"" at the end); `TimeoutError` after `idle_timeout_s` of silence."""
    return await asyncio.wait_for(reader.read(READ_BYTES), idle_timeout_s)


def _send_up(exchange: Exchange, data: bytes | None) -> None:
    if data:
        exchange.up[1].write(data)
        exchange.count_out(len(data))


def _send_down(exchange: Exchange, data: bytes | None) -> None:
    if data:
        exchange.down[1].write(data)
        exchange.count_in(len(data))
