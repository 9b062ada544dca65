"""The skills an agent reads and the operator adds (`corral.skills.catalog` finds them)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from corral.areas.trail import AuditTrail
from corral.audit_entries import AdminAction
from corral.skills.archive import unpack_skill_zip
from corral.skills.catalog import SkillCatalog, SkillFile, SkillInfo, SkillListing


class SkillService:
    """Public and user skills; reads go to a thread (the catalog unpacks user archives)."""

    def __init__(self, catalog: SkillCatalog, user_folder: Path, trail: AuditTrail) -> None:
        self.catalog = catalog
        self.user_folder = user_folder
        self.trail = trail

    async def list(self) -> SkillListing:
        """Every skill (user archives unpacked first) and the archives set aside."""
        return await asyncio.to_thread(self.catalog.listing)

    async def info(self, name: str) -> SkillInfo:
        return await asyncio.to_thread(self.catalog.info, name)

    async def file(self, name: str, filename: str) -> bytes:
        return await asyncio.to_thread(self.catalog.file, name, filename)

    async def text_file(self, name: str, filename: str) -> SkillFile:
        """A skill's file as UTF-8 text (`InvalidInput` when it is not), for the agent."""
        return await asyncio.to_thread(self.catalog.text_file, name, filename)

    async def add(self, archive_name: str, data: bytes) -> Path:
        """Unpack a skill archive (the operator's) into the user's skills, with every check
        of `unpack_skill_zip`; returns the skill's folder. Raises `ArchiveRefused`."""
        added = await asyncio.to_thread(_unpack_skill, data, archive_name, self.user_folder)
        self.trail.record(
            AdminAction(action="add_skill", target=added.name, detail={"archive": archive_name})
        )
        return added


def _unpack_skill(data: bytes, archive_name: str, folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-skill-") as tmp:
        archive = Path(tmp) / archive_name
        archive.write_bytes(data)
        return unpack_skill_zip(archive, folder)
