"""The dashboard as an ASGI application: its settings, the guard every request passes
first, the connections its pages share, and rendering.

`Guard` wraps the Starlette application: it authenticates (basic authentication, or the
host application's user when mounted), refuses every state-changing request unless
actions are on and the request comes from the dashboard's own pages, and puts the security
headers on every response, whatever answered it. Pages (`cronjob.web.pages`) and actions
(`cronjob.web.actions`) run only behind it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cronjob.db import Database
from cronjob.web.guard import (
    SECURITY_HEADERS,
    AllowedHosts,
    BasicAuth,
    CsrfTokens,
    Sessions,
    Throttle,
    logged_in,
)

HERE = Path(__file__).resolve().parent
# Connections the pages share: a page holds one while it reads, and requests beyond these
# wait their turn (for at most CONNECTION_WAIT seconds) rather than crowd the server.
POOL_SIZE = 4
CONNECTION_WAIT = 10.0
SAFE_METHODS = frozenset({"GET", "HEAD"})
ACTION_PREFIX = "/actions/"


@dataclass(frozen=True)
class Settings:
    """What the dashboard may show and do, and where its database is."""

    database: Database
    allow_actions: bool = False
    show_payloads: bool = False
    show_logs: bool = False  # what handlers logged, and tracebacks
    actor: str | None = None  # who acts through a session of the login link (--actor)
    basic_auth: BasicAuth | None = None
    # The names it answers to; None when mounted in an application that checks them.
    allowed_hosts: AllowedHosts | None = None
    login_token: str | None = None  # the login link's (jobrunner web prints it)
    tenants_sql: str | None = None  # for "run now" of a tenant-scoped schedule
    schema_checked: bool = False  # the database was opened and checked already
    # A tracing UI's page of a trace, `{trace_id}` in it (checked: present.trace_url_template).
    trace_url_template: str | None = None
    refresh_seconds: float = 5.0  # how often a page that changes reloads itself; 0: never


class Connections:
    """A few autocommit connections the pages take turns with, opened as needed; one that
    broke, or was left inside a transaction, is closed rather than handed on."""

    def __init__(self, settings: Settings, size: int = POOL_SIZE) -> None:
        self._database = settings.database
        self._checked = settings.schema_checked
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        from cronjob.db import database_errors
        from cronjob.errors import DatabaseUnavailable

        if not self._slots.acquire(timeout=CONNECTION_WAIT):
            raise DatabaseUnavailable("every dashboard connection is busy: try again")
        try:
            conn = self._take()
            try:
                # A refusal (a role without the privilege, a dropped table) becomes the
                # project's own error, which the error page shows in one line.
                with database_errors():
                    yield conn
            finally:
                self._give_back(conn)
        finally:
            self._slots.release()

    def _take(self) -> Any:
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return self._open()
            if not conn.closed:
                return conn

    def _open(self) -> Any:
        from cronjob.db import database_errors, read_times_beyond_the_calendar

        with database_errors():
            conn = self._database.connect()
            if not self._checked:
                from cronjob.schema import require_schema

                require_schema(conn)
                self._checked = True
        read_times_beyond_the_calendar(conn)
        return conn

    def _give_back(self, conn: Any) -> None:
        from psycopg.pq import TransactionStatus

        if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
            conn.close()
        else:
            self._idle.put(conn)


@dataclass
class Dashboard:
    """Everything a page needs besides its request, shared by all of them."""

    settings: Settings
    connections: Connections
    templates: Any  # a jinja2.Environment
    csrf: CsrfTokens = field(default_factory=CsrfTokens)
    sessions: Sessions = field(default_factory=Sessions)
    throttle: Throttle = field(default_factory=Throttle)


def build(settings: Settings) -> Any:
    """The dashboard's ASGI application, guarded."""
    from starlette.applications import Starlette

    from cronjob.web import actions, pages

    routes = pages.routes() + (actions.routes() if settings.allow_actions else [])
    inner = Starlette(routes=routes, exception_handlers=pages.exception_handlers())
    dashboard = Dashboard(settings, Connections(settings), _templates())
    inner.state.dashboard = dashboard
    return Guard(inner, dashboard)


def _templates() -> Any:
    import jinja2

    from cronjob.web import present

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is text to show, whatever it holds
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(present.FILTERS)
    return environment


