"""Skills over the wire: REST, the MCP tools with coderunner's texts, and `corral skills`.

The server is the shared one; the user skills it sees live in its config directory, where
these tests drop archives and remove what they added.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.skills import PUBLIC_DIR, user_dir
from tests.server.conftest import RunningServer
from tests.server.test_mcp import connect, text_of

PUBLIC = ["docx", "image-crop-rotate", "images", "pdf", "pdf-text-replace", "pptx", "xlsx"]
SKILL_MD = "---\nname: {name}\ndescription: A test skill.\n---\n\n# {name}\n\nRun it.\n"


def skill_zip(path: Path, name: str, extra: dict[str, bytes] | None = None) -> Path:
    """A skill archive with one top folder `name` holding SKILL.md and `extra` members."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/SKILL.md", SKILL_MD.format(name=name))
        for member, data in (extra or {}).items():
            archive.writestr(member, data)
    path.write_bytes(buffer.getvalue())
    return path


@pytest.fixture
def user_skills(server: RunningServer) -> Iterator[Path]:
    """The server's user skill folder, emptied of what the test added."""
    folder = user_dir(server.settings.config_dir)
    folder.mkdir(mode=0o700, exist_ok=True)
    before = set(folder.iterdir())
    yield folder
    for path in set(folder.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


# -- REST ----------------------------------------------------------------------------------


def test_the_list_names_every_shipped_skill_with_its_path_inside(server: RunningServer) -> None:
    with server.client() as http:
        listed = http.get("/v1/skills").json()
    public = [s for s in listed["skills"] if s["source"] == "public"]
    assert [s["name"] for s in public] == PUBLIC
    for skill in public:
        assert skill["location"] == f"/opt/corral/skills/public/{skill['name']}"
        assert skill["description"] and skill["problem"] is None


def test_info_and_a_file_come_back_as_they_are_on_disk(server: RunningServer) -> None:
    with server.client() as http:
        info = http.get("/v1/skills/pdf").json()
        script = http.get("/v1/skills/pdf/files/scripts/extract_text.py")
    assert info["content"] == (PUBLIC_DIR / "pdf" / "SKILL.md").read_text()
    assert script.status_code == 200
    assert script.content == (PUBLIC_DIR / "pdf" / "scripts" / "extract_text.py").read_bytes()


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/skills/nope", 404),
        ("/v1/skills/.hidden", 400),
        ("/v1/skills/pdf/files/nope.md", 404),
        ("/v1/skills/pdf/files/..%2F..%2F..%2Fetc%2Fpasswd", 400),
        ("/v1/skills/pdf/files/scripts%2F..%2F..%2Fdocx%2FSKILL.md", 400),
        ("/v1/skills/pdf/files/%2Fetc%2Fpasswd", 400),
    ],
)
def test_names_and_paths_that_escape_are_refused(
    server: RunningServer, path: str, status: int
) -> None:
    with server.client() as http:
        response = http.get(path)
    assert response.status_code == status, response.text
    assert "root:" not in response.text


def test_a_token_is_needed(server: RunningServer) -> None:
    with server.client(None) as http:
        assert http.get("/v1/skills").status_code == 401


def test_dropped_archives_are_unpacked_or_set_aside_and_never_block_the_list(
    server: RunningServer, user_skills: Path
) -> None:
    skill_zip(user_skills / "good.zip", "good-one")
    skill_zip(user_skills / "slip.zip", "slip", {"slip/../../escaped.txt": b"x"})
    with server.client() as http:
        listed = http.get("/v1/skills").json()
    user = [s["name"] for s in listed["skills"] if s["source"] == "user"]
    assert "good-one" in user and "slip" not in user
    [bad] = [item for item in listed["set_aside"] if item["name"] == "slip.zip.bad"]
    assert "skill archive refused" in bad["reason"]
    assert not (user_skills.parent / "escaped.txt").exists()
    assert [s["name"] for s in listed["skills"] if s["source"] == "public"] == PUBLIC


# -- MCP -----------------------------------------------------------------------------------


async def test_the_mcp_tools_answer_in_coderunners_words(server: RunningServer) -> None:
    async with connect(server) as client:
        listed = text_of(await client.call_tool("list_skills", {}))
        info = text_of(await client.call_tool("get_skill_info", {"skill_name": "xlsx"}))
        script = text_of(
            await client.call_tool(
                "get_skill_file", {"skill_name": "xlsx", "filename": "scripts/write_xlsx.py"}
            )
        )
        escaped = text_of(
            await client.call_tool(
                "get_skill_file", {"skill_name": "xlsx", "filename": "../pdf/SKILL.md"}
            )
        )
        unknown = text_of(await client.call_tool("get_skill_info", {"skill_name": "nope"}))
    assert listed.startswith(f"Available Skills:\n\nPublic Skills ({len(PUBLIC)}):\n")
    assert listed.endswith(
        "Use get_skill_info(skill_name) to read documentation for a specific skill."
    )
    assert info.startswith("Skill: xlsx (public)\nLocation: /opt/corral/skills/public/xlsx/\n")
    assert info.endswith((PUBLIC_DIR / "xlsx" / "SKILL.md").read_text())
    assert "File: scripts/write_xlsx.py\n" in script
    assert "Location: /opt/corral/skills/public/xlsx/scripts/write_xlsx.py\n" in script
    assert escaped.startswith("Error: ")
    assert unknown.startswith("Error: ") and "list_skills()" in unknown


async def test_a_skill_call_that_cannot_be_done_is_flagged_as_an_error(
    server: RunningServer,
) -> None:
    """One rule for every tool: isError when the tool could not do what it was asked."""
    calls = {
        "unknown skill": ("get_skill_info", {"skill_name": "nope"}),
        "unknown file": ("get_skill_file", {"skill_name": "xlsx", "filename": "nope.md"}),
        "escaping file": ("get_skill_file", {"skill_name": "xlsx", "filename": "../pdf/SKILL.md"}),
    }
    async with connect(server) as client:
        found = await client.call_tool("get_skill_info", {"skill_name": "xlsx"})
        refused = {name: await client.call_tool(*call) for name, call in calls.items()}
    assert not found.is_error
    for name, result in refused.items():
        assert result.is_error, name
        assert text_of(result).startswith("Error: "), name


# -- corral skills -----------------------------------------------------------------------------


def cli(config_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_CONFIG_DIR=str(config_dir), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "corral", "skills", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_corral_skills_path_add_and_list(tmp_path: Path) -> None:
    config = tmp_path / "config"
    shown = cli(config, "path")
    assert shown.returncode == 0 and shown.stdout.strip() == str(config / "skills")
    added = cli(config, "add", str(skill_zip(tmp_path / "mine.zip", "mine")))
    assert added.returncode == 0, added.stderr
    assert (config / "skills" / "mine" / "SKILL.md").is_file()
    assert "  - mine: A test skill." in cli(config, "list").stdout


def test_corral_skills_add_refuses_a_bad_archive_and_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config"
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/SKILL.md", SKILL_MD.format(name="bomb"))
        archive.writestr("bomb/zeros.bin", b"\0" * (50 << 20))
    (tmp_path / "bomb.zip").write_bytes(bomb.getvalue())
    refused = cli(config, "add", str(tmp_path / "bomb.zip"))
    assert refused.returncode == 1
    assert "skill archive refused" in refused.stderr
    assert list((config / "skills").iterdir()) == []
