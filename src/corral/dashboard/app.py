"""The dashboard's routes under `/ui`: pages, the operator's actions and the live streams.

Each page reads the service (nothing else) and renders a template; each action validates
its form as the REST API validates the same change (its pydantic model), calls the service
and sends the browser back to the page it came from (303), or renders the page's refusal.
Errors of the service become a sentence on the page and a status, here at the edge.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

import pydantic
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from corral.audit import KINDS
from corral.config import Settings
from corral.dashboard import live
from corral.dashboard.gate import Gate, NotLoggedIn, Refused
from corral.dashboard.logins import Login, Logins
from corral.dashboard.render import HEADERS, HERE, Pages, code_css
from corral.dashboard.timeline import timeline
from corral.dashboard.usage import UsageHistory, session_rows
from corral.egress import presets
from corral.errors import Conflict, CorralError, InvalidInput, NotFound, SessionNotFound
from corral.server.schemas import NetworkHostsRequest, NetworkPolicyRequest
from corral.service import Service
from corral.tokens import Role, Tokens, token_path

Handler = Callable[[Request, Login], Awaitable[Response]]
ACTIONS = ("stop", "restart", "delete")
STATUS_OF = ((InvalidInput, 400), (NotFound, 404), (Conflict, 409))


class Dashboard:
    """The pages and actions of `/ui`, over one service."""

    def __init__(
        self, service: Service, tokens: Tokens | None, settings: Settings, *, secure: bool
    ) -> None:
        self.service = service
        self.settings = settings
        self.gate = Gate(tokens, Logins(settings.ui_login_ttl_s), secure=secure)
        self.pages = Pages()
        self.history = UsageHistory()
        self.css = code_css()

    def routes(self) -> list[BaseRoute]:
        page, act = self._page, self._action
        return [
            Mount(
                "/ui",
                routes=[
                    Route("/", page(self.sessions_page)),
                    Route("/login", self.login_page, methods=["GET"]),
                    Route("/login", self.log_in, methods=["POST"]),
                    Route("/logout", act(self.log_out), methods=["POST"]),
                    Route("/sessions/{id}", page(self.session_page)),
                    Route("/sessions/{id}/files/{path:path}", page(self.download)),
                    Route("/sessions/{id}/{action}", act(self.session_action), methods=["POST"]),
                    Route("/network", page(self.network_page)),
                    Route(
                        "/network/requests/{rid:int}/{decision}",
                        act(self.decide),
                        methods=["POST"],
                    ),
                    Route("/network/{id}/{change}", act(self.change_policy), methods=["POST"]),
                    Route("/audit", page(self.audit_page)),
                    Route("/live/sessions", page(self.live_sessions)),
                    Route("/live/network", page(self.live_network)),
                    Route("/sessions/{id}/live", page(self.live_session)),
                    Route("/static/code.css", self.code_css),
                    Mount("/static", StaticFiles(directory=HERE / "static")),
                ],
            )
        ]

    # -- the gate, around every handler ---------------------------------------------------

    def _page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                login = self.gate.login_of(request)
            except NotLoggedIn:
                return self._to_login(request)
            return await self._answer(request, login, handler)

        return endpoint

    def _action(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                login = self.gate.login_of(request)
                self.gate.check_change(request, login, await request.form())
            except Refused as refused:
                return await self._refused(refused, login=None)
            return await self._answer(request, login, handler)

        return endpoint

    async def _answer(self, request: Request, login: Login, handler: Handler) -> Response:
        try:
            return await handler(request, login)
        except CorralError as exc:
            status = next((code for kind, code in STATUS_OF if isinstance(exc, kind)), 500)
            return await self._refused(Refused(status, str(exc)), login)

    async def _refused(self, refused: Refused, login: Login | None) -> Response:
        context = {"csrf": None, "message": None}
        if login is not None:
            context = await self._context(login, "")
        return self.pages.response(
            "refused.html",
            refused.status,
            heading="Not done" if login else "Refused",
            text=refused.message,
            back="/ui/" if login else "/ui/login",
            **context,
        )

    def _to_login(self, request: Request) -> Response:
        if request.url.path.startswith("/ui/live/") or request.url.path.endswith("/live"):
            return PlainTextResponse("log in first", 401, headers=HEADERS)
        target = "/ui/login?" + urlencode({"next": request.url.path})
        return RedirectResponse(target, 303, headers=HEADERS)

    async def _context(self, login: Login, here: str) -> dict[str, Any]:
        """What every page's frame needs: the CSRF token and the count of open requests."""
        pending = len(await self.service.network.requests("pending"))
        return {"csrf": login.csrf, "here": here, "message": None, "pending": pending}

    # -- logging in and out ---------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        return self._login_form(_local(request.query_params.get("next")), None, 200)

    def _login_form(self, next_path: str, message: str | None, status: int) -> Response:
        return self.pages.response(
            "login.html",
            status,
            csrf=None,
            next=next_path,
            message=message,
            token_file=token_path(self.settings.config_dir, Role.ADMIN),
        )

    async def log_in(self, request: Request) -> Response:
        form = await request.form()
        next_path = _local(_field(form, "next"))
        try:
            self.gate.check_change(request, None, form)
            login = self.gate.admit(_field(form, "token"))
        except Refused as refused:
            return self._login_form(next_path, refused.message, refused.status)
        response = RedirectResponse(next_path, 303, headers=HEADERS)
        self.gate.set_cookie(response, login)
        return response

    async def log_out(self, request: Request, login: Login) -> Response:
        response = RedirectResponse("/ui/login", 303, headers=HEADERS)
        self.gate.end(request, response)
        return response

    # -- pages ----------------------------------------------------------------------------

    async def sessions_page(self, request: Request, login: Login) -> Response:
        rows = session_rows(self.service, self.history)
        return self.pages.response(
            "sessions.html", rows=rows, **await self._context(login, "sessions")
        )

    async def session_page(self, request: Request, login: Login) -> Response:
        session_id = request.path_params["id"]
        self.service.get_session(session_id)  # SessionNotFound: 404
        rows = session_rows(self.service, self.history, only=session_id)
        if not rows:
            raise SessionNotFound(session_id)
        row = rows[0]
        page_at = time.time()
        items, last_entry = await timeline(self.service, session_id)
        files, problem = None, None
        try:
            files = self.service.files.list(session_id, ".", recursive=True)
        except CorralError as exc:
            problem = str(exc)
        return self.pages.response(
            "session.html",
            row=row,
            items=items,
            last_entry=last_entry,
            page_at=f"{page_at:.6f}",
            files=files,
            files_problem=problem,
            **await self._context(login, "sessions"),
        )

    async def download(self, request: Request, login: Login) -> Response:
        data = self.service.files.read(request.path_params["id"], request.path_params["path"])
        name = request.path_params["path"].rsplit("/", 1)[-1]
        return Response(
            data,
            media_type="application/octet-stream",
            headers={
                **HEADERS,
                "Content-Disposition": f"attachment; filename*=UTF-8''{_quoted(name)}",
            },
        )

    async def network_page(self, request: Request, login: Login) -> Response:
        requests = await self.service.network.requests()
        policies = [
            (info.id, self.service.network.policy(info.id))
            for info in sorted(self.service.list_sessions(), key=lambda i: i.id)
        ]
        return self.pages.response(
            "network.html",
            requests=requests,
            policies=policies,
            presets=presets.NAMES,
            **await self._context(login, "network"),
        )

    async def audit_page(self, request: Request, login: Login) -> Response:
        filters = AuditFilters.of(request.query_params)
        page = await self.service.audit.page(
            kind=filters.kind,
            session=filters.session,
            before_id=filters.before_id,
            since=filters.since,
            until=filters.until,
            limit=filters.limit,
        )
        older = None
        if page.next_before_id is not None:
            older = "/ui/audit?" + urlencode(filters.query(before_id=page.next_before_id))
        return self.pages.response(
            "audit.html",
            page=page,
            filters=filters,
            kinds=KINDS,
            older=older,
            **await self._context(login, "audit"),
        )

    async def code_css(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css", headers={"Cache-Control": "no-cache"})

    # -- actions --------------------------------------------------------------------------

    async def session_action(self, request: Request, login: Login) -> Response:
        session_id, action = request.path_params["id"], request.path_params["action"]
        if action not in ACTIONS:
            raise InvalidInput(f"no action {action!r}: stop, restart or delete")
        if action == "stop":
            await self.service.admin_stop_session(session_id)
        elif action == "restart":
            await self.service.restart_session(session_id, actor="admin")
        else:
            await self.service.delete_session(session_id, actor="admin")
        back = _local(_field(await request.form(), "next"))
        if action == "delete" and back.startswith("/ui/sessions/"):
            back = "/ui/"
        return RedirectResponse(back, 303, headers=HEADERS)

    async def decide(self, request: Request, login: Login) -> Response:
        decision = request.path_params["decision"]
        if decision not in ("approve", "reject"):
            raise InvalidInput(f"no decision {decision!r}: approve or reject")
        await self.service.network.decide(request.path_params["rid"], decision == "approve")
        return RedirectResponse("/ui/network", 303, headers=HEADERS)

    async def change_policy(self, request: Request, login: Login) -> Response:
        session_id, change = request.path_params["id"], request.path_params["change"]
        form = await request.form()
        network = self.service.network
        if change == "mode":
            policy = _valid(NetworkPolicyRequest, mode=_field(form, "mode"))
            current = network.policy(session_id).policy.allow
            await network.set(session_id, policy.mode, current)
        elif change in ("allow", "deny"):
            hosts = _valid(NetworkHostsRequest, hosts=_hosts(form)).hosts
            await (network.allow if change == "allow" else network.deny)(session_id, hosts)
        else:
            raise InvalidInput(f"no change {change!r}: allow, deny or mode")
        return RedirectResponse("/ui/network", 303, headers=HEADERS)

    # -- live parts -----------------------------------------------------------------------

    async def live_sessions(self, request: Request, login: Login) -> Response:
        return live.stream(live.SessionsFeed(self, login), self._lasts(login))

    async def live_network(self, request: Request, login: Login) -> Response:
        return live.stream(live.NetworkFeed(self, login), self._lasts(login))

    async def live_session(self, request: Request, login: Login) -> Response:
        session_id = request.path_params["id"]
        self.service.get_session(session_id)
        after = _int(request.query_params.get("after"), 0)
        page_at = _number(request.query_params.get("at"))
        feed = live.TimelineFeed(self, session_id, after, page_at)
        return live.stream(feed, self._lasts(login))

    def _lasts(self, login: Login) -> Callable[[], bool]:
        """Whether `login` still holds (a stream it opened ends with it)."""
        return lambda: self.gate.logins.find(login.id) is not None


class AuditFilters(pydantic.BaseModel):
    """The audit page's query: what the form sends, checked."""

    kind: str | None = None
    session: str | None = None
    since: float | None = None
    until: float | None = None
    before_id: int | None = None
    limit: int = 100
    since_text: str = ""
    until_text: str = ""

    @classmethod
    def of(cls, params: Any) -> AuditFilters:
        since_text = params.get("since") or ""
        until_text = params.get("until") or ""
        return cls(
            kind=params.get("kind") or None,
            session=params.get("session") or None,
            since=_local_time(since_text),
            until=_local_time(until_text),
            before_id=_int(params.get("before_id"), None),
            limit=_int(params.get("limit"), 100),
            since_text=since_text,
            until_text=until_text,
        )

    def query(self, **more: Any) -> dict[str, Any]:
        values = {
            "kind": self.kind,
            "session": self.session,
            "since": self.since_text,
            "until": self.until_text,
            "limit": self.limit if self.limit != 100 else None,
            **more,
        }
        return {k: v for k, v in values.items() if v}


def _local_time(text: str) -> float | None:
    """A `datetime-local` field (this machine's time) as seconds since the epoch."""
    if not text:
        return None
    for form in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"):
        try:
            return time.mktime(time.strptime(text, form))
        except ValueError:
            continue
    raise InvalidInput(f"{text!r} is not a date and time (YYYY-MM-DDTHH:MM)")


def _int(text: str | None, default: int | None) -> Any:
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{text!r} is not a whole number") from None


def _number(text: str | None) -> float:
    """A page's time stamp (0: shown before anything, so everything is new)."""
    try:
        return float(text or 0)
    except ValueError:
        raise InvalidInput(f"{text!r} is not a number") from None


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _hosts(form: FormData) -> list[str]:
    """The entries a form names: one field or several, each holding entries one per line
    or separated by ", " (a lone comma belongs to an entry: `GET,POST api.example.com/v1/`)."""
    values = [v for v in form.getlist("hosts") if isinstance(v, str)]
    lines = [line for value in values for line in value.replace(", ", "\n").splitlines()]
    return [line.strip() for line in lines if line.strip()]


def _valid(model: type[pydantic.BaseModel], **fields: Any) -> Any:
    """The fields checked as the REST API checks them; `InvalidInput` with its reason."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as exc:
        reasons = "; ".join(str(error["msg"]) for error in exc.errors())
        raise InvalidInput(reasons) from None


def _local(path: str | None) -> str:
    """Where to go after a form: one of the dashboard's own pages, never another site."""
    if path and path.startswith("/ui/") and "//" not in path and "\\" not in path:
        return path
    return "/ui/"


def _quoted(name: str) -> str:
    return quote(name, safe="")
