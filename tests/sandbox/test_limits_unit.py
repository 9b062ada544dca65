"""Limits as data, sizes, the mechanism choice, settings from the environment, and the cgroup
v2 box against a fake cgroup2 tree. Fast: no kernel, no sandbox.

The cgroup v2 tests write into a directory tree in tmp_path shaped like a delegated cgroup2
subtree. That tree is a mock, at the one seam that truly cannot run here: this host mounts the
unified hierarchy, but its memory, pids and cpu controllers are bound to the v1 hierarchies
(`/sys/fs/cgroup/unified/cgroup.controllers` lists only hugetlb), so no cgroup2 group with those
controllers can be made. The cgroup v1 box and the rlimit fallback run for real in
`test_limits_enforced.py`.

A regular file is not a cgroup file: a write does not replace its content, so every fake file
starts empty and afterwards holds exactly what the box wrote. The fake tree's `admit` only
writes a pid into a file under tmp_path; the pid is a `sleep` this test starts and kills.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.config import Settings
from corral.errors import InvalidInput, SandboxUnavailable
from corral.sandbox.boxes import (
    CgroupV1Box,
    CgroupV2Box,
    Counters,
    RlimitBox,
    Usage,
    describe_hit,
    make_box,
    prepare_v2_subtree,
)
from corral.sandbox.limits import (
    MIN_MEMORY_BYTES,
    MIN_TASKS,
    LimitMechanism,
    Limits,
    best_effort,
    choose_mechanism,
    detect_mechanism,
    enforcement,
    format_size,
    parse_size,
)
from corral.server.operation import wire
from corral.server.schemas import LimitsValues

KIB = 1024
MIB = KIB * KIB
GIB = KIB * MIB
BASE = Limits(
    memory_bytes=256 * MIB,
    cpus=0.5,
    tasks=48,
    workspace_bytes=64 * MIB,
    tmp_bytes=32 * MIB,
    exec_timeout_s=30.0,
    idle_timeout_s=600.0,
    output_bytes=100_000,
)
SESSION_FILES = (
    "cgroup.procs",
    "memory.max",
    "memory.swap.max",
    "pids.max",
    "cpu.max",
    "memory.events",
    "pids.events",
    "cgroup.subtree_control",
    "cgroup.freeze",
    "cgroup.events",
    "memory.current",
    "pids.current",
    "cgroup.kill",
)
LEAF_FILES = ("cgroup.procs", "cgroup.freeze", "cgroup.events", "cgroup.kill")


# -- Limits.changed ------------------------------------------------------------------------


def test_sizes_may_be_written_as_strings() -> None:
    new = BASE.changed(
        {
            "memory_bytes": "1G",
            "workspace_bytes": "512MiB",
            "tmp_bytes": "1.5g",
            "output_bytes": "1000",
        }
    )
    assert (new.memory_bytes, new.workspace_bytes, new.tmp_bytes, new.output_bytes) == (
        GIB,
        512 * MIB,
        3 * GIB // 2,
        1000,
    )
    assert BASE.memory_bytes == 256 * MIB  # a copy: the original stays


def test_numbers_take_the_type_of_their_limit() -> None:
    new = BASE.changed({"cpus": "0.25", "tasks": 64.0, "exec_timeout_s": 60, "memory_bytes": 1e9})
    assert new.cpus == 0.25 and isinstance(new.cpus, float)
    assert new.tasks == 64 and isinstance(new.tasks, int)
    assert new.exec_timeout_s == 60.0 and isinstance(new.exec_timeout_s, float)
    assert new.memory_bytes == 1_000_000_000 and isinstance(new.memory_bytes, int)


def test_no_change_is_the_same_limits() -> None:
    assert BASE.changed({}) == BASE


def test_an_unknown_limit_is_refused_with_the_known_names() -> None:
    with pytest.raises(
        InvalidInput, match=r"unknown limit 'swap_bytes': choose among memory_bytes"
    ):
        BASE.changed({"swap_bytes": "1G"})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("memory_bytes", -1, "must be positive"),
        ("cpus", 0, "must be positive"),
        ("cpus", -0.5, "must be positive"),
        ("tasks", -5, "must be positive"),
        ("exec_timeout_s", -1.0, "must be positive"),
        ("idle_timeout_s", 0, "must be positive"),
        ("workspace_bytes", "0", "must be positive"),
        ("output_bytes", "0.5", "must be positive"),
        ("memory_bytes", True, "must be a number"),
        ("tasks", False, "must be a number"),
        ("cpus", None, "must be a number"),
        ("cpus", [1], "must be a number"),
        ("tasks", "many", "must be a number"),
        ("memory_bytes", "lots", "is not a size"),
        ("tmp_bytes", "-1M", "is not a size"),
        ("memory_bytes", "127M", "at least 128 MiB"),
        ("memory_bytes", 1024, "at least 128 MiB"),
        ("tasks", MIN_TASKS - 1, f"at least {MIN_TASKS}"),
    ],
)
def test_a_bad_value_is_refused(name: str, value: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        BASE.changed({name: value})


def test_the_smallest_memory_and_task_limits_are_accepted() -> None:
    new = BASE.changed({"memory_bytes": "128M", "tasks": MIN_TASKS})
    assert (new.memory_bytes, new.tasks) == (MIN_MEMORY_BYTES, MIN_TASKS)


@pytest.mark.parametrize(
    "name", ["cpus", "exec_timeout_s", "idle_timeout_s", "tasks", "memory_bytes"]
)
@pytest.mark.parametrize("value", [math.nan, math.inf, "nan", "inf"])
def test_a_number_that_is_not_finite_is_refused(name: str, value: object) -> None:
    with pytest.raises(InvalidInput):
        BASE.changed({name: value})


def test_the_wire_model_lists_every_limit() -> None:
    assert wire(LimitsValues, BASE) == {
        "memory_bytes": 256 * MIB,
        "cpus": 0.5,
        "tasks": 48,
        "workspace_bytes": 64 * MIB,
        "tmp_bytes": 32 * MIB,
        "exec_timeout_s": 30.0,
        "idle_timeout_s": 600.0,
        "output_bytes": 100_000,
        "workspace_files": 200_000,
    }


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        ("0", 0),
        ("1k", KIB),
        (" 1K ", KIB),
        ("1KB", KIB),
        ("256m", 256 * MIB),
        ("512MiB", 512 * MIB),
        ("2G", 2 * GIB),
        ("2 G", 2 * GIB),
        ("1.5g", 3 * GIB // 2),
        ("1T", 1024 * GIB),
    ],
)
def test_parse_size_reads_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-1M", "1e9", "12 parsecs", "1.2.3G", "1GG", "0x10"])
def test_parse_size_refuses_what_is_not_a_size(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (KIB, "1 KiB"),
        (1536, "1.5 KiB"),
        (256 * MIB, "256 MiB"),
        (2 * GIB, "2 GiB"),
        (3 * GIB // 2, "1.5 GiB"),
        (1024 * GIB, "1 TiB"),
    ],
)
def test_format_size_uses_the_largest_unit(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize("text", ["64M", "256M", "1G", "5G", "1.5G"])
def test_a_formatted_size_parses_back(text: str) -> None:
    size = parse_size(text)
    assert parse_size(format_size(size).replace(" ", "").removesuffix("iB")) == size


# -- mechanism -----------------------------------------------------------------------------


def test_rlimit_can_be_forced() -> None:
    forced = choose_mechanism("rlimit")
    assert forced.name == "rlimit"
    assert forced.detail.endswith("(forced)")
    assert forced.path is None


def test_forcing_the_detected_mechanism_still_says_forced(tmp_path: Path) -> None:
    """A host with no cgroup tree detects rlimits; forcing them is still shown as forced
    (a non-root user's reported failure)."""
    assert detect_mechanism(tmp_path).name == "rlimit"
    forced = choose_mechanism("rlimit", tmp_path)
    assert forced.detail == "per-process rlimits and a watchdog (forced)"
    detected = detect_mechanism()
    assert choose_mechanism(detected.name).detail == f"{detected.detail} (forced)"


@pytest.mark.parametrize("forced", ["", "auto"])
def test_auto_is_the_detected_mechanism(forced: str) -> None:
    assert choose_mechanism(forced) == detect_mechanism()


def test_an_unknown_mechanism_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"unknown limit mechanism 'cgroup3': use auto, cgroup2"):
        choose_mechanism("cgroup3")


