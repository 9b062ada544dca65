"""The agent bridge end to end: real unix sockets, a fake SSH agent, the shim as a process.

The fake agent answers the SSH agent protocol's REQUEST_IDENTITIES with an empty
IDENTITIES_ANSWER, which is enough for `ssh-add -l` to say the agent has no identities. Every
refusal is checked the same way: the client reads end-of-file with not one byte before it,
and `on_use` has the reason, never the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral import bridge_shim
from corral.bridge import (
    BRIDGE_SERVICES,
    MAX_HANDSHAKE_BYTES,
    AgentBridge,
    check_handshake,
    handshake,
    new_token,
)
from corral.errors import SandboxError
from tests.waiting import until

IO_S = 10.0
TIMEOUT_S = 0.5  # the handshake deadline in these tests (5 s in production)
SSH_AGENT = "ssh-agent"

# The SSH agent protocol (draft-miller-ssh-agent): uint32 length, then a type byte and body.
REQUEST_IDENTITIES, IDENTITIES_ANSWER, AGENT_FAILURE = 11, 12, 5
REQUEST = struct.pack(">IB", 1, REQUEST_IDENTITIES)
NO_IDENTITIES = struct.pack(">IBI", 5, IDENTITIES_ANSWER, 0)
FAILURE = struct.pack(">IB", 1, AGENT_FAILURE)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short private directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class FakeAgent:
    """A unix socket server speaking just enough of the agent protocol: it holds no keys."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server: asyncio.Server | None = None
        self.accepted = 0
        self.open = 0

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        try:
            while True:
                length = int.from_bytes(await reader.readexactly(4), "big")
                body = await reader.readexactly(length)
                asked_identities = body[:1] == bytes([REQUEST_IDENTITIES])
                writer.write(NO_IDENTITIES if asked_identities else FAILURE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def agent(sock_dir: Path) -> AsyncIterator[FakeAgent]:
    fake = FakeAgent(sock_dir / "agent.sock")
    await fake.start()
    try:
        yield fake
    finally:
        await until(lambda: fake.open == 0, "agent connections closed")
        await fake.close()


@dataclass
class Bridge:
    """An AgentBridge under test with what it reported."""

    bridge: AgentBridge
    token: str
    uses: list[tuple[str, str]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.bridge.socket_path

    def outcomes(self) -> list[str]:
        return [outcome for _, outcome in self.uses]


MakeBridge = Callable[..., Awaitable[Bridge]]


@pytest.fixture
async def make_bridge(sock_dir: Path, agent: FakeAgent) -> AsyncIterator[MakeBridge]:
    made: list[Bridge] = []

    async def make(
        services: dict[str, Path] | None = None,
        name: str = "bridge.sock",
        handshake_timeout_s: float = TIMEOUT_S,
        max_connections: int = 32,
    ) -> Bridge:
        token = new_token()
        uses: list[tuple[str, str]] = []
        bridge = AgentBridge(
            sock_dir / name,
            token,
            {SSH_AGENT: agent.path} if services is None else services,
            lambda service, outcome: uses.append((service, outcome)),
            handshake_timeout_s,
            max_connections=max_connections,
        )
        await bridge.start()
        made.append(Bridge(bridge, token, uses))
        return made[-1]

    try:
        yield make
    finally:
        for entry in made:
            await entry.bridge.close()


# -- helpers ---------------------------------------------------------------------------------


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def connected(path: Path | str) -> AsyncIterator[Stream]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def ask_identities(stream: Stream) -> bytes:
    await send(stream[1], REQUEST)
    return await asyncio.wait_for(stream[0].readexactly(len(NO_IDENTITIES)), IO_S)


async def read_to_eof(reader: asyncio.StreamReader, timeout_s: float = IO_S) -> bytes:
    """Everything until the far side closes. A reset counts as a close, and so does a broken
    pipe: a write the bridge cut off ends the connection's reader with that error."""
    data = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), timeout_s):
            data += chunk
    return bytes(data)