class Guard:
    """The ASGI layer in front of every page: the names it answers to, authentication, the
    login that actions need, the refusal of every change that is not an allowed action from
    the dashboard's own pages, and the security headers.
    """

    def __init__(self, app: Any, dashboard: Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_guarded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in {own for own, _ in SECURITY_HEADERS}
                ]
                message = {**message, "headers": [*headers, *SECURITY_HEADERS]}
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send_guarded)
            return
        await self.app(scope, receive, send_guarded)

    def _refusal(self, scope: dict[str, Any], headers: dict[str, str]) -> Any:
        """The response that refuses this request (or starts a login), or None to let it
        through; the names it answers to are checked before anything else."""
        settings = self.dashboard.settings
        allowed = settings.allowed_hosts
        if allowed is not None and not allowed.allows(headers.get("host"), scope["scheme"]):
            return _plain(
                "unknown host: this dashboard answers to its own names only"
                " (jobrunner web --allowed-host NAME adds one)",
                400,
            )
        host_user = scope.get("user")
        if host_user is not None and not getattr(host_user, "is_authenticated", False):
            return _plain("sign in to the application first", 403)
        refusal = self._authenticate(scope, headers)
        if refusal is None:
            refusal = self._login_link(scope)
        if refusal is not None:
            return refusal
        return self._action_refusal(scope, headers)

    def _authenticate(self, scope: dict[str, Any], headers: dict[str, str]) -> Any:
        """Basic authentication, when configured: every request gives it, and a client that
        failed too often is told to wait; the user proved, and a session of the login link,
        are put in the scope."""
        from cronjob.web.guard import SESSION_COOKIE

        settings = self.dashboard.settings
        if settings.basic_auth is not None:
            given = headers.get("authorization")
            wait = self._wait(scope)
            if wait:
                return _too_many(wait)
            user = settings.basic_auth.user_of(given)
            if user is None:
                if given:  # a browser's first request gives none: only a guess counts
                    self.dashboard.throttle.failed(_client(scope))
                return _plain(
                    "authentication required",
                    401,
                    {"WWW-Authenticate": 'Basic realm="jobrunner", charset="UTF-8"'},
                )
            scope["jobrunner.user"] = user
        if settings.login_token is not None:
            session = _cookie(headers.get("cookie"), SESSION_COOKIE)
            if self.dashboard.sessions.valid(session):
                scope["jobrunner.session"] = True
        return None

    def _login_link(self, scope: dict[str, Any]) -> Any:
        """`?token=...`, the link `jobrunner web` printed: a session cookie for this browser
        and the same page without the token (kept out of its history), or a refusal."""
        from urllib.parse import parse_qsl, urlencode

        from starlette.responses import RedirectResponse

        from cronjob.web.guard import SESSION_COOKIE, TOKEN_PARAMETER, token_matches

        token = self.dashboard.settings.login_token
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for name, value in query if name == TOKEN_PARAMETER]
        if token is None or not given or scope["method"] not in SAFE_METHODS:
            return None
        wait = self._wait(scope)
        if wait:
            return _too_many(wait)
        if len(given) != 1 or not token_matches(given[0], token):
            self.dashboard.throttle.failed(_client(scope))
            return _plain("wrong login token: use the link jobrunner web printed last", 403)
        rest = urlencode([(name, value) for name, value in query if name != TOKEN_PARAMETER])
        root = str(scope.get("root_path", ""))
        response = RedirectResponse(
            scope.get("path", "/") + (f"?{rest}" if rest else ""), status_code=303
        )
        response.set_cookie(
            SESSION_COOKIE,
            self.dashboard.sessions.issue(),
            path=root.rstrip("/") or "/",
            httponly=True,
            samesite="strict",
            secure=scope["scheme"] == "https",
        )
        return response

    def _action_refusal(self, scope: dict[str, Any], headers: dict[str, str]) -> Any:
        """Every change refused but an allowed action, posted from the dashboard's own pages
        by a known login; an action's page (the confirmation) needs the login too."""
        from cronjob.web.guard import same_origin

        settings = self.dashboard.settings
        method = scope["method"]
        is_action = _route_path(scope).startswith(ACTION_PREFIX)
        if method in SAFE_METHODS and not (is_action and settings.allow_actions):
            return None
        if method not in SAFE_METHODS and (
            not settings.allow_actions or not is_action or method != "POST"
        ):
            if not settings.allow_actions:
                return _plain(
                    "this dashboard is read-only (start it with --allow-actions)",
                    405,
                    {"Allow": "GET, HEAD"},
                )
            return _plain("only the dashboard's action forms may change anything", 403)
        if logged_in(scope) is None:
            return _plain(_login_needed(settings), 403)
        if method in SAFE_METHODS:
            return None
        allowed = settings.allowed_hosts
        if not same_origin(
            headers.get("origin"), headers.get("sec-fetch-site"), headers.get("host"), allowed
        ):
            return _plain("cross-site request refused", 403)
        return None

    def _wait(self, scope: dict[str, Any]) -> int:
        return self.dashboard.throttle.wait(_client(scope))


def _login_needed(settings: Settings) -> str:
    if settings.login_token is not None:
        return (
            "actions need a login: open the link jobrunner web printed when it started"
            " (it carries a token)"
        )
    return "actions need a known user: your application's authentication, or basic_auth"


def _plain(text: str, status: int, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import PlainTextResponse

    return PlainTextResponse(f"{text}\n", status_code=status, headers=headers)


def _too_many(wait: int) -> Any:
    return _plain(
        f"too many failed logins from this address: try again in {wait} s",
        429,
        {"Retry-After": str(wait)},
    )


def _client(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _cookie(header: str | None, name: str) -> str | None:
    from http.cookies import SimpleCookie

    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:
        return None
    found = jar.get(name)
    return found.value if found is not None else None


def _route_path(scope: dict[str, Any]) -> str:
    """The path below the dashboard's own prefix when it is mounted under one."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