def test_a_mechanism_this_host_lacks_is_refused() -> None:
    detected = detect_mechanism().name
    missing = "cgroup1" if detected == "cgroup2" else "cgroup2"
    with pytest.raises(InvalidInput, match=f"limit mechanism {missing} is not available here"):
        choose_mechanism(missing)


def test_no_cgroup_tree_means_rlimits(tmp_path: Path) -> None:
    found = detect_mechanism(tmp_path)
    assert found.name == "rlimit"
    assert found.advice is not None and "best effort" in found.advice


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroup v1 is chosen only for root")
def test_v1_controllers_as_root_mean_cgroup1(tmp_path: Path) -> None:
    for controller in ("memory", "pids", "cpu", "freezer"):
        (tmp_path / controller).mkdir()
    found = detect_mechanism(tmp_path)
    assert (found.name, found.path) == ("cgroup1", tmp_path)


def test_a_writable_unified_tree_with_controllers_means_cgroup2(tmp_path: Path) -> None:
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    unified = [line[3:] for line in lines if line.startswith("0::")]
    if not unified:
        pytest.skip("this process is in no unified-hierarchy cgroup")
    own = tmp_path / "unified" / unified[0].lstrip("/")
    own.mkdir(parents=True, exist_ok=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    found = detect_mechanism(tmp_path)
    assert (found.name, found.path) == ("cgroup2", own)


def test_a_unified_tree_without_memory_is_not_cgroup2(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    assert detect_mechanism(tmp_path).name != "cgroup2"


@pytest.mark.parametrize("mechanism", ["cgroup2", "cgroup1", "rlimit"])
def test_every_limit_says_what_enforces_it(mechanism: str) -> None:
    how = enforcement(mechanism)
    assert set(how) == {"memory", "cpu", "tasks", "workspace", "tmpfs", "time", "output", "idle"}
    assert all(how.values())


def test_rlimit_says_what_its_watchdog_holds() -> None:
    how = enforcement("rlimit")
    assert "total resident memory" in how["memory"]
    assert "stops (SIGSTOP)" in how["cpu"]
    assert "watchdog" in how["tasks"]


@pytest.mark.parametrize(
    ("mechanism", "weak"),
    [
        ("cgroup2", ("workspace",)),
        ("cgroup1", ("workspace",)),
        ("rlimit", ("memory", "cpu", "tasks", "workspace")),
    ],
)
def test_watchdog_limits_are_best_effort(mechanism: str, weak: tuple[str, ...]) -> None:
    # The workspace is measured by the server on every mechanism: never called a hard limit.
    assert best_effort(mechanism) == weak


def test_make_box_follows_the_mechanism(tmp_path: Path) -> None:
    assert isinstance(
        make_box(LimitMechanism("cgroup2", "", None, tmp_path), "s", BASE), CgroupV2Box
    )
    assert isinstance(
        make_box(LimitMechanism("cgroup1", "", None, tmp_path), "s", BASE), CgroupV1Box
    )
    assert isinstance(make_box(LimitMechanism("rlimit", "", None), "s", BASE), RlimitBox)
    assert isinstance(make_box(LimitMechanism("cgroup2", "", None, None), "s", BASE), RlimitBox)


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        ("memory", "256 MiB memory limit"),
        ("tasks", "limit of 48 tasks"),
        ("disk", "the workspace holds at most 64 MiB"),
    ],
)
def test_a_hit_names_its_limit(limit: str, words: str) -> None:
    assert words in describe_hit(limit, BASE)