async def refused(b: Bridge, first: bytes) -> tuple[bytes, str]:
    """Send `first`, read to the bridge's close: (every byte it sent back, its last report)."""
    async with connected(b.path) as (reader, writer):
        with contextlib.suppress(ConnectionError):
            await send(writer, first)
        answer = await read_to_eof(reader)
    await until(lambda: b.bridge.active == 0, "bridge connection closed")
    assert b.token not in repr(b.uses)
    return answer, b.uses[-1][1]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- the handshake ---------------------------------------------------------------------------


def test_handshake_line_format() -> None:
    token = new_token()
    assert len(token) == 64 and int(token, 16) >= 0
    assert handshake(token, SSH_AGENT) == f"corral-bridge 1 {token} ssh-agent\n".encode()
    assert BRIDGE_SERVICES == (SSH_AGENT,)
    assert new_token() != token


@pytest.mark.parametrize("token", ["", "a b", "line\nbreak", "tab\there", "caf\u00e9", "x" * 300])
def test_handshake_refuses_words_that_would_break_the_line(token: str) -> None:
    with pytest.raises(ValueError):
        handshake(token, SSH_AGENT)


def test_constructor_refuses_an_unlisted_service_and_a_bad_token(sock_dir: Path) -> None:
    with pytest.raises(ValueError):
        AgentBridge(sock_dir / "b", new_token(), {"gpg-agent": sock_dir / "g"}, None)
    with pytest.raises(ValueError):
        AgentBridge(sock_dir / "b", "two words", {}, None)


def test_check_handshake_compares_the_token_before_the_service() -> None:
    token = new_token().encode()
    names = {b"ssh-agent": SSH_AGENT}
    good = b"corral-bridge 1 " + token + b" ssh-agent\n"
    assert check_handshake(good, token, names) == (SSH_AGENT, "relayed")
    wrong = b"corral-bridge 1 " + b"0" * 64 + b" gpg-agent\n"
    assert check_handshake(wrong, token, names) == ("?", "refused: wrong token")


# -- relaying --------------------------------------------------------------------------------


async def test_correct_token_is_relayed_to_the_agent(
    make_bridge: MakeBridge, agent: FakeAgent
) -> None:
    b = await make_bridge()
    async with connected(b.path) as stream:
        await send(stream[1], handshake(b.token, SSH_AGENT))
        assert await ask_identities(stream) == NO_IDENTITIES
        assert await ask_identities(stream) == NO_IDENTITIES  # the relay stays open
    assert b.uses == [(SSH_AGENT, "relayed")]
    assert agent.accepted == 1


