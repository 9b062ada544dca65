"""The dashboard's logins: a random id in an HttpOnly cookie, everything else kept here.

The admin token is exchanged once, at `/ui/login`, for a login that lasts `ttl_s` seconds;
the cookie carries only its id (256 random bits), and this store keeps the login's expiry
and its CSRF token, which every state-changing request must present. Logging out, expiry or
a server restart ends a login: there is nothing in the cookie to replay. The store is
bounded: past `max_count` live logins the one that ends soonest is dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "corral_ui"
MAX_LOGINS = 64


@dataclass(frozen=True)
class Login:
    id: str  # the cookie's value; kept here only as its digest
    csrf: str
    expires_at: float

    def csrf_matches(self, presented: str | None) -> bool:
        """Whether a request presented this login's CSRF token (compared in constant time)."""
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Logins:
    """Live logins by the digest of their id (a lookup's timing says nothing of an id)."""

    def __init__(
        self,
        ttl_s: float,
        max_count: int = MAX_LOGINS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_count = max_count
        self._clock = clock
        self._live: dict[bytes, Login] = {}

    def begin(self) -> Login:
        """A new login with a fresh id and CSRF token (never one presented before)."""
        self._forget_expired()
        while len(self._live) >= self.max_count:
            del self._live[min(self._live, key=lambda key: self._live[key].expires_at)]
        login = Login(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + self.ttl_s,
        )
        self._live[_digest(login.id)] = login
        return login

    def find(self, login_id: str | None) -> Login | None:
        """The live login with this id; None for no id, an unknown one or an expired one."""
        if not login_id:
            return None
        key = _digest(login_id)
        login = self._live.get(key)
        if login is not None and login.expires_at <= self._clock():
            del self._live[key]
            return None
        return login

    def end(self, login_id: str) -> None:
        """Log out: the id opens nothing from now on."""
        self._live.pop(_digest(login_id), None)

    def _forget_expired(self) -> None:
        now = self._clock()
        for key in [key for key, login in self._live.items() if login.expires_at <= now]:
            del self._live[key]


def _digest(login_id: str) -> bytes:
    return hashlib.sha256(login_id.encode()).digest()
