from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import click

from cronjob.cli import database_url_option, handlers_option
from cronjob.errors import BadInput, JobrunnerError
from cronjob.settings import Settings


@click.command()
@click.option(
    "--write-to-configured-database",
    "write_configured",
    is_flag=True,
    help="Run on the database of --database-url, JOBRUNNER_DATABASE_URL or DATABASE_URL "
    "instead of the embedded server: the demo's runs (types demo.*) are written there and "
    "stay; its two schedules are added and removed.",
)
@database_url_option
@handlers_option
def demo(write_configured: bool, database_url: str | None, handlers: str | None) -> None:
    """The quickstart: enqueue example jobs, define schedules, tick, and show what happened.

    Runs on the embedded PostgreSQL server (as root, on a throwaway server run as
    the account nobody, removed afterwards), never on a configured database unless
    --write-to-configured-database says so. One job succeeds, one fails and
    succeeds on its retry, two go dead; a global schedule makes one run and a
    tenant-scoped one a run per tenant. Only the demo's own schedules are
    materialized, and they are removed afterwards (their runs stay).
    """
    from cronjob.commands import load_handlers

    if database_url and not write_configured:
        raise BadInput(
            "the demo writes example runs and schedules, so it runs on the embedded server: "
            "add --write-to-configured-database to run it on the database you named"
        )
    settings = Settings.build(database_url, handlers)
    load_handlers(settings)
    with contextlib.ExitStack() as stack:
        database, conn, throwaway = _demo_database(stack, settings, write_configured)
        _run_demo(database, conn)
    if throwaway:
        click.echo("\nThe demo's throwaway server is gone with its runs (it ran as root).")
    else:
        click.echo(
            "\nNext: `jobrunner show ID` explains a run, `jobrunner retry ID` brings a dead one "
            "back."
        )


def _demo_database(
    stack: contextlib.ExitStack, settings: Settings, write_configured: bool
) -> tuple[Any, Any, bool]:
    """Where the demo runs, connected and migrated; True when it is a throwaway server.

    As root the embedded server is refused (PostgreSQL will not run as root): the demo,
    which keeps nothing, runs on a throwaway server of its own instead, which SIGTERM
    and SIGINT stop and remove on their way out of the demo.
    """
    from cronjob.commands import open_database
    from cronjob.db import Database

    if write_configured:
        return (*open_database(settings), False)
    _require_embedded_server()
    if os.geteuid() != 0:
        return (*open_database(settings, embedded_only=True), False)
    from cronjob import embedded, log, migrate

    stop = stack.enter_context(_stopped_by_signals())
    database = Database(stack.enter_context(embedded.throwaway_server()), "throwaway")
    # Unwound before the server: a signal from here on waits for the server to go.
    stack.callback(stop.hold)
    conn = stack.enter_context(database.connect())
    migrate.apply(conn)
    log.info(
        "running as root: the demo runs on a throwaway server, as the account nobody, "
        "removed when it ends"
    )
    return database, conn, True


class _Stopped(BaseException):
    """A signal stopped the demo. Not an Exception, as KeyboardInterrupt is not: no
    `except Exception` between the signal and the server's removal may swallow it."""


