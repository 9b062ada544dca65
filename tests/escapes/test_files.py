"""Escape attempts through the host's own file handling: the files API over REST and the MCP
file tools (writes, deletes, a link swapped in under them), and skill archives.

The host, not the sandbox, does these writes, so a mistake there is made with the server's
rights: each attempt checks the host's own files afterwards, not only the answer.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from corral.skills import user_dir
from corral.skills.archive import ArchiveRefused
from corral.tokens import load_tokens
from tests.conftest import disk_looked_at_again
from tests.escapes.battery import MIB, SECRET, Host, answers, execute, outcomes, py
from tests.waiting import until

FILES_SID = "esc-files"
SWAPS = 200  # requests made while the sandbox swaps a directory for a link, per API


@pytest.fixture(scope="module")
async def files_session(host: Host) -> AsyncIterator[str]:
    """A session of this module's own: it fills its workspace on purpose."""
    await host.service.create_session(FILES_SID)
    try:
        yield FILES_SID
    finally:
        await host.service.delete_session(FILES_SID)


@contextlib.asynccontextmanager
async def rest(host: Host) -> AsyncIterator[httpx.AsyncClient]:
    """The agent's REST client of the battery's server (async: it shares the test's loop)."""
    token = load_tokens(host.settings.config_dir, env={}).agent
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{host.server_port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    ) as client:
        yield client


@contextlib.asynccontextmanager
async def mcp(host: Host) -> AsyncIterator[Client]:
    """The agent's MCP client of the battery's server, over streamable HTTP."""
    token = load_tokens(host.settings.config_dir, env={}).agent
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(
            streamable_http_client(f"http://127.0.0.1:{host.server_port}/mcp", http_client=http)
        ) as client,
    ):
        yield client