async def test_bytes_sent_with_the_handshake_reach_the_agent(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    async with connected(b.path) as (reader, writer):
        await send(writer, handshake(b.token, SSH_AGENT) + REQUEST)
        assert await asyncio.wait_for(reader.readexactly(len(NO_IDENTITIES)), IO_S) == (
            NO_IDENTITIES
        )


async def test_burst_sent_with_the_handshake_is_relayed_in_full(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    count = 20_000  # 100 kB of requests, 180 kB of answers: well past every buffer's mark
    async with connected(b.path) as (reader, writer):
        burst = send(writer, handshake(b.token, SSH_AGENT) + REQUEST * count)
        answers = asyncio.wait_for(reader.readexactly(len(NO_IDENTITIES) * count), IO_S)
        _, received = await asyncio.gather(burst, answers)
    assert received == NO_IDENTITIES * count


async def test_handshake_split_across_writes_still_works(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    line = handshake(b.token, SSH_AGENT)
    async with connected(b.path) as stream:
        for start in range(0, len(line), 7):
            await send(stream[1], line[start : start + 7])
            await asyncio.sleep(0.01)
        assert await ask_identities(stream) == NO_IDENTITIES
    assert b.outcomes() == ["relayed"]


async def test_socket_is_private_to_its_owner(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    mode = os.lstat(b.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


# -- refusals: closed without a reply, and reported -------------------------------------------


async def test_silence_is_closed_at_the_deadline_without_a_reply(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    started = time.monotonic()
    async with connected(b.path) as (reader, _):
        answer = await read_to_eof(reader)
    elapsed = time.monotonic() - started
    assert answer == b""
    assert TIMEOUT_S - 0.05 <= elapsed < IO_S / 2
    assert b.uses == [("?", "refused: timeout")]


async def test_trickled_handshake_is_cut_at_the_deadline(make_bridge: MakeBridge) -> None:
    b = await make_bridge()
    started = time.monotonic()
    async with connected(b.path) as (reader, writer):
        for _ in range(20):  # one byte every 0.1 s: the deadline covers the whole line
            if reader.at_eof():
                break
            with contextlib.suppress(ConnectionError):
                await send(writer, b"c")
            await asyncio.sleep(0.1)
        answer = await read_to_eof(reader)
    assert answer == b""
    assert time.monotonic() - started < 4 * TIMEOUT_S + 1.0
    assert b.uses == [("?", "refused: timeout")]


async def test_wrong_token_of_the_right_length_is_refused(
    make_bridge: MakeBridge, agent: FakeAgent
) -> None:
    b = await make_bridge()
    wrong = new_token()
    answer, outcome = await refused(b, handshake(wrong, SSH_AGENT) + REQUEST)
    assert (answer, outcome) == (b"", "refused: wrong token")
    assert b.uses == [(SSH_AGENT, "refused: wrong token")]
    assert agent.accepted == 0


@pytest.mark.parametrize("change", ["shorter", "longer", "upper case", "empty-ish"])
async def test_token_of_another_shape_is_refused(make_bridge: MakeBridge, change: str) -> None:
    b = await make_bridge()
    token = {
        "shorter": b.token[:-1],
        "longer": b.token + "0",
        "upper case": b.token.upper(),
        "empty-ish": "-",
    }[change]
    assert token != b.token
    assert await refused(b, handshake(token, SSH_AGENT)) == (b"", "refused: wrong token")


async def test_unknown_service_is_refused(make_bridge: MakeBridge, agent: FakeAgent) -> None:
    b = await make_bridge()
    answer, outcome = await refused(b, handshake(b.token, "gpg-agent"))
    assert (answer, outcome) == (b"", "refused: unknown service")
    assert b.uses == [("?", "refused: unknown service")]
    assert agent.accepted == 0


async def test_service_not_enabled_on_this_bridge_is_refused(make_bridge: MakeBridge) -> None:
    b = await make_bridge(services={})
    assert await refused(b, handshake(b.token, SSH_AGENT)) == (b"", "refused: unknown service")


@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        (b"hello\n", "refused: malformed handshake"),
        (b"\xff\xfe\x00\x01\n", "refused: malformed handshake"),
        (b"SSH-2.0-OpenSSH\r\n", "refused: malformed handshake"),
        (b"corral-bridge 2 TOKEN ssh-agent\n", "refused: malformed handshake"),
        (b"corral-bridge 1 TOKEN ssh-agent extra\n", "refused: malformed handshake"),
        (b"corral-bridge  1 TOKEN ssh-agent\n", "refused: malformed handshake"),
        (b"x" * 1000, "refused: handshake too long"),
        (b"x" * 1000 + b"\n", "refused: handshake too long"),
        (b"x" * MAX_HANDSHAKE_BYTES + b"\n", "refused: handshake too long"),
        (b"corral-bridge 1 TOKEN", "refused: closed before the handshake"),
        (b"", "refused: closed before the handshake"),
    ],
)
async def test_garbage_is_refused_without_a_reply(
    make_bridge: MakeBridge, agent: FakeAgent, first: bytes, outcome: str
) -> None:
    b = await make_bridge()
    first = first.replace(b"TOKEN", b.token.encode())
    async with connected(b.path) as (reader, writer):
        with contextlib.suppress(ConnectionError):
            await send(writer, first)
            if outcome.endswith("closed before the handshake"):
                writer.write_eof()
        answer = await read_to_eof(reader)
    await until(lambda: b.bridge.active == 0, "bridge connection closed")
    assert answer == b""
    assert b.uses == [("?", outcome)]
    assert agent.accepted == 0


async def test_missing_agent_socket_closes_and_is_reported(
    make_bridge: MakeBridge, sock_dir: Path
) -> None:
    b = await make_bridge(services={SSH_AGENT: sock_dir / "no-agent.sock"})
    answer, outcome = await refused(b, handshake(b.token, SSH_AGENT) + REQUEST)
    assert answer == b""
    assert outcome.startswith("refused: agent unreachable")
    assert b.uses[0][0] == SSH_AGENT


async def test_connections_past_the_cap_are_refused(make_bridge: MakeBridge) -> None:
    b = await make_bridge(max_connections=2, handshake_timeout_s=IO_S)
    async with connected(b.path), connected(b.path):
        await until(lambda: b.bridge.active == 2, "two connections waiting")
        async with connected(b.path) as (reader, writer):
            with contextlib.suppress(ConnectionError):
                await send(writer, handshake(b.token, SSH_AGENT))
            assert await read_to_eof(reader, timeout_s=IO_S / 2) == b""
        assert b.uses == [("?", "refused: too many connections")]


# -- the socket's life -----------------------------------------------------------------------


async def test_close_cuts_open_relays_and_removes_the_socket(
    make_bridge: MakeBridge, agent: FakeAgent
) -> None:
    b = await make_bridge()
    async with connected(b.path) as relayed, connected(b.path) as waiting:
        await send(relayed[1], handshake(b.token, SSH_AGENT))
        assert await ask_identities(relayed) == NO_IDENTITIES
        await until(lambda: b.bridge.active == 2, "both connections open")
        await b.bridge.close()
        assert await read_to_eof(relayed[0]) == b""
        assert await read_to_eof(waiting[0]) == b""
    assert b.bridge.active == 0
    await until(lambda: agent.open == 0, "the agent side closed too")
    assert not b.path.exists()
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(str(b.path))


async def test_start_refuses_a_path_that_is_not_a_socket(sock_dir: Path) -> None:
    path = sock_dir / "taken"
    path.write_text("keep me")
    bridge = AgentBridge(path, new_token(), {}, None)
    with pytest.raises(SandboxError):
        await bridge.start()
    assert path.read_text() == "keep me"
    os.unlink(path)
    os.symlink(sock_dir / "elsewhere", path)
    with pytest.raises(SandboxError):
        await bridge.start()
    assert path.is_symlink()


async def test_start_replaces_a_stale_socket(make_bridge: MakeBridge, sock_dir: Path) -> None:
    # A server that died without cleaning up leaves its socket behind.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(sock_dir / "stale.sock"))
    b = await make_bridge(name="stale.sock")
    async with connected(b.path) as stream:
        await send(stream[1], handshake(b.token, SSH_AGENT))
        assert await ask_identities(stream) == NO_IDENTITIES


async def test_start_needs_the_parent_directory(sock_dir: Path) -> None:
    bridge = AgentBridge(sock_dir / "missing" / "b.sock", new_token(), {}, None)
    with pytest.raises(SandboxError):
        await bridge.start()


async def test_many_connections_leave_no_open_descriptors(
    make_bridge: MakeBridge, agent: FakeAgent
) -> None:
    b = await make_bridge()
    baseline = open_fds()
    for round_ in range(50):
        async with connected(b.path) as stream:
            if round_ % 2:
                await send(stream[1], handshake(b.token, SSH_AGENT))
                assert await ask_identities(stream) == NO_IDENTITIES
            else:
                await send(stream[1], handshake(new_token(), SSH_AGENT))
                assert await read_to_eof(stream[0]) == b""
    await until(lambda: b.bridge.active == 0 and agent.open == 0, "every relay closed")
    await until(lambda: open_fds() == baseline, f"fds back to {baseline}")
    assert b.outcomes().count("relayed") == 25
    assert b.outcomes().count("refused: wrong token") == 25
    assert agent.accepted == 25


# -- the in-sandbox shim, as its own process --------------------------------------------------


@dataclass
class Shim:
    process: asyncio.subprocess.Process
    listen_path: Path


StartShim = Callable[[Path, str], Awaitable[Shim]]


@pytest.fixture
async def start_shim(sock_dir: Path) -> AsyncIterator[StartShim]:
    started: list[Shim] = []

    async def start(host_socket: Path, token: str) -> Shim:
        token_file = sock_dir / f"token-{len(started)}"
        token_file.write_text(token + "\n")
        listen_path = sock_dir / f"shim-{len(started)}.sock"
        # -I -S: no site-packages and no script directory on the path, so nothing of corral
        # can be imported; the shim must stand on the standard library alone.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(Path(bridge_shim.__file__)),
            str(host_socket),
            str(token_file),
            str(listen_path),
            stdin=asyncio.subprocess.DEVNULL,
        )
        shim = Shim(process, listen_path)
        started.append(shim)
        await until(
            lambda: listen_path.exists() or process.returncode is not None, "shim listening"
        )
        assert process.returncode is None, "the shim exited during start"
        return shim

    try:
        yield start
    finally:
        for shim in started:
            if shim.process.returncode is None:
                shim.process.terminate()
            await asyncio.wait_for(shim.process.wait(), IO_S)


async def test_shim_relays_the_agent_protocol(
    make_bridge: MakeBridge, start_shim: StartShim
) -> None:
    b = await make_bridge()
    shim = await start_shim(b.path, b.token)
    mode = os.lstat(shim.listen_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    for _ in range(3):
        async with connected(shim.listen_path) as stream:
            assert await ask_identities(stream) == NO_IDENTITIES
            assert await ask_identities(stream) == NO_IDENTITIES
    await until(lambda: len(b.uses) == 3, "three uses reported")
    assert b.uses == [(SSH_AGENT, "relayed")] * 3


@pytest.mark.skipif(shutil.which("ssh-add") is None, reason="ssh-add (openssh-client) missing")
async def test_ssh_add_through_the_shim_sees_an_empty_agent(
    make_bridge: MakeBridge, start_shim: StartShim
) -> None:
    b = await make_bridge()
    shim = await start_shim(b.path, b.token)
    process = await asyncio.create_subprocess_exec(
        "ssh-add",
        "-l",
        env={"SSH_AUTH_SOCK": str(shim.listen_path), "PATH": os.environ.get("PATH", "")},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), IO_S)
    assert "The agent has no identities." in output.decode(), output
    assert process.returncode == 1  # ssh-add -l: 1 means an empty agent
    assert b.outcomes() == ["relayed"]


async def test_shim_with_a_wrong_token_is_contained_and_reported(
    make_bridge: MakeBridge,
    agent: FakeAgent,
    start_shim: StartShim,
) -> None:
    b = await make_bridge()
    shim = await start_shim(b.path, new_token())
    async with connected(shim.listen_path) as (reader, writer):
        with contextlib.suppress(ConnectionError):
            await send(writer, REQUEST)
        assert await read_to_eof(reader) == b""
    await until(lambda: len(b.uses) == 1, "the refusal reported")
    assert b.uses == [(SSH_AGENT, "refused: wrong token")]
    assert agent.accepted == 0
    assert shim.process.returncode is None  # the shim keeps serving


async def test_shim_without_a_bridge_closes_its_client(
    sock_dir: Path, start_shim: StartShim
) -> None:
    shim = await start_shim(sock_dir / "no-bridge.sock", new_token())
    async with connected(shim.listen_path) as (reader, writer):
        with contextlib.suppress(ConnectionError):
            await send(writer, REQUEST)
        assert await read_to_eof(reader) == b""
    assert shim.process.returncode is None
