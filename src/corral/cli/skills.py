"""`corral skills`: the shipped skills and the user's own."""

from __future__ import annotations

from pathlib import Path

import click

from corral import offline
from corral.cli.base import (
    current_settings,
    guarded,
    main,
    running_server,
)
from corral.server import admin, rest
from corral.server.schemas import SkillList
from corral.skills import user_dir
from corral.texts import skills_text


@main.group()
def skills() -> None:
    """The skills: the shipped ones and yours (a folder under the config directory)."""


@skills.command("path")
def skills_path() -> None:
    """Print the folder for your own skills (drop a skill folder or a .zip there)."""
    folder = user_dir(current_settings().config_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    click.echo(folder)


@skills.command("list")
def skills_list() -> None:
    """List every skill (unpacking .zip files waiting in your folder first): the running
    server's listing, else read here."""
    remote = running_server()
    if remote is not None:
        listed = guarded(lambda: remote.invoke(rest.skills.list_skills))
        click.echo(skills_text(SkillList.model_validate(listed)))
    else:
        click.echo(skills_text(offline.skill_listing(current_settings())))


@skills.command("add")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def skills_add(archive: Path) -> None:
    """Unpack a skill .zip into your folder, with the size, count and path checks (done by
    the running server when one runs, else here)."""
    if not archive.name.endswith(".zip"):
        raise click.UsageError("a skill archive is a .zip file")
    remote = running_server()
    if remote is not None:
        data = archive.read_bytes()
        name = {"name": archive.name}
        added = guarded(lambda: remote.invoke(admin.add_skill, query=name, content=data))
        click.echo(f"added skill {added['name']} ({added['path']})")
        return
    added = guarded(lambda: offline.add_skill(current_settings(), archive))
    click.echo(f"added skill {added.name} ({added})")
