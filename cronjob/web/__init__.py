"""The dashboard (extra `web`): the queue at a glance, and, when asked, the operator's actions.

`jobrunner web` serves it (its actions behind basic authentication or the login link it
prints); `app()` builds it as an ASGI application that a Starlette or FastAPI application
mounts under a prefix, behind its own authentication:

    from cronjob.web import app as jobrunner_dashboard
    api.mount("/jobs", jobrunner_dashboard(allow_actions=True))

Its parts: `application` (settings, the guard in front of every request, connections,
templates), `guard` (the names it answers to, authentication and its throttle, login
sessions, form tokens, the same-origin check, security headers),
`pages` (what each URL shows), `actions` (what a button changes, through the command line's
own functions), `present` and `charts` (how values and the last day are drawn), and
`templates/`, `static/` (served by the package itself: a stylesheet and one small script,
the auto-refresh; no CDN). Nothing here
imports handler modules, and nothing of the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cronjob.db import Database


def app(
    database_url: str | None = None,
    *,
    database: Database | None = None,
    allow_actions: bool = False,
    show_payloads: bool = False,
    show_logs: bool = False,
    actor: str | None = None,
    basic_auth: str | None = None,
    tenants_sql: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    login_token: str | None = None,
    trace_url_template: str | None = None,
    refresh_seconds: float = 5.0,
) -> Any:
    """The dashboard as an ASGI application.

    The database is `database`, else `database_url`, else found as every command finds it
    (JOBRUNNER_DATABASE_URL, a Django project's, DATABASE_URL, the embedded server). It is
    read-only unless `allow_actions`; payloads are hidden unless `show_payloads`, what
    handlers logged and tracebacks unless `show_logs`.

    Who may act, and is recorded as the actor: the `basic_auth` user (`"user:password"`,
    which every request must then give), else the user the host application authenticated
    (`scope["user"]`; one that is not authenticated is refused every page), else, in a
    browser that opened `?token=<login_token>`, `actor` (JOBRUNNER_ACTOR, user@host). With
    none of them, actions are refused. `allowed_hosts` (`name[:port]`, no port for any) are
    the names it answers to, and the origins its forms may come from; None leaves the check
    of names to the host application. `trace_url_template` (http or https, holding
    `{trace_id}`) links a run's trace id to a tracing UI. Pages that change reload themselves
    every `refresh_seconds` (0: never) unless the viewer pauses them.
    """
    from cronjob.web.application import Settings, build
    from cronjob.web.guard import AllowedHosts, BasicAuth

    if database is None:
        from cronjob.location import resolve_url

        database = Database(*resolve_url(database_url))
    if actor is not None:
        from cronjob.incident import actor_name

        actor = actor_name(actor)
    if tenants_sql is not None:
        from cronjob.inputs import check_tenants_sql

        tenants_sql = check_tenants_sql(tenants_sql)
    if trace_url_template is not None:
        from cronjob.web.present import checked_trace_url_template

        trace_url_template = checked_trace_url_template(trace_url_template)
    if refresh_seconds < 0:
        raise ValueError("refresh_seconds: 0 (never) or more")
    auth = BasicAuth.from_credentials(basic_auth) if basic_auth is not None else None
    if login_token is not None and len(login_token) < 16:
        raise ValueError("login_token: at least 16 characters")
    settings = Settings(
        database=database,
        allow_actions=allow_actions,
        show_payloads=show_payloads,
        show_logs=show_logs,
        actor=actor,
        basic_auth=auth,
        tenants_sql=tenants_sql,
        allowed_hosts=AllowedHosts.parse(allowed_hosts) if allowed_hosts is not None else None,
        login_token=login_token,
        trace_url_template=trace_url_template,
        refresh_seconds=refresh_seconds,
    )
    return build(settings)
