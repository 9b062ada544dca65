"""The agent and admin bearer tokens: generated once, kept in 0600 files, compared in constant time.

The agent token may run code and manage its sessions and files; the admin token may also
change what sandboxes may reach and read the audit log. A token comes from its environment
variable (`CORRAL_AGENT_TOKEN`, `CORRAL_ADMIN_TOKEN`) or from its file under the config
directory, which is created on first use.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from corral.errors import SandboxError
from corral.fsafe import CREATE_FLAGS, NotPrivate, UnsafePath, open_file_beneath, private_dir

MIN_TOKEN_CHARS = 32


class Role(StrEnum):
    AGENT = "agent"
    ADMIN = "admin"


class TokenError(SandboxError):
    """A token file or variable is unusable; the server must fail closed."""


@dataclass(frozen=True)
class Tokens:
    agent: str
    admin: str

    def role_of(self, presented: str) -> Role | None:
        """The role `presented` grants, or None; both comparisons always run."""
        given = presented.encode()
        is_admin = hmac.compare_digest(given, self.admin.encode())
        is_agent = hmac.compare_digest(given, self.agent.encode())
        if is_admin:
            return Role.ADMIN
        return Role.AGENT if is_agent else None


def load_tokens(config_dir: Path, env: Mapping[str, str] | None = None) -> Tokens:
    """Both tokens, creating missing files. Raises `TokenError` when one is unusable."""
    env = os.environ if env is None else env
    agent = _token(config_dir, Role.AGENT, env)
    admin = _token(config_dir, Role.ADMIN, env)
    if hmac.compare_digest(agent.encode(), admin.encode()):
        raise TokenError("the agent and admin tokens must differ")
    return Tokens(agent=agent, admin=admin)


def token_path(config_dir: Path, role: Role) -> Path:
    return config_dir / f"{role.value}.token"


def _token(config_dir: Path, role: Role, env: Mapping[str, str]) -> str:
    variable = f"CORRAL_{role.value.upper()}_TOKEN"
    if env.get(variable):
        return _checked(env[variable], variable)
    return _checked(_read_or_create(config_dir, token_path(config_dir, role)), variable)


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters")
    return token


def _read_or_create(config_dir: Path, path: Path) -> str:
    _private_dir(config_dir)
    try:
        fd = os.open(path, CREATE_FLAGS, 0o600)
    except FileExistsError:
        return _read_existing(path)
    with os.fdopen(fd, "w") as out:
        token = secrets.token_urlsafe(32)
        out.write(token + "\n")
    return token


def _read_existing(path: Path) -> str:
    try:
        fd = open_file_beneath(path.parent, (path.name,))
    except UnsafePath as exc:
        raise TokenError(
            f"{path} must be a regular file owned by this user (a link is refused)"
        ) from exc
    except OSError as exc:
        raise TokenError(f"{path} cannot be opened (a link is refused): {exc.strerror}") from exc
    with os.fdopen(fd) as src:
        info = os.fstat(src.fileno())
        if info.st_uid != os.geteuid():
            raise TokenError(f"{path} must be a regular file owned by this user")
        if info.st_mode & 0o077:
            os.fchmod(src.fileno(), 0o600)
        return src.read()


def _private_dir(path: Path) -> None:
    try:
        private_dir(path)
    except NotPrivate as exc:
        raise TokenError(
            f"{path} must be a directory owned by this user, not a link, that only this user "
            f"may write: it {exc.why}"
        ) from exc