def text_of(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


# -- a link swapped in under the files API -----------------------------------------------------

# Inside: /workspace/swap is a real directory (holding decoy.txt) and /workspace/.link a link to
# the host directory holding the secret; renameat2(RENAME_EXCHANGE) swaps the two names
# atomically, over and over, until the host creates /workspace/.stop (or 60 s pass).
SWAPPER = """
import ctypes, os, subprocess, sys
code = '''
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/workspace/swap', exist_ok=True)
open('/workspace/swap/decoy.txt', 'w').write('decoy')
if not os.path.islink('/workspace/.link'):
    os.symlink(sys.argv[1], '/workspace/.link')
open('/workspace/.swapping', 'w').close()
end = time.monotonic() + 60
while not os.path.exists('/workspace/.stop') and time.monotonic() < end:
    libc.syscall(316, -100, b'/workspace/swap', -100, b'/workspace/.link', 2)
'''
_swapper = subprocess.Popen([sys.executable, '-c', code, {target!r}], start_new_session=True)
print('swapping')
"""


@contextlib.asynccontextmanager
async def swapping(host: Host, sid: str) -> AsyncIterator[Path]:
    """The sandbox swapping /workspace/swap with a link to the secret's host directory; yields
    that host directory, which holds the secret and a file named victim.txt."""
    target = host.secret.parent
    (target / "victim.txt").write_text("victim")
    workspace = host.service.sessions.session(sid).paths.workspace
    assert (await execute(host, SWAPPER.format(target=str(target)), sid)).stdout == "swapping\n"
    try:
        await until((workspace / ".swapping").exists, "the swapper to start")
        yield target
    finally:
        (workspace / ".stop").touch()
        await py(host, SWAP_STOPPED, sid)
        for name in (".stop", ".swapping", ".link"):
            with contextlib.suppress(FileNotFoundError):
                (workspace / name).unlink()


SWAP_STOPPED = """
import json, os, shutil
_swapper.wait(30)
for path in ('/workspace/swap', '/workspace/.link'):
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
print(json.dumps('stopped'))
"""


def assert_host_directory_untouched(target: Path) -> None:
    assert sorted(p.name for p in target.iterdir()) == ["host-secret.txt", "victim.txt"]
    assert (target / "victim.txt").read_text() == "victim"
    assert SECRET in (target / "host-secret.txt").read_text()


async def test_swap_in_a_link_under_the_rest_files_api(host: Host, files_session: str) -> None:
    base = f"/v1/sessions/{files_session}/files"
    async with swapping(host, files_session) as target, rest(host) as client:
        for i in range(SWAPS):
            got = await client.get(f"{base}/content", params={"path": "swap/host-secret.txt"})
            assert got.status_code in (400, 404, 409), got.text
            assert SECRET not in got.text
            put = await client.put(
                f"{base}/content", params={"path": f"swap/planted{i}"}, content=b"p"
            )
            assert put.status_code in (201, 400, 404, 409), put.text
            gone = await client.delete(base, params={"path": "swap/victim.txt"})
            assert gone.status_code in (400, 404, 409), gone.text
            listed = await client.get(base, params={"path": "swap"})
            assert "host-secret.txt" not in listed.text
    assert_host_directory_untouched(target)


async def test_swap_in_a_link_under_the_mcp_file_tools(host: Host, files_session: str) -> None:
    async with swapping(host, files_session) as target, mcp(host) as client:
        args = {"session_id": files_session}
        for i in range(SWAPS // 2):
            read = await client.call_tool("read_file", {**args, "path": "swap/host-secret.txt"})
            assert read.is_error and SECRET not in text_of(read), text_of(read)
            await client.call_tool(
                "write_file", {**args, "path": f"swap/mcp-planted{i}", "content": "p"}
            )
            listed = await client.call_tool("list_files", {**args, "path": "swap"})
            assert "host-secret.txt" not in text_of(listed)
    assert_host_directory_untouched(target)


# -- writes and deletes the workspace limit and the workspace's edge must stop ----------------


async def test_fill_the_workspace_through_the_rest_files_api(host: Host, disk_sid: str) -> None:
    base = f"/v1/sessions/{disk_sid}/files/content"
    chunk = b"u" * (40 * MIB)
    async with rest(host) as client:
        first = await client.put(base, params={"path": "up1.bin"}, content=chunk)
        second = await client.put(base, params={"path": "up2.bin"}, content=chunk)
        # Replacing the file frees what it replaces: the same size fits again.
        again = await client.put(base, params={"path": "up1.bin"}, content=chunk)
    assert first.status_code == 201, first.text
    assert second.status_code == 507, second.text
    assert again.status_code == 201, again.text
    error = second.json()["error"]
    assert "does not fit: the workspace holds at most 64 MiB" in error["message"]
    workspace = host.service.sessions.session(disk_sid).paths.workspace
    assert not (workspace / "up2.bin").exists()
    host.service.files.delete(disk_sid, "up1.bin")


async def test_fill_the_workspace_through_the_mcp_write_file_tool(
    host: Host, disk_sid: str
) -> None:
    big = "m" * (3 * MIB)  # under MCP's 4 MiB request cap; the workspace holds 64 MiB
    written = []
    async with mcp(host) as client:
        for i in range(30):
            result = await client.call_tool(
                "write_file", {"session_id": disk_sid, "path": f"m{i}.txt", "content": big}
            )
            if result.is_error:
                break
            written.append(f"m{i}.txt")
    assert result.is_error and 12 <= len(written) < 22, (len(written), text_of(result))
    assert "does not fit: the workspace holds at most 64 MiB" in text_of(result)
    for name in written:
        host.service.files.delete(disk_sid, name)


async def test_fill_the_workspace_with_files_through_the_files_api(
    host: Host, disk_sid: str
) -> None:
    # The files limit (3000) counts what the API adds too: the kernel makes most of what is
    # left, the API is refused once the count is reached.
    await disk_looked_at_again(host.service, disk_sid)
    room = host.service.sessions.session(disk_sid).disk.room()[1]
    await py(
        host,
        "import json, os\nos.makedirs('/workspace/many', exist_ok=True)\n"
        f"for i in range({room - 50}):\n    open(f'/workspace/many/{{i}}', 'w').close()\n"
        "print(json.dumps(1))",
        disk_sid,
    )
    await disk_looked_at_again(host.service, disk_sid)
    statuses = []
    async with rest(host) as client:
        for i in range(300):
            put = await client.put(
                f"/v1/sessions/{disk_sid}/files/content",
                params={"path": f"many/api{i}"},
                content=b"",
            )
            statuses.append(put.status_code)
            if put.status_code != 201:
                break
    assert statuses[-1] == 507, statuses
    host.service.files.delete(disk_sid, "many", recursive=True)
    await disk_looked_at_again(host.service, disk_sid)
    await answers(host, disk_sid)


@pytest.mark.parametrize(
    "path", ["..", "../..", "/", "/etc", ".", "./", "swap/../..", "%2e%2e", "\x00"]
)
async def test_delete_past_the_workspace_through_the_files_api(
    host: Host, files_session: str, path: str
) -> None:
    workspace = host.service.sessions.session(files_session).paths.workspace
    (workspace / "keep.txt").write_text("kept")
    async with rest(host) as client:
        gone = await client.delete(
            f"/v1/sessions/{files_session}/files", params={"path": path, "recursive": "true"}
        )
    assert gone.status_code in (400, 404), gone.text
    assert (workspace / "keep.txt").read_text() == "kept"
    assert workspace.parent.is_dir() and any(workspace.parent.iterdir())


async def test_delete_the_host_directory_behind_a_workspace_link(
    host: Host, files_session: str
) -> None:
    target = host.secret.parent
    (target / "victim.txt").write_text("victim")
    workspace = host.service.sessions.session(files_session).paths.workspace
    await py(
        host,
        f"import json, os\nos.symlink({str(target)!r}, '/workspace/hostdir')\nprint(json.dumps(1))",
        files_session,
    )
    async with rest(host) as client:
        inner = await client.delete(
            f"/v1/sessions/{files_session}/files", params={"path": "hostdir/victim.txt"}
        )
        link = await client.delete(
            f"/v1/sessions/{files_session}/files", params={"path": "hostdir", "recursive": "true"}
        )
    assert inner.status_code == 400, inner.text
    assert link.status_code == 204, link.text  # the link itself goes, not what it points at
    assert not os.path.lexists(workspace / "hostdir")
    assert_host_directory_untouched(target)


# -- skills ------------------------------------------------------------------------------------


async def test_plant_a_skill_through_the_read_only_skills_mount(host: Host) -> None:
    got = await outcomes(
        host,
        {
            "user skills": "open('/opt/corral/skills/user/planted.md', 'w')",
            "public skills": "open('/opt/corral/skills/public/planted.md', 'w')",
            "replace a shipped skill": (
                "os.rename('/opt/corral/skills/public/pdf/SKILL.md', "
                "'/opt/corral/skills/public/pdf/x')"
            ),
        },
    )
    assert got == {
        "user skills": "EROFS",
        "public skills": "EROFS",
        "replace a shipped skill": "EROFS",
    }


SKILL_MD = b"---\nname: evil\ndescription: a hostile archive\n---\nbody\n"


def zip_of(members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, content in members:
            archive.writestr(info, content)
    return data.getvalue()


def link_member(name: str) -> zipfile.ZipInfo:
    """A member whose unix mode says symbolic link (its content is the link's target)."""
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o120777 << 16
    info.create_system = 3  # unix, so the mode bits count
    return info


def hostile_archives(secret: Path) -> dict[str, bytes]:
    """Archives an operator might be handed: each must be refused whole."""
    bomb = zipfile.ZipInfo("evil/bomb.bin")
    bomb.compress_type = zipfile.ZIP_DEFLATED
    return {
        "dotdot": zip_of([("evil/SKILL.md", SKILL_MD), ("evil/../../../escaped.txt", b"x")]),
        "absolute": zip_of([("evil/SKILL.md", SKILL_MD), ("/tmp/escaped-abs.txt", b"x")]),
        "backslash": zip_of([("evil/SKILL.md", SKILL_MD), ("evil\\..\\..\\escaped.txt", b"x")]),
        "symlink": zip_of(
            [("evil/SKILL.md", SKILL_MD), (link_member("evil/secret"), str(secret).encode())]
        ),
        "bomb": zip_of([("evil/SKILL.md", SKILL_MD), (bomb, b"\0" * (64 * MIB))]),
        "not a zip": b"PK\x03\x04 this is not an archive",
    }


def tree_of(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


async def test_unpack_hostile_skill_archives(host: Host) -> None:
    base = host.settings.config_dir.parent
    user_dir(host.settings.config_dir).mkdir(parents=True, exist_ok=True)
    before = tree_of(base)
    refused = {}
    for name, data in hostile_archives(host.secret).items():
        with pytest.raises(ArchiveRefused) as caught:
            await host.service.skills.add(f"{name}.zip", data)
        refused[name] = str(caught.value)
    assert all(refused.values()), refused
    assert tree_of(base) == before
    assert not Path("/tmp/escaped-abs.txt").exists()
    listed = await py(
        host, "import json, os\nprint(json.dumps(os.listdir('/opt/corral/skills/user')))"
    )
    assert "evil" not in listed


async def test_drop_a_hostile_archive_in_the_skills_folder(host: Host) -> None:
    folder = user_dir(host.settings.config_dir)
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "dropped.zip"
    archive.write_bytes(hostile_archives(host.secret)["dotdot"])
    before = tree_of(host.settings.config_dir.parent)
    listing = await host.service.skills.list()
    assert "evil" not in {skill.name for skill in listing.skills}
    assert [aside.name for aside in listing.set_aside] == ["dropped.zip.bad"]
    after = tree_of(host.settings.config_dir.parent)
    assert not any("escaped" in name for name in after - before), after - before


@pytest.mark.parametrize(
    "filename",
    ["../../../secret/host-secret.txt", "..%2F..%2Fsecret", "/etc/passwd", "SKILL.md/../../x"],
)
async def test_read_a_host_file_through_a_skill_file_path(host: Host, filename: str) -> None:
    async with rest(host) as client:
        got = await client.get(f"/v1/skills/pdf/files/{filename}")
    assert got.status_code in (400, 404), got.text
    assert SECRET not in got.text and "root:" not in got.text
    async with mcp(host) as client:
        result = await client.call_tool(
            "get_skill_file", {"skill_name": "pdf", "filename": filename}
        )
    assert SECRET not in text_of(result) and "root:" not in text_of(result)
    assert "Error" in text_of(result) or result.is_error, text_of(result)