# -- settings ------------------------------------------------------------------------------


def _env(**values: str) -> dict[str, str]:
    return {"CORRAL_STATE_DIR": "/tmp/corral-unit-state", **values}


def test_settings_default_limits() -> None:
    limits = Settings.from_env(_env()).limits
    assert (limits.memory_bytes, limits.cpus, limits.tasks) == (2 * GIB, 1.0, 256)
    assert (limits.workspace_bytes, limits.tmp_bytes) == (5 * GIB, GIB)
    assert Settings.from_env(_env()).limit_mechanism == "auto"


def test_settings_read_the_limits_from_the_environment() -> None:
    settings = Settings.from_env(
        _env(
            CORRAL_MEMORY_BYTES="256M",
            CORRAL_CPUS="0.5",
            CORRAL_TASKS="64",
            CORRAL_WORKSPACE_BYTES="2G",
            CORRAL_TMP_SIZE_BYTES="512m",
            CORRAL_EXEC_TIMEOUT_S="60",
            CORRAL_IDLE_TIMEOUT_S="600",
            CORRAL_MAX_OUTPUT_BYTES="100000",
            CORRAL_LIMIT_MECHANISM="rlimit",
        )
    )
    assert settings.limit_mechanism == "rlimit"
    assert settings.limits == Limits(
        memory_bytes=256 * MIB,
        cpus=0.5,
        tasks=64,
        workspace_bytes=2 * GIB,
        tmp_bytes=512 * MIB,
        exec_timeout_s=60.0,
        idle_timeout_s=600.0,
        output_bytes=100_000,
    )


