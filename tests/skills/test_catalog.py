"""The skill catalog: listing, front matter problems, the agent's text forms, and refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.errors import CorralError, InvalidInput, NotFound, TooLarge
from corral.server.operation import wire
from corral.server.schemas import SkillInfo as SkillInfoModel
from corral.skills import PUBLIC_DIR
from corral.skills.catalog import SkillCatalog
from corral.texts import skill_error_text, skill_file_text, skill_info_text, skills_text

SHIPPED = (
    "docx",
    "image-crop-rotate",
    "images",
    "pdf",
    "pdf-text-replace",
    "pptx",
    "xlsx",
)
RULE = "=" * 80


def info_text(catalog: SkillCatalog, name: str) -> str:
    """What get_skill_info answers: the text of the info, or of the error."""
    try:
        return skill_info_text(catalog.info(name))
    except CorralError as exc:
        return skill_error_text(exc)


def file_text(catalog: SkillCatalog, name: str, filename: str) -> str:
    """What get_skill_file answers: the text of the file, or of the error."""
    try:
        return skill_file_text(catalog.text_file(name, filename))
    except CorralError as exc:
        return skill_error_text(exc)


def make_skill(root: Path, name: str, front: str | None = None, body: str = "How to.\n") -> Path:
    """A skill folder; `front` is the raw front matter (default: a valid one for `name`)."""
    folder = root / name
    (folder / "scripts").mkdir(parents=True)
    if front is None:
        front = f"name: {name}\ndescription: The {name} skill.\n"
    (folder / "SKILL.md").write_text(f"---\n{front}---\n\n{body}")
    (folder / "scripts" / "run.py").write_text("print('hi')\n")
    return folder


@pytest.fixture
def public(tmp_path: Path) -> Path:
    root = tmp_path / "public"
    make_skill(root, "alpha")
    return root


@pytest.fixture
def user(tmp_path: Path) -> Path:
    root = tmp_path / "user"
    root.mkdir()
    return root


@pytest.fixture
def catalog(public: Path, user: Path) -> SkillCatalog:
    return SkillCatalog(public, user)


def by_name(catalog: SkillCatalog) -> dict[tuple[str, str], str | None]:
    return {(e.source, e.name): e.problem for e in catalog.list()}


# -- listing --------------------------------------------------------------------------------


def test_the_shipped_skills_are_listed_without_problems(tmp_path: Path) -> None:
    entries = SkillCatalog(PUBLIC_DIR, tmp_path / "none").list()
    assert [(e.name, e.source, e.problem) for e in entries] == [
        (name, "public", None) for name in SHIPPED
    ]
    assert all(len(e.description) > 20 for e in entries)


def test_list_text_has_coderunners_shape(tmp_path: Path) -> None:
    text = skills_text(SkillCatalog(PUBLIC_DIR, tmp_path / "none").listing())
    lines = text.splitlines()
    count = len(SHIPPED)
    assert lines[:3] == ["Available Skills:", "", f"Public Skills ({count}):"]
    shown = lines[3 : 3 + count]
    assert [line.split(":")[0] for line in shown] == [f"  - {name}" for name in SHIPPED]
    assert lines[3 + count :] == [
        "",
        "User Skills (0):",
        "  (none)",
        "",
        "Use get_skill_info(skill_name) to read documentation for a specific skill.",
    ]


def test_user_skills_are_listed_after_the_public_ones(catalog: SkillCatalog, user: Path) -> None:
    make_skill(user, "zeta")
    make_skill(user, "beta")
    entries = catalog.list()
    assert [(e.source, e.name) for e in entries] == [
        ("public", "alpha"),
        ("user", "beta"),
        ("user", "zeta"),
    ]
    assert entries[1].description == "The beta skill."
    assert entries[1].location == "/opt/corral/skills/user/beta"
    assert "User Skills (2):\n  - beta: The beta skill.\n  - zeta: The zeta skill." in (
        skills_text(catalog.listing())
    )


@pytest.mark.parametrize(
    ("front", "problem"),
    [
        (None, "SKILL.md has no front matter"),
        ("name: [unclosed\n", "SKILL.md front matter is not valid YAML"),
        ("- a list\n", "not a mapping"),
        ("name: other\ndescription: x\n", "says name: 'other', but the folder is 'broken'"),
        ("description: x\n", "has no 'name'"),
        ("name: broken\n", "has no 'description'"),
        ("name: broken\ndescription: '  '\n", "empty 'description'"),
    ],
)
def test_front_matter_problems_are_reported_per_skill(
    catalog: SkillCatalog, user: Path, front: str | None, problem: str
) -> None:
    make_skill(user, "good")
    folder = make_skill(user, "broken", front="")
    text = "No front matter here.\n" if front is None else f"---\n{front}---\nBody\n"
    (folder / "SKILL.md").write_text(text)
    problems = by_name(catalog)
    assert problems[("user", "good")] is None
    assert problems[("public", "alpha")] is None
    broken = problems[("user", "broken")]
    assert broken is not None and problem in broken
    assert f"  - broken: (not usable: {broken})" in skills_text(catalog.listing())


def test_a_skill_without_skill_md_is_listed_with_the_problem(
    catalog: SkillCatalog, user: Path
) -> None:
    (user / "empty").mkdir()
    assert "has no SKILL.md" in str(by_name(catalog)[("user", "empty")])


def test_a_user_skill_cannot_shadow_a_public_one(catalog: SkillCatalog, user: Path) -> None:
    make_skill(user, "alpha", body="Impostor.\n")
    problems = by_name(catalog)
    assert problems[("public", "alpha")] is None
    assert "a public skill has the same name" in str(problems[("user", "alpha")])
    text = info_text(catalog, "alpha")
    assert text.startswith("Skill: alpha (public)\n")
    assert "Impostor" not in text


def test_hidden_folders_and_plain_files_are_not_skills(catalog: SkillCatalog, user: Path) -> None:
    make_skill(user, ".hidden")
    (user / "notes.txt").write_text("x")
    assert [e.name for e in catalog.list()] == ["alpha"]


# -- the agent's text -----------------------------------------------------------------------


def test_info_text_names_the_sandbox_path(catalog: SkillCatalog, public: Path) -> None:
    text = info_text(catalog, "alpha")
    header = "Skill: alpha (public)\nLocation: /opt/corral/skills/public/alpha/\n"
    assert text == header + RULE + "\n\n" + (public / "alpha" / "SKILL.md").read_text()


def test_file_text_names_the_sandbox_path(catalog: SkillCatalog, user: Path) -> None:
    make_skill(user, "beta")
    text = file_text(catalog, "beta", "scripts/run.py")
    assert text == (
        "Skill: beta (user)\nFile: scripts/run.py\n"
        "Location: /opt/corral/skills/user/beta/scripts/run.py\n" + RULE + "\n\nprint('hi')\n"
    )


def test_the_sandbox_root_can_be_changed(public: Path, user: Path) -> None:
    text = info_text(SkillCatalog(public, user, sandbox_root="/skills"), "alpha")
    assert "Location: /skills/public/alpha/\n" in text


def test_unknown_skill_and_file_are_errors_with_a_hint(catalog: SkillCatalog) -> None:
    hint = " Use list_skills() to see available skills."
    assert info_text(catalog, "ghost") == "Error: Skill 'ghost' not found." + hint
    assert file_text(catalog, "alpha", "nope.py") == (
        "Error: File 'nope.py' not found in skill 'alpha'." + hint
    )
    with pytest.raises(NotFound):
        catalog.info("ghost")
    with pytest.raises(NotFound):
        catalog.file("alpha", "scripts/run.py/x")


def test_structured_info_and_file(catalog: SkillCatalog) -> None:
    info = catalog.info("alpha")
    assert info.entry.name == "alpha" and info.entry.source == "public"
    assert info.entry.location == "/opt/corral/skills/public/alpha"
    assert info.entry.problem is None
    assert info.content.startswith("---\nname: alpha\n")
    assert wire(SkillInfoModel, info)["content"] == info.content
    assert catalog.file("alpha", "scripts/run.py") == b"print('hi')\n"


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["..", "../alpha", "a/b", "/etc", ".hidden", "", "a\0b", "x" * 129]
)
def test_bad_skill_names_are_refused(catalog: SkillCatalog, name: str) -> None:
    with pytest.raises(InvalidInput, match="Invalid skill name"):
        catalog.info(name)
    assert info_text(catalog, name).startswith("Error: Invalid skill name")
    assert file_text(catalog, name, "SKILL.md").startswith("Error: Invalid skill name")


@pytest.mark.parametrize(
    ("filename", "reason"),
    [
        ("../x", "'..' parts are refused"),
        ("scripts/../../x", "'..' parts are refused"),
        ("/etc/passwd", "it is absolute"),
        ("scripts//run.py", "empty or '.' part"),
        ("./SKILL.md", "empty or '.' part"),
        ("scripts/", "empty or '.' part"),
        ("a\0b", "NUL byte"),
        ("", "non-empty string"),
    ],
)
def test_file_names_that_could_escape_are_refused(
    catalog: SkillCatalog, filename: str, reason: str
) -> None:
    with pytest.raises(InvalidInput, match="Invalid file name") as caught:
        catalog.file("alpha", filename)
    assert reason in str(caught.value)
    assert file_text(catalog, "alpha", filename).startswith("Error: Invalid file name")


def test_a_link_inside_a_skill_is_refused_not_followed(
    catalog: SkillCatalog, public: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, public / "alpha" / "scripts" / "leak.txt")
    os.symlink(tmp_path, public / "alpha" / "up")
    for filename in ("scripts/leak.txt", "up/secret.txt"):
        text = file_text(catalog, "alpha", filename)
        assert "is a symbolic link" in text and "never followed" in text, text
        assert "host secret" not in text
        with pytest.raises(InvalidInput, match="symbolic link"):
            catalog.file("alpha", filename)


def test_a_skill_folder_that_is_a_link_is_listed_with_a_problem_and_not_read(
    catalog: SkillCatalog, user: Path, tmp_path: Path
) -> None:
    outside = make_skill(tmp_path / "elsewhere", "linked")
    os.symlink(outside, user / "linked")
    assert "is a symbolic link" in str(by_name(catalog)[("user", "linked")])
    assert "symbolic link" in info_text(catalog, "linked")


def test_a_skill_md_that_is_a_link_is_not_read(
    catalog: SkillCatalog, user: Path, tmp_path: Path
) -> None:
    folder = make_skill(user, "beta")
    (folder / "SKILL.md").unlink()
    target = tmp_path / "real.md"
    target.write_text("---\nname: beta\ndescription: d\n---\n")
    os.symlink(target, folder / "SKILL.md")
    assert "symbolic link" in str(by_name(catalog)[("user", "beta")])


def test_a_fifo_is_refused_without_blocking(catalog: SkillCatalog, public: Path) -> None:
    os.mkfifo(public / "alpha" / "pipe")
    with pytest.raises(InvalidInput, match="not a regular file"):
        catalog.file("alpha", "pipe")
    assert "not a regular file" in file_text(catalog, "alpha", "pipe")


def test_a_folder_is_not_a_file(catalog: SkillCatalog) -> None:
    assert file_text(catalog, "alpha", "scripts") == (
        "Error: 'scripts' in skill 'alpha' is a folder, not a file."
    )


def test_an_oversized_file_is_refused_with_its_sandbox_path(
    public: Path, user: Path, catalog: SkillCatalog
) -> None:
    (public / "alpha" / "big.txt").write_bytes(b"x" * (catalog.max_file_bytes + 1))
    with pytest.raises(TooLarge, match="over the 1048576 bytes"):
        catalog.file("alpha", "big.txt")
    text = file_text(catalog, "alpha", "big.txt")
    assert text.startswith("Error: File 'big.txt' in skill 'alpha' is 1048577 bytes")
    assert "/opt/corral/skills/public/alpha/big.txt" in text


def test_a_binary_file_is_refused_as_text_but_served_as_bytes(
    catalog: SkillCatalog, public: Path
) -> None:
    data = b"\x89PNG\r\n\x1a\n\xff\xfe"
    (public / "alpha" / "logo.png").write_bytes(data)
    text = file_text(catalog, "alpha", "logo.png")
    assert text.startswith("Error: File 'logo.png' in skill 'alpha' is not UTF-8 text")
    assert catalog.file("alpha", "logo.png") == data
