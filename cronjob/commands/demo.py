from __future__ import annotations

import click

from cronjob.cli import database_options
from cronjob.settings import Settings


@click.command()
@database_options
def demo(database_url: str | None, handlers: str | None) -> None:
    """The quickstart: enqueue example jobs, tick, and show what happened.

    Runs on the embedded PostgreSQL server unless a database URL is configured.
    One job succeeds, one fails and succeeds on its retry, two go dead.
    """
    import cronjob.demo  # noqa: F401 - registers the demo handlers
    from cronjob.api import enqueue
    from cronjob.commands import load_handlers, open_database
    from cronjob.handlers import registry
    from cronjob.store import run_attempts_get, run_get
    from cronjob.tick import Tick, TickOptions

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
        click.echo(f"Enqueued {len(ids)} demo runs: {', '.join(map(str, ids))}. Ticking...\n")
        specs = {t: s for t, s in registry().items() if t.startswith("demo.")}
        report = Tick(
            conn, specs, connect=database.connect, options=TickOptions(handle_signals=False)
        ).run()
        click.echo(
            f"\nTick done: claimed {report.claimed}, succeeded {report.succeeded}, "
            f"failed (will retry) {report.failed}, dead {report.dead}.\n"
        )
        click.echo(f"{'ID':>6}  {'TYPE':<12} {'STATUS':<10} {'ATTEMPTS':<8}  WHAT HAPPENED")
        for run_id in ids:
            run = run_get(conn, run_id)
            assert run is not None
            story = "; ".join(
                f"attempt {a.attempt}: {a.error_type}: {a.message}"
                for a in run_attempts_get(conn, run_id)
            )
            click.echo(
                f"{run.id:>6}  {run.job_type:<12} {run.status.value:<10} "
                f"{run.attempts}/{run.max_attempts:<6}  {story or 'ran once, fine'}"
            )
    click.echo(
        "\nNext: `jobrunner show ID` explains a run, `jobrunner retry ID` brings a dead one back."
    )
