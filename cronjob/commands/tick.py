from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cronjob.cli import database_url_option, handlers_option, json_option
from cronjob.report import TickReport
from cronjob.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_MAX_RUNTIME,
    Settings,
)


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
@database_url_option
@handlers_option
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
    help="Most runs claimed, and finalized, per statement; due schedules materialized per "
    "transaction. A tick keeps about a second's work claimed beyond --concurrency, never more "
    "than this.",
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
@click.option(
    "--prune-older-than",
    default=None,
    callback=_duration("--prune-older-than"),
    metavar="DURATION",
    help="After a tick that emptied the queue, delete finished runs older than this "
    "(a few batches at most; `jobrunner prune` does the rest). Off by default.",
)
@click.option(
    "--metrics-textfile",
    metavar="PATH",
    help="At the end of the tick, write `jobrunner metrics` output to PATH atomically.",
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
    prune_older_than: float | None,
    metrics_textfile: str | None,
    as_json: bool,
) -> None:
    """Run what is due: materialize schedules, claim, run handlers, record outcomes.

    Loops until nothing is due or --max-runtime is spent, then prints a one-line
    summary. Safe to run on many hosts at once, and to overlap with itself.
    SIGTERM or SIGINT: claim nothing more, let running handlers finish within
    --grace, hand back the rest (due again, attempt not counted), exit 0.
    """
    from cronjob import log
    from cronjob.commands import load_handlers, open_database
    from cronjob.handlers import require_types
    from cronjob.waiting import work_waiting

    metrics_path = None
    if metrics_textfile is not None:
        from cronjob.commands.ops import textfile_path

        metrics_path = textfile_path(metrics_textfile)
    settings = Settings.build(database_url, handlers, tenants_sql)
    load_handlers(settings)
    specs = require_types([t.strip() for t in types.split(",") if t.strip()] if types else None)
    problems: list[Any] = []
    database, conn = open_database(settings)
    try:
        if work_waiting(conn, specs):
            report, conn, problems = _run_tick(
                conn, database, specs, settings,
                concurrency=concurrency, batch_size=batch_size, max_runtime=max_runtime,
                grace=grace, lease=lease,
            )  # fmt: skip
        else:
            # Nothing due anywhere: the tick machinery is not even imported.
            report = TickReport()
        after = _after_tick(conn, report, prune_older_than, metrics_path)
    finally:
        conn.close()
    summary = {**report.summary(), **after}
    log.info("tick finished", **summary)
    if as_json:
        click.echo(json.dumps(summary))
    if problems:
        # Everything else was done; a misconfiguration that silently skipped work is worse
        # than a failing cron line.
        from cronjob.errors import ScheduleProblems
        from cronjob.materialize import describe_problems

        raise ScheduleProblems(describe_problems(problems))


def _run_tick(
    conn: Any, database: Any, specs: dict[str, Any], settings: Settings, **options: Any
) -> tuple[TickReport, Any, list[Any]]:
    """The full tick; returns its report, the connection it ended with, schedule problems."""
    import gc

    from cronjob.errors import ConnectionLost
    from cronjob.log import get_logger
    from cronjob.materialize import BATCH_FACTOR, Materializer
    from cronjob.tick import Tick, TickOptions

    tick_options = TickOptions(**options)
    materializer = Materializer(
        tenants_sql=settings.tenants_sql,
        now=tick_options.now,
        batch_size=tick_options.batch_size * BATCH_FACTOR,
    )
    ticker = Tick(
        conn, specs, connect=database.connect, options=tick_options,
        steps_before_claim=[materializer],
    )  # fmt: skip
    # What is loaded by now (libraries, handler modules) lives as long as the
    # process: kept out of the cyclic collector's passes, which a busy tick
    # otherwise pays for every few thousand runs.
    gc.freeze()
    try:
        report = ticker.run()
    except ConnectionLost as exc:
        get_logger().warning("tick stopped", **exc.report.summary())
        if ticker.conn is not conn:  # the caller closes the one it opened
            ticker.conn.close()
        raise
    # A new connection if the tick had to reconnect.
    return report, ticker.conn, materializer.problems


def _after_tick(
    conn: Any, report: TickReport, prune_older_than: float | None, metrics_path: Path | None
) -> dict[str, Any]:
    """Housekeeping once the work is done. Its failures are logged, never the tick's."""
    from cronjob.log import get_logger

    done: dict[str, Any] = {}
    # Pruning waits for a tick that drained the queue: one stopped by a signal
    # or by --max-runtime has better things to do with its time.
    if prune_older_than is not None and report.stopped_by is None:
        from cronjob.prune import TICK_MAX_BATCHES, prune_runs

        try:
            pruned = prune_runs(conn, older_than=prune_older_than, max_batches=TICK_MAX_BATCHES)
            done["pruned"] = pruned.total
        except Exception as exc:
            get_logger().error("pruning after the tick failed", error=_describe(exc))
    if metrics_path is not None:
        from cronjob.commands.ops import write_metrics
        from cronjob.metrics import collect

        try:
            write_metrics(metrics_path, collect(conn))
        except Exception as exc:
            get_logger().error(
                "writing metrics after the tick failed",
                path=str(metrics_path),
                error=_describe(exc),
            )
    return done


def _describe(exc: BaseException) -> str:
    from cronjob.db import describe

    return describe(exc)
