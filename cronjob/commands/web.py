"""`jobrunner web`: serve the dashboard (cronjob.web) with uvicorn."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

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
    "--show-logs",
    is_flag=True,
    help="Show what handlers logged and the last traceback on a run's page (hidden by "
    "default: a handler may log anything, card numbers and keys too). Error messages show "
    "either way.",
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
    "for a dashboard behind a proxy that authenticates. Actions still need the login link.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME[:PORT]",
    envvar="JOBRUNNER_WEB_ALLOWED_HOSTS",
    help="Another name the dashboard answers to (its Host header, and its forms' Origin), "
    "any port unless one is given; repeatable, or comma-separated [env: "
    "JOBRUNNER_WEB_ALLOWED_HOSTS]. It always answers to --host, localhost, 127.0.0.1 and "
    "[::1] with --port, and to no other name: a page of another (DNS rebinding) gets 400.",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="IPS",
    envvar="JOBRUNNER_WEB_FORWARDED_ALLOW_IPS",
    help="Comma-separated addresses of the proxies in front of the dashboard, whose "
    "X-Forwarded-Proto and X-Forwarded-For are believed [env: "
    "JOBRUNNER_WEB_FORWARDED_ALLOW_IPS]: behind TLS, cookies are then Secure, and failed "
    "logins are counted per client rather than per proxy. Without it they are ignored.",
)
@click.option(
    "--trace-url-template",
    metavar="URL",
    envvar="JOBRUNNER_WEB_TRACE_URL_TEMPLATE",
    help="Link each run's trace id to your tracing UI: an http(s) URL holding {trace_id}, "
    "e.g. 'https://grafana.internal/explore?traceId={trace_id}' (the id is URL-escaped) "
    "[env: JOBRUNNER_WEB_TRACE_URL_TEMPLATE]. Without it the id is shown unlinked.",
)
@click.option(
    "--refresh",
    "refresh_seconds",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often the overview, runs, run and batch pages reload themselves (0: never). "
    "Each page has a button that pauses it, remembered by the browser.",
)
@tenants_sql_option
@actor_option
def web(
    database_url: str | None,
    host: str,
    port: int,
    allow_actions: bool,
    show_payloads: bool,
    show_logs: bool,
    basic_auth_env: str | None,
    no_auth: bool,
    allowed_hosts: tuple[str, ...],
    forwarded_allow_ips: str | None,
    trace_url_template: str | None,
    refresh_seconds: float,
    tenants_sql: str | None,
    actor: str | None,
) -> None:
    """Serve the dashboard: the queue at a glance, read-only unless --allow-actions.

    Listens on 127.0.0.1:8080 and answers to that address and localhost only (see
    --allowed-host). Any other address needs --basic-auth-env VAR, or --no-auth for a
    dashboard behind a proxy that authenticates. With --allow-actions, actions need a
    login: basic authentication's, or else the link printed on stdout at start, whose
    token gives the browser that opens it a session; the audit names the basic
    authentication user, or --actor for the link's sessions. Ten failed logins from an
    address within 5 minutes make it wait (429). Imports no handler module.
    """
    from cronjob import extras, log

    extras.require("web", "jobrunner web")
    from cronjob.web.guard import is_loopback

    if trace_url_template is not None:
        from cronjob.web.present import checked_trace_url_template

        trace_url_template = checked_trace_url_template(trace_url_template)
    credentials = _checked_credentials(basic_auth_env, no_auth, host)
    names = _allowed_hosts(host, port, allowed_hosts)
    proxies = _proxies(forwarded_allow_ips)
    token = _login_token() if allow_actions and credentials is None else None
    options = {
        "allow_actions": allow_actions,
        "show_payloads": show_payloads,
        "show_logs": show_logs,
        "basic_auth": credentials,
        "tenants_sql": tenants_sql,
        "actor": actor,
        "allowed_hosts": names,
        "login_token": token,
        "trace_url_template": trace_url_template,
        "refresh_seconds": refresh_seconds,
    }
    app = _app(database_url, options)
    if no_auth and not is_loopback(host):
        log.log_event("warning", "dashboard served without authentication", host=host, port=port)
    if host in WILDCARDS and not allowed_hosts:
        log.log_event(
            "warning",
            "dashboard answers to this machine's loopback names only: give --allowed-host "
            "NAME for each name its users reach it by",
            host=host,
        )
    url = f"http://{_shown(host)}:{port}/"
    log.info(
        "dashboard listening",
        url=url,
        actions=allow_actions,
        login=_login_kind(allow_actions, credentials),
        payloads=show_payloads,
        logs=show_logs,
    )
    if token is not None:
        # On stdout, not in the log: the link is a secret, and logs travel further.
        click.echo(f"{url}?token={token}")
    _serve(app, host, port, proxies)


def _checked_credentials(basic_auth_env: str | None, no_auth: bool, host: str) -> str | None:
    """Basic authentication's credentials, if given; a dashboard other machines reach has
    them, or --no-auth."""
    from cronjob.web.guard import is_loopback

    credentials = _credentials(basic_auth_env)
    if credentials is not None and no_auth:
        raise BadInput("give --basic-auth-env or --no-auth, not both")
    if credentials is None and not no_auth and not is_loopback(host):
        raise BadInput(
            f"--host {host} is reachable from other machines: protect the dashboard with "
            "--basic-auth-env VAR, or pass --no-auth if a proxy in front of it authenticates"
        )
    return credentials


# Addresses that listen on every interface: what names clients use cannot be known.
WILDCARDS = frozenset({"0.0.0.0", "::", "[::]"})


def _allowed_hosts(host: str, port: int, given: tuple[str, ...]) -> list[str]:
    """The names the dashboard answers to: its own, and --allowed-host's (comma- or
    space-separated too, as the environment variable holds them); BadInput for a bad one."""
    from cronjob.web.guard import AllowedHosts

    extra = [name for value in given for name in re.split(r"[,\s]+", value) if name]
    try:
        allowed = AllowedHosts.of_server(host, port, extra)
    except ValueError as exc:
        raise BadInput(f"invalid --allowed-host: {exc}") from None
    return [n.name if n.port is None else f"{n.name}:{n.port}" for n in allowed.names]


def _proxies(value: str | None) -> str | None:
    """--forwarded-allow-ips, as uvicorn reads it: addresses or networks, or `*`."""
    import ipaddress

    if value is None:
        return None
    items = [item.strip() for item in value.split(",") if item.strip()]
    for item in items:
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise BadInput(
                f"invalid --forwarded-allow-ips {item[:100]!r}: expected IP addresses or "
                "networks, comma-separated, or *"
            ) from None
    if not items:
        raise BadInput("invalid --forwarded-allow-ips: empty")
    return ",".join(items)


def _login_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def _login_kind(allow_actions: bool, credentials: str | None) -> str | None:
    if not allow_actions:
        return None
    return "basic authentication" if credentials is not None else "the link printed on stdout"


def _credentials(variable: str | None) -> str | None:
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value or ":" not in value.strip(":"):
        raise BadInput(f"--basic-auth-env {variable}: the variable must hold user:password")
    return value


def _app(database_url: str | None, options: dict[str, Any]) -> object:
    """The dashboard on the database every command uses, opened and checked once first."""
    from cronjob.commands import open_database
    from cronjob.settings import Settings

    try:
        import cronjob.web
    except ImportError:
        from cronjob.extras import missing_line

        raise BadInput(missing_line("web", "jobrunner web")) from None
    database, conn = open_database(Settings.build(database_url))
    conn.close()
    return cronjob.web.app(database=database, **options)


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _serve(app: object, host: str, port: int, proxies: str | None) -> None:
    import uvicorn

    # uvicorn's own log setup would write plain text beside jobrunner's lines: its records go
    # through jobrunner's log instead (cronjob.log).
    from cronjob.log import capture_library_logs

    capture_library_logs(("uvicorn", "uvicorn.error", "uvicorn.access"), level=logging.INFO)
    logging.getLogger("uvicorn.access").addFilter(_HideLoginToken())
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        server_header=False,
        proxy_headers=proxies is not None,
        forwarded_allow_ips=proxies,
    )


class _HideLoginToken(logging.Filter):
    """The access log line of the login link, its token left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 2 and isinstance(args[2], str):
            path = re.sub(r"([?&]token=)[^&#]*", r"\1***", args[2])
            record.args = (*args[:2], path, *args[3:])
        return True
