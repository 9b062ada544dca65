"""Project mounts in real sandboxes: real git repositories on the host, real kernels inside.

Each test builds its own project in tmp_path (a git repository with a submodule and the files
the host trusts), configures it as the operator would (`mounts`, `protected_files`), plants
from inside a real session what an attacker would, and checks the host afterwards: a
read-write mount is an overlay whose changes reach the host through one filter, as they
happen, and what the host would run or trust never does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from corral.config import Settings
from corral.errors import Conflict, InvalidInput, MountNotFound
from corral.kernels.projects import MountBusy
from corral.mounts import configured_mounts
from corral.server.operation import wire
from corral.server.schemas import AuditPageModel
from corral.service import Service
from tests.server.conftest import free_port
from tests.snippets import git as run_git
from tests.snippets import snapshot
from tests.waiting import until

EXEC_S = 30.0
EXTRA = "notes/trusted.txt"  # an operator's extra protected name (`--protect`)
# Trusted files the host project has before the session (a new `.envrc` is the sandbox's).
TRUSTED = (
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".mcp.json",
    ".vscode/settings.json",
)
MARK = "/tmp/corral-fsmonitor-ran"  # what a planted fsmonitor command would create
P = "/workspace/proj"

Git = Callable[..., str]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """tmp_path by its real name: a mount must be named without links."""
    return tmp_path.resolve()


@pytest.fixture
def git() -> Git:
    """`git(cwd, *args)` -> stdout: the real git, with no configuration but the test's."""
    return run_git


@pytest.fixture
def repo(base: Path, git: Git) -> Path:
    """A project: a repository with a file, a submodule 'lib', and the trusted files."""
    lib = base / "lib-origin"
    lib.mkdir()
    git(lib, "init", "-q")
    (lib / "lib.txt").write_text("lib\n")
    git(lib, "add", ".")
    git(lib, "commit", "-qm", "lib")
    proj = base / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    (proj / "src").mkdir()
    (proj / "src" / "main.py").write_text("print('hi')\n")
    git(proj, "add", ".")
    git(proj, "commit", "-qm", "start")
    git(proj, "submodule", "add", "-q", str(lib), "lib")
    git(proj, "commit", "-qm", "add lib")
    for rel in (*TRUSTED, EXTRA):
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(f"host {rel}\n")
    return proj


@pytest.fixture
def fake_ssh(base: Path) -> Path:
    """A host secret, like ~/.ssh/id_ed25519, that no sandbox may ever read."""
    path = base / "home" / ".ssh" / "id_ed25519"
    path.parent.mkdir(parents=True)
    path.write_text("FAKE-PRIVATE-KEY-c0ffee\n")
    return path


def with_mounts(settings: Settings, mounts: str, **changes: object) -> Settings:
    return replace(settings, mounts=mounts, protected_files=EXTRA, **changes)  # type: ignore[arg-type]


async def run(service: Service, sid: str, code: str, language: str = "python") -> str:
    """Run `code` (Python with `os` imported, or bash); its stdout, once it succeeded."""
    if language == "python":
        code = f"import os\n{code}"
    result = await service.executions.run(code, session_id=sid, language=language, timeout_s=EXEC_S)
    assert result.status == "ok", result.text()
    return result.stdout


async def outcomes(service: Service, sid: str, ops: dict[str, str]) -> dict[str, str]:
    """Run each Python expression in the sandbox: "ok", or the errno name it failed with."""
    calls = ", ".join(f"{label!r}: _try(lambda: {expr})" for label, expr in ops.items())
    code = (
        "import errno, json, os\n"
        "def _try(f):\n"
        "    try:\n"
        "        f()\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        f"print(json.dumps({{{calls}}}))\n"
    )
    result: dict[str, str] = json.loads(await run(service, sid, code))
    return result


async def reported(service: Service, sid: str) -> list[str]:
    """Every name in the session's "protected" audit entries, oldest first."""
    entries = wire(AuditPageModel, await service.audit.page(kind="protected", session=sid))[
        "entries"
    ]
    return [name for entry in reversed(entries) for name in entry["detail"]["names"]]


def layers_left(settings: Settings, sid: str) -> list[Path]:
    return list((settings.sessions_dir / sid / "overlay").rglob("*"))


# -- read-only and read-write ------------------------------------------------------------------