@pytest.mark.parametrize("raw", ["nan", "inf"])
def test_settings_refuse_cpus_that_are_not_finite(raw: str) -> None:
    with pytest.raises(InvalidInput):
        Settings.from_env(_env(CORRAL_CPUS=raw))


def test_settings_take_sizes_in_bytes_too() -> None:
    assert Settings.from_env(_env(CORRAL_MEMORY_BYTES="1073741824")).memory_bytes == GIB


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("CORRAL_MEMORY_BYTES", "lots", "is not a size"),
        ("CORRAL_MEMORY_BYTES", "0", "CORRAL_MEMORY_BYTES must be positive"),
        ("CORRAL_WORKSPACE_BYTES", "-1G", "is not a size"),
        ("CORRAL_CPUS", "-1", "CORRAL_CPUS must be positive"),
        ("CORRAL_CPUS", "half", "CORRAL_CPUS='half' is not a number"),
        ("CORRAL_TASKS", "0", "CORRAL_TASKS must be positive"),
        ("CORRAL_TASKS", "1.5", "CORRAL_TASKS='1.5' is not a number"),
    ],
)
def test_a_bad_limit_in_the_environment_is_refused(name: str, raw: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Settings.from_env(_env(**{name: raw}))


# -- cgroup v2 against a fake tree ---------------------------------------------------------


@dataclass
class FakeV2:
    own: Path  # the server's delegated cgroup
    name: str

    @property
    def sessions(self) -> Path:
        return self.own / "corral-sessions"

    @property
    def dir(self) -> Path:
        return self.sessions / self.name

    def leaf(self, pid: int) -> Path:
        """The per-kernel leaf a real kernel would create on mkdir, files included."""
        leaf = self.dir / f"k{pid}"
        _touch(leaf, LEAF_FILES)
        return leaf

    def read(self, name: str, under: Path | None = None) -> str:
        return ((under or self.dir) / name).read_text()

    def clear(self) -> None:
        for name in SESSION_FILES:
            (self.dir / name).write_text("")


def _touch(directory: Path, names: tuple[str, ...]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).touch()


@pytest.fixture
def fake(tmp_path: Path) -> FakeV2:
    """A delegated cgroup2 subtree as the kernel would show it, every file empty."""
    tree = FakeV2(tmp_path / "cgroup" / "user.slice" / "corral.scope", "s1")
    _touch(tree.own, ("cgroup.procs", "cgroup.subtree_control", "cgroup.controllers"))
    (tree.own / "cgroup.controllers").write_text("cpu io memory pids\n")
    _touch(tree.own / "corral-server", ("cgroup.procs",))
    _touch(tree.sessions, ("cgroup.procs", "cgroup.subtree_control"))
    _touch(tree.dir, SESSION_FILES)
    return tree


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of our own to admit: it gets real file rlimits, and is killed afterwards."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_v2_create_moves_the_server_into_a_leaf_and_delegates(fake: FakeV2) -> None:
    CgroupV2Box(fake.name, BASE, fake.own).create()
    assert fake.read("cgroup.procs", fake.own / "corral-server") == str(os.getpid())
    assert fake.read("cgroup.subtree_control", fake.own) == "+memory +pids +cpu"
    assert fake.read("cgroup.subtree_control", fake.sessions) == "+memory +pids +cpu"
    assert fake.read("cgroup.procs", fake.own) == ""


def test_prepare_v2_subtree_leaves_a_prepared_tree_alone(fake: FakeV2) -> None:
    (fake.sessions / "cgroup.subtree_control").write_text("cpu memory pids\n")
    prepare_v2_subtree(fake.own)
    assert fake.read("cgroup.procs", fake.own / "corral-server") == ""
    assert fake.read("cgroup.subtree_control", fake.own) == ""


def test_v2_create_writes_every_limit(fake: FakeV2) -> None:
    CgroupV2Box(fake.name, BASE, fake.own).create()
    assert fake.read("memory.max") == str(256 * MIB)
    assert fake.read("memory.swap.max") == "0"
    assert fake.read("pids.max") == "48"
    assert fake.read("cpu.max") == "50000 100000"


@pytest.mark.parametrize(
    ("cpus", "line"), [(0.25, "25000 100000"), (2.0, "200000 100000"), (0.001, "1000 100000")]
)
def test_v2_cpu_quota_is_per_100_ms_period(fake: FakeV2, cpus: float, line: str) -> None:
    CgroupV2Box(fake.name, BASE.changed({"cpus": cpus}), fake.own).create()
    assert fake.read("cpu.max") == line


def test_v2_swap_file_is_optional(fake: FakeV2) -> None:
    (fake.dir / "memory.swap.max").unlink()
    CgroupV2Box(fake.name, BASE, fake.own).create()
    assert fake.read("memory.max") == str(256 * MIB)


def test_v2_missing_controller_file_is_sandbox_unavailable(fake: FakeV2) -> None:
    (fake.dir / "pids.max").unlink()
    with pytest.raises(SandboxUnavailable, match="cannot set tasks"):
        CgroupV2Box(fake.name, BASE, fake.own).create()


def test_v2_subtree_that_cannot_be_made_is_sandbox_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="cannot create cgroup"):
        CgroupV2Box("s1", BASE, tmp_path / "missing").create()