class _Stop:
    """The first SIGTERM or SIGINT, raised where the demo is (once held, it waits for the
    block to end instead); later ones change nothing, so nothing interrupts the removal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.held = False

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        if self.signum is None:
            self.signum = signum
            if not self.held:
                raise _Stopped

    def hold(self) -> None:
        self.held = True


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[_Stop]:
    """SIGTERM and SIGINT stop the demo: the block unwinds (what it entered after this is
    stopped and removed), then one line, and exit 143 or 130, as the signal would."""
    import signal
    import threading

    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # only the main thread may handle signals: left as they are
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, stop.on_signal)
    try:
        yield stop
    except _Stopped:
        pass
    finally:
        stop.hold()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        click.echo(
            f"jobrunner: the demo was stopped ({name}): its throwaway server is stopped "
            "and removed",
            err=True,
        )
        raise click.exceptions.Exit(128 + stop.signum)


def _run_demo(database: Any, conn: Any) -> None:
    from cronjob import store
    from cronjob.api import enqueue
    from cronjob.demo import DEMO_TENANTS_SQL
    from cronjob.handlers import registry
    from cronjob.tick import TickOptions, run_tick

    with conn:
        scheduled = _define_schedules(conn)
        ids = [
            enqueue(conn, "demo.greet", {"name": "Ada"}),
            enqueue(conn, "demo.flaky", {"to": "ada@example.com"}),
            enqueue(conn, "demo.broken", {"invoice": "INV-?"}),
            enqueue(conn, "demo.broken", {"permanent": True}),
        ]
        click.echo(f"Enqueued {len(ids)} demo runs: {', '.join(map(str, ids))}.")
        click.echo(
            "Defined two every-minute schedules, as if a minute ago: demo-greeting, and "
            "demo-digest for each tenant of\n"
            f"  {DEMO_TENANTS_SQL}\nTicking...\n"
        )
        specs = {t: s for t, s in registry().items() if t.startswith("demo.")}
        options = TickOptions(
            tenants_sql=DEMO_TENANTS_SQL, owns_process=False, definitions=tuple(scheduled)
        )
        report = run_tick(conn, specs, database=database, options=options)
        ids += store.runs_list_ids_by_definition(conn, scheduled)
        _remove_schedules(conn)
        click.echo(
            f"\nTick done: materialized {report.materialized} scheduled runs, "
            f"claimed {report.claimed}, succeeded {report.succeeded}, "
            f"failed (will retry) {report.failed}, dead {report.dead}.\n"
        )
        click.echo(f"{'ID':>6}  {'TYPE':<12} {'STATUS':<10} {'ATTEMPTS':<8}  WHAT HAPPENED")
        for run_id in ids:
            run = store.run_get(conn, run_id)
            assert run is not None
            story = "; ".join(
                f"attempt {a.attempt}: {a.error_type}: {a.message}"
                for a in store.run_attempts_get(conn, run_id)
            )
            ran = "ran once, fine" if run.attempts else "not run by the tick"
            if run.scheduled_for is not None:
                tenant = f" for tenant {run.tenant_id}" if run.tenant_id else ""
                at = run.scheduled_for.astimezone(UTC)
                story = story or f"scheduled for {at:%H:%M} UTC{tenant}, {ran}"
            # A run no tick claimed has no attempt budget yet: its handler's is set at claim.
            budget = "-" if run.max_attempts is None else run.max_attempts
            click.echo(
                f"{run.id:>6}  {run.job_type:<12} {run.status.value:<10} "
                f"{run.attempts}/{budget:<6}  {story or ran}"
            )
        # Nothing of the demo's stays due: no tick without the demo's handlers would ever
        # run it, and on the embedded server, which persists, `check --max-queue-age` would
        # breach on it a week later.
        store.runs_cancel_many(conn, ids)
        click.echo("\nThe demo's unfinished runs are cancelled: nothing of it stays due here.")


DEMO_SCHEDULES = (
    ("demo-greeting", "demo.greet", "global", {"name": "cron"}),
    ("demo-digest", "demo.digest", "tenant", {}),
)


def _require_embedded_server() -> None:
    from cronjob import extras

    extras.require("embedded", "jobrunner demo (without --write-to-configured-database)")


def _define_schedules(conn: Any) -> list[int]:
    """Define the demo schedules a minute in the past, so this minute's occurrence is due.

    A schedule of the same name left by an interrupted demo (it runs a demo job type) is
    replaced; anyone else's is left alone, and the demo refuses to run.
    """
    from datetime import timedelta

    from cronjob import definitions, store
    from cronjob.errors import DefinitionNotFound

    clock = store.clock_now(conn)
    created = []
    for name, job_type, scope, payload in DEMO_SCHEDULES:
        try:
            existing = definitions.get(conn, name)
        except DefinitionNotFound:
            existing = None
        if existing is not None and existing.job_type != job_type:
            raise JobrunnerError(
                f"a schedule named {name} exists and is not the demo's (it runs "
                f"{existing.job_type!r}): the demo leaves it alone and stops here"
            )
        if existing is not None:
            definitions.remove(conn, name)
        spec = definitions.definition_spec(
            name, cron="* * * * *", job_type=job_type, scope=scope, payload=payload
        )
        created.append(definitions.add(conn, spec, now=clock - timedelta(seconds=61)).id)
    return created


def _remove_schedules(conn: Any) -> None:
    # Left in place, they would make a run every minute (and a tenant run needs a tenant
    # query) for every later tick on this database.
    from cronjob import definitions

    for name, *_ in DEMO_SCHEDULES:
        definitions.remove(conn, name)