async def test_a_read_only_mount_is_visible_and_refuses_writes(
    settings: Settings, repo: Path
) -> None:
    before = snapshot(repo)
    async with Service(with_mounts(settings, f"proj={repo}:ro")) as service:
        await service.create_session("ro", mounts=["proj"])
        seen = await run(service, "ro", f"print(open('{P}/src/main.py').read(), end='')")
        assert seen == "print('hi')\n"
        refused = await outcomes(
            service,
            "ro",
            {
                "write": f"open('{P}/src/main.py', 'a')",
                "create": f"open('{P}/new.txt', 'w')",
                "mkdir": f"os.mkdir('{P}/d')",
                "unlink": f"os.unlink('{P}/src/main.py')",
                "git config": f"open('{P}/.git/config', 'a')",
            },
        )
        assert set(refused.values()) == {"EROFS"}, refused
        assert service.get_session("ro").mounts == ("proj",)
    assert snapshot(repo) == before


async def test_what_a_session_writes_reaches_the_host_while_it_runs(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("rw", mounts=["proj"])
        await run(
            service,
            "rw",
            f"open('{P}/src/main.py', 'w').write('changed\\n')\n"
            f"os.makedirs('{P}/out/deep')\n"
            f"open('{P}/out/deep/result.txt', 'w').write('made inside\\n')\n"
            f"os.rename('{P}/src/main.py', '{P}/src/renamed.py')",
        )
        await until(lambda: (repo / "out/deep/result.txt").exists(), "the new file on the host")
        await until(lambda: not (repo / "src/main.py").exists(), "the rename on the host")
        assert (repo / "src" / "renamed.py").read_text() == "changed\n"
        assert (repo / "out" / "deep" / "result.txt").read_text() == "made inside\n"
        await run(service, "rw", f"rm -r {P}/out", language="bash")
        await until(lambda: not (repo / "out").exists(), "the deletion on the host")
        await service.stop_session("rw")
        assert await reported(service, "rw") == []  # ordinary files are not trusted ones
    assert layers_left(settings, "rw") == []


async def test_the_last_changes_are_applied_when_the_session_stops(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("last", mounts=["proj"])
        await run(service, "last", f"echo last > {P}/last.txt", language="bash")
        await service.stop_session("last")  # at once: the stop's own pass applies it
        assert (repo / "last.txt").read_text() == "last\n"


async def test_layers_a_dead_server_left_are_applied_at_the_next_start(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("crash", mounts=["proj"])
        await service.stop_session("crash")
        upper = settings.sessions_dir / "crash" / "overlay" / "proj" / "upper"
        (upper / ".git").mkdir(parents=True)
        (upper / "left.txt").write_text("left by the sandbox\n")
        (upper / ".git" / "config").write_text("[core]\n\tfsmonitor = touch /tmp/x\n")
        await run(service, "crash", "print(1)")
        assert (repo / "left.txt").read_text() == "left by the sandbox\n"
        assert ".git/config" in await reported(service, "crash")
        assert b"fsmonitor" not in (repo / ".git" / "config").read_bytes()


# -- git --------------------------------------------------------------------------------------


async def test_git_commits_inside_reach_the_host_and_its_config_and_hooks_do_not(
    settings: Settings, repo: Path, git: Git
) -> None:
    config = (repo / ".git" / "config").read_bytes()
    hooks = snapshot(repo / ".git" / "hooks")
    status = git(repo, "status", "--porcelain")
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("hooks", mounts=["proj"])
        hook = f"{P}/.git/hooks/pre-commit"
        await run(
            service,
            "hooks",
            f"open('{hook}', 'w').write('#!/bin/sh\\necho ran > {P}/hook-ran\\n')\n"
            f"os.chmod('{hook}', 0o755)",
        )
        out = await run(
            service,
            "hooks",
            f"cd {P} && git config core.fsmonitor 'touch {MARK}'"
            " && git config --unset core.fsmonitor"
            " && echo inside > inside.txt && git add inside.txt && "
            "git -c user.email=a@b -c user.name=a commit -qm 'made inside' && echo committed",
            language="bash",
        )
        assert out.strip().endswith("committed"), out
        await service.stop_session("hooks")
        names = await reported(service, "hooks")
    assert ".git/hooks/pre-commit" in names and ".git/config" in names, names
    assert git(repo, "log", "-1", "--format=%s").strip() == "made inside"
    assert git(repo, "show", "HEAD:inside.txt") == "inside\n"
    after = git(repo, "status", "--porcelain").splitlines()
    assert sorted(after) == sorted([*status.splitlines(), "?? hook-ran"])  # the hook ran inside
    assert (repo / ".git" / "config").read_bytes() == config
    assert snapshot(repo / ".git" / "hooks") == hooks


PLANTS = {
    # The cases: each makes a host `git status` (or the next agent or editor start)
    # run a command, if it reached the host.
    "commondir": (
        "mkdir -p rt-common && printf '[core]\\n\\tfsmonitor = touch {mark}\\n' > rt-common/config"
        " && printf '../rt-common\\n' > .git/commondir"
    ),
    "config.worktree": "ln -s ../rt-common/config .git/config.worktree",
    "modules": "mkdir -p .git/modules/x/hooks && echo '[core]' > .git/modules/x/config"
    " && echo '#!/bin/sh' > .git/modules/x/hooks/post-checkout",
    "worktrees": "mkdir -p .git/worktrees/w && echo ../.. > .git/worktrees/w/commondir",
    "nested": "git init -q sub"
    " && printf '[core]\\n\\tfsmonitor = touch {mark}\\n' >> sub/.git/config"
    " && printf '#!/bin/sh\\ntouch {mark}\\n' > sub/.git/hooks/pre-commit"
    " && chmod 755 sub/.git/hooks/pre-commit",
    "deeper": "git init -q sub/deep",
    "git file": "mkdir -p other && echo 'gitdir: /tmp/elsewhere' > other/.git",
    "claude": "mkdir -p .claude && printf '%s' "
    '\'{{"hooks": {{"SessionStart": [{{"hooks": [{{"type": "command", '
    '"command": "touch {mark}"}}]}}]}}}}\' > .claude/settings.local.json',
    "vscode": 'printf \'%s\' \'{{"tasks": [{{"runOptions": {{"runOn": "folderOpen"}}}}]}}\''
    " > .vscode/tasks.json",
    "envrc": "echo 'touch {mark}' > .envrc",
}


async def test_no_trusted_file_planted_inside_reaches_the_host(
    settings: Settings, repo: Path, git: Git
) -> None:
    before = snapshot(repo / ".git")
    trusted = {rel: (repo / rel).read_bytes() for rel in (*TRUSTED, EXTRA)}
    script = " && ".join(f"( {plant.format(mark=MARK)} )" for plant in PLANTS.values())
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("plant", mounts=["proj"])
        planted = await service.executions.run(
            f"cd {P} && {script} && echo planted", session_id="plant", language="bash"
        )
        assert planted.stdout.endswith("planted\n"), planted.text()
        expected = {
            ".git/commondir",
            ".git/config.worktree",
            ".git/modules/x",
            ".git/worktrees",
            "sub/.git/config",
            "sub/.git/hooks",
            "sub/deep/.git/config",
            "other/.git",
            ".claude/settings.local.json",
            ".vscode/tasks.json",
            ".envrc",
        }
        # Reported while the session runs, not at its stop.
        await until(
            lambda: _reported_now(service, "plant", expected), "the reports, as they happen"
        )
        result = await service.executions.run("print('next')", session_id="plant")
        told = f"{planted.message} {result.message}"  # whichever result came after a report
        assert "kept from the host folder of mount 'proj'" in told, told
        await service.stop_session("plant")
    assert snapshot(repo / ".git") == before
    assert {rel: (repo / rel).read_bytes() for rel in (*TRUSTED, EXTRA)} == trusted
    for rel in (".envrc", ".claude/settings.local.json", ".vscode/tasks.json", "other/.git"):
        assert not (repo / rel).exists() or (repo / rel).read_bytes() == trusted.get(rel), rel
    assert not (repo / "sub" / ".git" / "config").exists()
    assert not (repo / "sub" / ".git" / "hooks").exists()
    assert (repo / "rt-common" / "config").exists()  # an ordinary folder: it does arrive
    git(repo, "status")
    git(repo / "sub", "status")
    assert not Path(MARK).exists()  # no planted command ran on the host


async def _reported_now(service: Service, sid: str, expected: set[str]) -> bool:
    return expected <= set(await reported(service, sid))


async def test_deleting_a_folder_that_holds_a_repository_is_kept_from_the_host(
    settings: Settings, repo: Path, git: Git
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("rmrf", mounts=["proj"])
        await run(service, "rmrf", f"rm -rf {P}/lib {P}/src", language="bash")
        await service.stop_session("rmrf")
        names = await reported(service, "rmrf")
    assert names == ["lib"]
    assert (repo / "lib" / ".git").is_file() and (repo / "lib" / "lib.txt").exists()
    assert not (repo / "src").exists()  # an ordinary folder: deleted on the host too
    assert git(repo / "lib", "log", "-1", "--format=%s").strip() == "lib"


async def test_a_trusted_file_made_and_deleted_again_never_reaches_the_host(
    settings: Settings, repo: Path
) -> None:
    """The report's old blind spot: a hook that lived about a second, gone by the stop."""
    seen_on_host: list[bool] = []
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("brief", mounts=["proj"])
        hook = f"{P}/sub/.git/hooks/pre-commit"
        await run(
            service,
            "brief",
            f"mkdir -p {P}/sub/.git/hooks && echo '#!/bin/sh' > {hook} && chmod 755 {hook}",
            language="bash",
        )
        for _ in range(20):  # about a second, looking at the host all along
            seen_on_host.append((repo / "sub" / ".git" / "hooks").exists())
            await asyncio.sleep(0.05)
        await run(service, "brief", f"rm -r {P}/sub", language="bash")
        await service.stop_session("brief")
        names = await reported(service, "brief")
    assert "sub/.git/hooks" in names
    assert not any(seen_on_host)


async def test_existing_trusted_files_are_the_sessions_own_to_change(
    settings: Settings, repo: Path
) -> None:
    secret = "CONTENT-MUST-NOT-BE-AUDITED"
    changed = [".claude/settings.json", ".mcp.json", EXTRA]
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("names", mounts=["proj"])
        seen = await run(service, "names", f"print(open('{P}/.mcp.json').read(), end='')")
        assert seen == "host .mcp.json\n"  # the host's version, read as it is
        writes = "\n".join(f"open('{P}/{rel}', 'w').write({secret!r})" for rel in changed)
        await run(service, "names", writes)
        inside = await run(
            service, "names", f"print(open('{P}/.claude/settings.json').read(), end='')"
        )
        assert inside == secret  # the session sees its own version
        await service.stop_session("names")
        names = await reported(service, "names")
        audit = json.dumps(
            wire(AuditPageModel, await service.audit.page(kind="protected"))["entries"]
        )
    assert set(names) == {".claude/settings.json", ".mcp.json", EXTRA}
    assert secret not in audit
    for rel in (*TRUSTED, EXTRA):
        assert (repo / rel).read_text() == f"host {rel}\n", rel


async def test_odd_names_are_escaped_in_the_report(settings: Settings, repo: Path) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("odd", mounts=["proj"])
        await run(service, "odd", f"os.makedirs('{P}/odd\\nname\\x1b[31m/.git/hooks')")
        await service.stop_session("odd")
        names = await reported(service, "odd")
    assert names == ["odd\\x0aname\\x1b[31m/.git/hooks"]


# -- links --------------------------------------------------------------------------------------


async def test_links_made_inside_replace_nothing_the_host_trusts(
    settings: Settings, repo: Path, fake_ssh: Path
) -> None:
    before = snapshot(repo / ".git")
    settings_json = (repo / ".claude" / "settings.json").read_bytes()
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("links", mounts=["proj"])
        link = f"{P}/evil"
        await run(
            service,
            "links",
            f"os.symlink({str(fake_ssh)!r}, '{link}')\n"
            f"os.replace('{link}', '{P}/.git/config')\n"
            f"os.symlink({str(fake_ssh)!r}, '{link}')\n"
            f"os.replace('{link}', '{P}/.claude/settings.json')\n"
            f"os.symlink('/home', '{P}/plain-link')",
        )
        await service.stop_session("links")
    assert snapshot(repo / ".git") == before
    assert (repo / ".claude" / "settings.json").read_bytes() == settings_json
    assert os.readlink(repo / "plain-link") == "/home"  # an ordinary link arrives as a link
    assert fake_ssh.read_text() == "FAKE-PRIVATE-KEY-c0ffee\n"


# -- choosing mounts -----------------------------------------------------------------------------


async def test_an_unknown_mount_is_refused_naming_the_configured_ones(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw,src={repo}/src")) as service:
        with pytest.raises(MountNotFound, match=r"unknown mount 'nope': .* are proj, src$"):
            await service.create_session("unknown", mounts=["nope"])
        assert service.list_sessions() == []


async def test_two_overlapping_mounts_in_one_session_are_refused(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw,src={repo}/src:ro")) as service:
        with pytest.raises(Conflict, match="mounts 'src' and 'proj' overlap"):
            await service.create_session("both", mounts=["proj", "src"])
        assert service.list_sessions() == []


async def test_a_busy_read_write_mount_waits_until_its_session_stops(
    settings: Settings, repo: Path
) -> None:
    mounts = f"proj={repo}:rw,src={repo}/src:rw"
    async with Service(with_mounts(settings, mounts)) as service:
        await service.create_session("first", mounts=["proj"])
        for sid, name in (("second", "proj"), ("inner", "src")):
            with pytest.raises(MountBusy, match=f"'{name}' .* by session 'first'"):
                await service.create_session(sid, mounts=[name])
            assert service.get_session(sid).kernels == ()
        await service.stop_session("first")
        seen = await run(service, "second", f"print(os.listdir('{P}/src'))")
        assert seen.strip() == "['main.py']"
        with pytest.raises(MountBusy, match="by session 'second'"):
            await service.start_session("first")


# -- the operator's mount paths --------------------------------------------------------------


def refusal_for(settings: Settings, path: Path) -> str:
    with pytest.raises(InvalidInput) as refused:
        configured_mounts(replace(settings, mounts=f"x={path}:rw"))
    with pytest.raises(InvalidInput):
        Service(replace(settings, mounts=f"x={path}:rw"))
    return str(refused.value)


def test_a_mount_path_through_a_link_is_refused(settings: Settings, base: Path) -> None:
    (base / "real").mkdir()
    (base / "link").symlink_to(base / "real")
    message = refusal_for(settings, base / "link")
    assert f"goes through a symbolic link ({base}/link -> {base}/real)" in message
    assert message.endswith(f"name the real path {base}/real")


def test_the_home_folder_is_refused_unless_allowed(
    settings: Settings, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = base / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert "is the home directory or contains it" in refusal_for(settings, home)
    allowed = configured_mounts(replace(settings, mounts=f"x={home}:rw", allow_home_mount=True))
    assert allowed["x"].path == home


def test_corral_own_directories_are_refused(settings: Settings) -> None:
    settings.state_dir.mkdir(parents=True)
    assert "corral's own directory" in refusal_for(settings, settings.state_dir)
    assert "corral's own directory" in refusal_for(settings, settings.run_root)


def serve(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral serve ARGS` in fresh directories; a refusal must come before it binds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        CORRAL_STATE_DIR=str(settings.state_dir),
        CORRAL_CONFIG_DIR=str(settings.state_dir.parent / "config"),
        CORRAL_RUN_ROOT=str(settings.run_root),
        CORRAL_PORT=str(free_port()),
    )
    return subprocess.run(
        [sys.executable, "-m", "corral", "serve", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("kind", ["link", "state", "suffix"])
def test_serve_refuses_a_bad_mount_with_a_usage_error(
    settings: Settings, base: Path, kind: str
) -> None:
    (base / "real").mkdir()
    (base / "link").symlink_to(base / "real")
    settings.state_dir.mkdir(parents=True)
    spec = {
        "link": f"x={base}/link:rw",
        "state": f"x={settings.state_dir}:rw",
        "suffix": f"x={base}/real:rx",
    }[kind]
    done = serve(settings, "--mount", spec)
    assert done.returncode == 2, done.stderr
    assert "Error: mount 'x'" in done.stderr
    assert "agent token" not in done.stderr  # refused before anything was served


@pytest.mark.parametrize("name", ["../x", ".git/config", "/abs"])
def test_serve_refuses_a_bad_protected_name_with_a_usage_error(
    settings: Settings, name: str
) -> None:
    done = serve(settings, "--protect", name)
    assert done.returncode == 2, done.stderr
    assert "Error: protected name" in done.stderr
    assert "Traceback" not in done.stderr


# -- the mount point in the workspace -----------------------------------------------------------


async def test_a_mount_point_cannot_be_moved_inside_and_a_link_in_its_place_refuses_the_start(
    settings: Settings, repo: Path, base: Path
) -> None:
    before = snapshot(repo)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        info = await service.create_session("point", mounts=["proj"])
        got = await outcomes(
            service,
            "point",
            {
                "rename": f"os.rename('{P}', '/workspace/other')",
                "rmdir": f"os.rmdir('{P}')",
                "link over": f"os.symlink('/tmp', '/workspace/l') or "
                f"os.replace('/workspace/l', '{P}')",
            },
        )
        assert got == {"rename": "EBUSY", "rmdir": "EBUSY", "link over": "EISDIR"}
        await service.stop_session("point")
        point = info.workspace / "proj"
        point.rmdir()  # what a sandbox could do once no mount sits there
        point.symlink_to(elsewhere)
        with pytest.raises(InvalidInput, match="the workspace entry 'proj' is not a directory"):
            await service.executions.run("1", session_id="point")
        assert service.sessions.session("point").kernels == {}
    assert snapshot(repo) == before
    assert list(elsewhere.iterdir()) == []


# -- two kernels, one session -----------------------------------------------------------------


async def test_a_second_kernel_starts_beside_a_running_one_and_sees_the_same_copy(
    settings: Settings, repo: Path
) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("pair", mounts=["proj"])
        await run(service, "pair", "n = 41")
        await run(
            service, "pair", f"open('{P}/.claude/settings.json', 'w').write('from python\\n')"
        )
        seen = await run(service, "pair", f"cat {P}/.claude/settings.json", language="bash")
        assert seen == "from python\n"
        assert await run(service, "pair", "print(n + 1)") == "42\n"  # state kept
        assert service.get_session("pair").kernels == ("bash", "python")
    assert (repo / ".claude" / "settings.json").read_text() == "host .claude/settings.json\n"


async def test_a_link_made_inside_cannot_steer_the_next_kernel_of_the_session(
    settings: Settings, repo: Path
) -> None:
    """The bash kernel joins the sandbox the python kernel runs in: nothing is mounted again,
    so a link planted where a protected folder would be bound is never followed by a mount."""
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("swap", mounts=["proj"])
        await run(service, "swap", f"os.makedirs('{P}/sub')\nos.symlink('/home', '{P}/sub/.git')")
        assert await run(service, "swap", f"readlink {P}/sub/.git", language="bash") == "/home\n"
        session = service.sessions.session("swap")
        assert session.run is not None and session.run.sandbox is not None
        bwrap = session.run.sandbox.pid
        assert bwrap is not None
        tree = {p.pid for p in _children(bwrap)}
        assert {k.pid for k in session.kernels.values()} <= tree
        assert await run(service, "swap", "print('still here')") == "still here\n"
        await service.stop_session("swap")
        names = await reported(service, "swap")
    assert "sub/.git" in names
    assert not (repo / "sub" / ".git").exists()  # the sandbox's link stayed in its view


# -- cleaning up --------------------------------------------------------------------------------


async def test_stop_leaves_no_process_cgroup_or_layer(settings: Settings, repo: Path) -> None:
    async with Service(with_mounts(settings, f"proj={repo}:rw")) as service:
        await service.create_session("clean", mounts=["proj"])
        await run(service, "clean", "true", language="bash")
        session = service.sessions.session("clean")
        assert session.run is not None
        box = session.run.box
        pids = [k.pid for k in session.kernels.values() if k.pid is not None]
        trees = [p for pid in pids for p in [psutil.Process(pid), *_children(pid)]]
        groups = [*getattr(box, "dirs", {}).values(), getattr(box, "dir", None)]
        groups = [g for g in groups if g is not None]
        assert len(pids) == 2 and layers_left(settings, "clean")
        # The property, whatever the mechanism: every cgroup folder the box made goes away
        # (a cgroup box makes some; a user's rlimit box makes none).
        assert bool(groups) == (box.mechanism != "rlimit")
        assert all(Path(g).is_dir() for g in groups)
        await service.stop_session("clean")
        assert session.run is None
        # Killed by the stop; those inside die with their pid namespace, which the kernel
        # tears down after the stop returns: wait for that state, bounded.
        deadline = time.monotonic() + 30
        while (left := [p.pid for p in trees if _alive(p)]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert left == []
        assert [g for g in groups if Path(g).exists()] == []
        assert layers_left(settings, "clean") == []


def _children(pid: int) -> list[psutil.Process]:
    return list(psutil.Process(pid).children(recursive=True))


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie; a process that vanishes while we look is not alive."""
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
