"""Who may use the dashboard: the admin token, exchanged at the login form for a cookie.

The server's guard (`corral.server.auth`) has already checked Host and Origin on every
`/ui` request; this gate checks what the guard leaves to the dashboard. A page needs a live
login (its cookie: HttpOnly, SameSite=Strict, path `/ui`, Secure when the server is not on
loopback, as long-lived as the login). A request that changes something must also come from
this server's own pages: an `Origin` header (which the guard has matched to this server)
and the login's CSRF token, as the form field `csrf` or the `X-CSRF-Token` header. The
agent token never opens the dashboard, and a bearer token is not looked at: only the cookie.
"""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from corral.dashboard.logins import COOKIE, Login, Logins
from corral.tokens import Role, Tokens

PREFIX = "/ui"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class Refused(Exception):
    """A dashboard request that may not go on; `status` and a sentence for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotLoggedIn(Refused):
    def __init__(self) -> None:
        super().__init__(401, "log in with the admin token first")


class Gate:
    def __init__(self, tokens: Tokens | None, logins: Logins, *, secure: bool) -> None:
        self.tokens = tokens
        self.logins = logins
        self.secure = secure  # the cookie only over HTTPS (a server not on loopback)

    def login_of(self, request: Request) -> Login:
        """The request's live login; raises `NotLoggedIn`."""
        login = self.logins.find(request.cookies.get(COOKIE))
        if login is None:
            raise NotLoggedIn()
        return login

    def check_change(self, request: Request, login: Login | None, form: FormData) -> None:
        """A state-changing request: it must name its origin and, once logged in, carry the
        login's CSRF token. Raises `Refused` (403)."""
        if "origin" not in request.headers:
            raise Refused(403, "a change must come from the dashboard's own page (no Origin)")
        if login is None:
            return
        presented = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
        if not login.csrf_matches(presented if isinstance(presented, str) else None):
            raise Refused(403, "the form's CSRF token is missing or wrong: reload the page")

    def admit(self, token: str) -> Login:
        """Exchange the admin token for a new login; raises `Refused` for any other token
        (the agent's included) and when the server has no tokens."""
        if self.tokens is None:
            raise Refused(503, "the server has no usable token; see its log")
        if self.tokens.role_of(token.strip()) is not Role.ADMIN:
            raise Refused(401, "that is not this server's admin token")
        return self.logins.begin()

    def set_cookie(self, response: Response, login: Login) -> None:
        response.set_cookie(
            COOKIE,
            login.id,
            max_age=int(self.logins.ttl_s),
            path=PREFIX,
            secure=self.secure,
            httponly=True,
            samesite="strict",
        )

    def end(self, request: Request, response: Response) -> None:
        """Log out: the login ends here, and the browser forgets the cookie."""
        if presented := request.cookies.get(COOKIE):
            self.logins.end(presented)
        response.delete_cookie(
            COOKIE, path=PREFIX, secure=self.secure, httponly=True, samesite="strict"
        )
