from __future__ import annotations

from datetime import UTC
from typing import Any

import click

from cronjob.cli import database_url_option, handlers_option
from cronjob.settings import Settings


@click.command()
@database_url_option
@handlers_option
def demo(database_url: str | None, handlers: str | None) -> None:
    """The quickstart: enqueue example jobs, define schedules, tick, and show what happened.

    Runs on the embedded PostgreSQL server unless a database URL is configured.
    One job succeeds, one fails and succeeds on its retry, two go dead; a global
    schedule makes one run and a tenant-scoped one a run per tenant. The demo
    schedules are removed afterwards (their runs stay).
    """
    from cronjob import store
    from cronjob.api import enqueue
    from cronjob.commands import load_handlers, open_database
    from cronjob.demo import DEMO_TENANTS_SQL
    from cronjob.handlers import registry
    from cronjob.tick import TickOptions, run_tick

    settings = Settings.build(database_url, handlers)
    load_handlers(settings)
    database, conn = open_database(settings)
    with conn:
        ids = [
            enqueue(conn, "demo.greet", {"name": "Ada"}),
            enqueue(conn, "demo.flaky", {"to": "ada@example.com"}),
            enqueue(conn, "demo.broken", {"invoice": "INV-?"}),
            enqueue(conn, "demo.broken", {"permanent": True}),
        ]
        click.echo(f"Enqueued {len(ids)} demo runs: {', '.join(map(str, ids))}.")
        scheduled = _define_schedules(conn)
        click.echo(
            "Defined two every-minute schedules, as if a minute ago: demo-greeting, and "
            "demo-digest for each tenant of\n"
            f"  {DEMO_TENANTS_SQL}\nTicking...\n"
        )
        specs = {t: s for t, s in registry().items() if t.startswith("demo.")}
        options = TickOptions(tenants_sql=DEMO_TENANTS_SQL, owns_process=False)
        report = run_tick(
            conn, specs, connect=database.connect, connect_async=database.connect_async,
            options=options,
        )  # fmt: skip
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
            if run.scheduled_for is not None:
                tenant = f" for tenant {run.tenant_id}" if run.tenant_id else ""
                at = run.scheduled_for.astimezone(UTC)
                story = story or f"scheduled for {at:%H:%M} UTC{tenant}, ran once, fine"
            click.echo(
                f"{run.id:>6}  {run.job_type:<12} {run.status.value:<10} "
                f"{run.attempts}/{run.max_attempts:<6}  {story or 'ran once, fine'}"
            )
    click.echo(
        "\nNext: `jobrunner show ID` explains a run, `jobrunner retry ID` brings a dead one back."
    )


DEMO_SCHEDULES = (
    ("demo-greeting", "demo.greet", "global", {"name": "cron"}),
    ("demo-digest", "demo.digest", "tenant", {}),
)


def _define_schedules(conn: Any) -> list[int]:
    """Define the demo schedules a minute in the past, so this minute's occurrence is due."""
    from contextlib import suppress
    from datetime import timedelta

    from cronjob import definitions, store
    from cronjob.errors import DefinitionNotFound

    clock = store.clock_now(conn)
    created = []
    for name, job_type, scope, payload in DEMO_SCHEDULES:
        with suppress(DefinitionNotFound):
            definitions.remove(conn, name)  # left over from an interrupted demo
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