def test_v2_apply_rewrites_the_limits(fake: FakeV2) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    fake.clear()
    box.apply(BASE.changed({"memory_bytes": "128M", "tasks": 16, "cpus": 2}))
    assert fake.read("memory.max") == str(128 * MIB)
    assert fake.read("memory.swap.max") == "0"
    assert fake.read("pids.max") == "16"
    assert fake.read("cpu.max") == "200000 100000"
    assert box.limits.tasks == 16


def test_v2_counters_come_from_the_event_files(fake: FakeV2) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    assert box.counters() == Counters(0, 0)
    (fake.dir / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\n")
    (fake.dir / "pids.events").write_text("max 5\n")
    assert box.counters() == Counters(oom_kills=2, task_refusals=5)


def test_v2_usage_comes_from_the_current_files(fake: FakeV2) -> None:
    (fake.dir / "memory.current").write_text("123456789\n")
    (fake.dir / "pids.current").write_text("17\n")
    assert CgroupV2Box(fake.name, BASE, fake.own).usage() == Usage(123456789, 17)


def test_v2_admit_writes_the_pid_into_a_kernel_leaf_and_sets_file_limits(
    fake: FakeV2, sleeper: subprocess.Popen[bytes]
) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    leaf = fake.leaf(sleeper.pid)
    cgroups_before = Path(f"/proc/{sleeper.pid}/cgroup").read_text()
    box.admit(sleeper.pid)
    assert fake.read("cgroup.procs", leaf) == str(sleeper.pid)
    assert box.pids == {sleeper.pid}
    size = 64 * MIB
    assert resource.prlimit(sleeper.pid, resource.RLIMIT_FSIZE) == (size, size)
    assert resource.prlimit(sleeper.pid, resource.RLIMIT_CORE) == (0, 0)
    assert Path(f"/proc/{sleeper.pid}/cgroup").read_text() == cgroups_before  # not moved


def test_v2_freeze_and_thaw_write_each_kernel_leaf(
    fake: FakeV2, sleeper: subprocess.Popen[bytes]
) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    leaf = fake.leaf(sleeper.pid)
    box.admit(sleeper.pid)
    (leaf / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    box.freeze()
    assert fake.read("cgroup.freeze", leaf) == "1"
    box.thaw()
    assert fake.read("cgroup.freeze", leaf) == "0"


def test_v2_freeze_that_never_happens_is_sandbox_unavailable(
    fake: FakeV2, sleeper: subprocess.Popen[bytes]
) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    leaf = fake.leaf(sleeper.pid)
    box.admit(sleeper.pid)
    (leaf / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    with pytest.raises(SandboxUnavailable, match="did not freeze in time"):
        box.freeze()


def test_v2_remove_uses_cgroup_kill(fake: FakeV2, sleeper: subprocess.Popen[bytes]) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    leaf = fake.leaf(sleeper.pid)
    box.admit(sleeper.pid)
    box.remove()
    assert fake.read("cgroup.kill", leaf) == "1"
    assert fake.read("cgroup.kill") == "1"
    assert sleeper.poll() is None  # the fake kill file kills nothing: no signal was sent


def test_v2_remove_without_cgroup_kill_signals_each_listed_process(
    fake: FakeV2, sleeper: subprocess.Popen[bytes]
) -> None:
    box = CgroupV2Box(fake.name, BASE, fake.own)
    box.create()
    leaf = fake.leaf(sleeper.pid)
    box.admit(sleeper.pid)
    (leaf / "cgroup.kill").unlink()
    (fake.dir / "cgroup.kill").unlink()
    box.remove()
    assert sleeper.wait(timeout=5) == -9
