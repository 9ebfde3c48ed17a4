"""`jobrunner web`: serve the dashboard (cronjob.web) with uvicorn."""

from __future__ import annotations

import os

import click

from cronjob.cli import Count, database_url_option, tenants_sql_option
from cronjob.commands.incident import actor_option
from cronjob.errors import BadInput


@click.command()
@database_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=Count(1, 65535), default=8080, show_default=True)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Show the buttons that change state: retry, cancel, pause and resume a job type "
    "or a schedule, run a schedule now. Each is audited as the command line's own.",
)
@click.option(
    "--show-payloads", is_flag=True, help="Show runs' payloads (hidden by default; clipped)."
)
@click.option(
    "--basic-auth-env",
    metavar="VAR",
    help="Require HTTP basic authentication with the user:password held in the environment "
    "variable VAR (never on the command line, which ps shows).",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without authentication on an address other than loopback (logs a warning): "
    "for a dashboard behind a proxy that authenticates.",
)
@tenants_sql_option
@actor_option
def web(
    database_url: str | None,
    host: str,
    port: int,
    allow_actions: bool,
    show_payloads: bool,
    basic_auth_env: str | None,
    no_auth: bool,
    tenants_sql: str | None,
    actor: str | None,
) -> None:
    """Serve the dashboard: the queue at a glance, read-only unless --allow-actions.

    Listens on 127.0.0.1:8080. Any other address needs --basic-auth-env VAR, or --no-auth
    for a dashboard behind a proxy that authenticates. Imports no handler module.
    """
    from cronjob import log
    from cronjob.web.guard import is_loopback

    credentials = _credentials(basic_auth_env)
    if credentials is not None and no_auth:
        raise BadInput("give --basic-auth-env or --no-auth, not both")
    if credentials is None and not no_auth and not is_loopback(host):
        raise BadInput(
            f"--host {host} is reachable from other machines: protect the dashboard with "
            "--basic-auth-env VAR, or pass --no-auth if a proxy in front of it authenticates"
        )
    app = _app(database_url, allow_actions, show_payloads, credentials, tenants_sql, actor)
    if no_auth and not is_loopback(host):
        log.log_event("warning", "dashboard served without authentication", host=host, port=port)
    log.info(
        "dashboard listening",
        url=f"http://{_shown(host)}:{port}/",
        actions=allow_actions,
        payloads=show_payloads,
    )
    _serve(app, host, port)


def _credentials(variable: str | None) -> str | None:
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value or ":" not in value.strip(":"):
        raise BadInput(f"--basic-auth-env {variable}: the variable must hold user:password")
    return value


def _app(
    database_url: str | None,
    allow_actions: bool,
    show_payloads: bool,
    credentials: str | None,
    tenants_sql: str | None,
    actor: str | None,
) -> object:
    """The dashboard on the database every command uses, opened and checked once first."""
    from cronjob.commands import open_database
    from cronjob.settings import Settings

    try:
        import cronjob.web
    except ImportError as exc:
        raise BadInput(
            f"the dashboard needs the web extra (pip install 'pg-jobrunner[web]'): {exc}"
        ) from None
    database, conn = open_database(Settings.build(database_url))
    conn.close()
    return cronjob.web.app(
        database=database,
        allow_actions=allow_actions,
        show_payloads=show_payloads,
        actor=actor,
        basic_auth=credentials,
        tenants_sql=tenants_sql,
    )


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _serve(app: object, host: str, port: int) -> None:
    import logging

    import uvicorn

    # uvicorn's own log setup would write plain text beside jobrunner's lines: its records go
    # through jobrunner's log instead (cronjob.log).
    from cronjob.log import capture_library_logs

    capture_library_logs(("uvicorn", "uvicorn.error", "uvicorn.access"), level=logging.INFO)
    uvicorn.run(
        app, host=host, port=port, log_config=None, server_header=False, proxy_headers=False
    )
