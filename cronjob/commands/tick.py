from __future__ import annotations

import json

import click

from cronjob.cli import database_options, json_option
from cronjob.settings import Settings
from cronjob.tick import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_GRACE, DEFAULT_MAX_RUNTIME


def _duration(what: str, minimum: float = 0.0):
    def convert(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
        if value is None:
            return None
        from cronjob.errors import BadInput
        from cronjob.inputs import parse_duration

        try:
            seconds = parse_duration(value, what=what)
        except BadInput as exc:
            raise click.BadParameter(str(exc)) from None
        if seconds < minimum:
            raise click.BadParameter(f"invalid {what} {value!r}: must be at least {minimum:g}s")
        return seconds

    return convert


@click.command()
@database_options
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Handler threads.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10000),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Runs claimed, and finalized, per statement.",
)
@click.option(
    "--max-runtime",
    default=f"{DEFAULT_MAX_RUNTIME:g}s",
    show_default=True,
    callback=_duration("max runtime"),
    help="Stop claiming after this long (fits inside one cron minute).",
)
@click.option(
    "--lease",
    default=None,
    callback=_duration("lease", minimum=1.0),
    help="Lease for every run claimed, overriding each handler's own (default 2m "
    "unless the handler sets one). Heartbeats renew it every third of its length.",
)
@click.option(
    "--grace",
    default=f"{DEFAULT_GRACE:g}s",
    show_default=True,
    callback=_duration("grace"),
    help="On SIGTERM/SIGINT, how long running handlers may finish before "
    "their runs are handed back.",
)
@click.option("--types", metavar="T1,T2", help="Only claim these job types.")
@click.option(
    "--tenants-sql",
    envvar="JOBRUNNER_TENANTS_SQL",
    metavar="SQL",
    help="Query whose first column lists tenant ids, for tenant-scoped "
    "schedules [env: JOBRUNNER_TENANTS_SQL].",
)
@json_option
def tick(
    database_url: str | None,
    handlers: str | None,
    concurrency: int,
    batch_size: int,
    max_runtime: float,
    lease: float | None,
    grace: float,
    types: str | None,
    tenants_sql: str | None,
    as_json: bool,
) -> None:
    """Run what is due: materialize schedules, claim, run handlers, record outcomes.

    Loops until nothing is due or --max-runtime is spent, then prints a one-line
    summary. Safe to run on many hosts at once, and to overlap with itself.
    SIGTERM or SIGINT: claim nothing more, let running handlers finish within
    --grace, hand back the rest (due again, attempt not counted), exit 0.
    """
    from cronjob.commands import load_handlers, open_database
    from cronjob.errors import ConnectionLost
    from cronjob.handlers import require_types
    from cronjob.log import get_logger
    from cronjob.tick import Tick, TickOptions

    settings = Settings.build(database_url, handlers, tenants_sql)
    load_handlers(settings)
    specs = require_types([t.strip() for t in types.split(",") if t.strip()] if types else None)
    database, conn = open_database(settings)
    try:
        options = TickOptions(
            concurrency=concurrency,
            batch_size=batch_size,
            max_runtime=max_runtime,
            grace=grace,
            lease=lease,
        )
        ticker = Tick(
            conn,
            specs,
            connect=database.connect,
            connect_handler_db=database.connect_for_handler,
            options=options,
        )
        try:
            report = ticker.run()
        except ConnectionLost as exc:
            get_logger().warning("tick stopped", **exc.report.summary())
            raise
        finally:
            ticker.conn.close()
    finally:
        conn.close()
    summary = report.summary()
    get_logger().info("tick finished", **summary)
    if as_json:
        click.echo(json.dumps(summary))
