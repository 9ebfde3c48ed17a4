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
from cronjob.web.guard import SECURITY_HEADERS, BasicAuth, CsrfTokens, same_origin

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
    actor: str | None = None  # who acts when no user is authenticated (--actor)
    basic_auth: BasicAuth | None = None
    tenants_sql: str | None = None  # for "run now" of a tenant-scoped schedule
    schema_checked: bool = False  # the database was opened and checked already


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
    """The ASGI layer in front of every page: authentication, the refusal of every change
    that is not an allowed action from the dashboard's own pages, and the security headers.
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

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_guarded)
            return
        await self.app(scope, receive, send_guarded)

    def _refusal(self, scope: dict[str, Any]) -> Any:
        """The response that refuses this request, or None to let it through."""
        from starlette.responses import PlainTextResponse

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        settings = self.dashboard.settings
        if settings.basic_auth is not None:
            user = settings.basic_auth.user_of(headers.get("authorization"))
            if user is None:
                return PlainTextResponse(
                    "authentication required\n",
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="jobrunner", charset="UTF-8"'},
                )
            scope["jobrunner.user"] = user
        method = scope["method"]
        path = _route_path(scope)
        if method in SAFE_METHODS:
            return None
        if not settings.allow_actions or not path.startswith(ACTION_PREFIX) or method != "POST":
            why = "this dashboard is read-only (start it with --allow-actions)"
            if settings.allow_actions:
                why = "only the dashboard's action forms may change anything"
            return PlainTextResponse(
                f"{why}\n",
                status_code=405 if not settings.allow_actions else 403,
                headers={"Allow": "GET, HEAD"} if not settings.allow_actions else {},
            )
        if not same_origin(
            headers.get("origin"), headers.get("sec-fetch-site"), headers.get("host")
        ):
            return PlainTextResponse("cross-site request refused\n", status_code=403)
        return None


def _route_path(scope: dict[str, Any]) -> str:
    """The path below the dashboard's own prefix when it is mounted under one."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
