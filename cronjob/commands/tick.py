from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from cronjob.cli import Count, database_url_option, handlers_option, json_option
from cronjob.log import LEVELS
from cronjob.settings import (
    DEFAULT_ASYNC_CONCURRENCY,
    DEFAULT_CLAIM_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_MAX_RUNTIME,
    Settings,
)


def _set_capture_level(_ctx: click.Context, _param: click.Parameter, value: str) -> None:
    from cronjob import log

    log.set_capture_level(value)


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
            from cronjob.inputs import excerpt

            raise click.BadParameter(
                f"invalid {what} {excerpt(value)}: must be at least {minimum:g}s"
            )
        return seconds

    return convert


@click.command()
@database_url_option
@handlers_option
@click.option(
    "--concurrency",
    type=Count(1, 256),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Handler threads, for plain (def) handlers.",
)
@click.option(
    "--async-concurrency",
    type=click.IntRange(1, 10000),
    default=DEFAULT_ASYNC_CONCURRENCY,
    show_default=True,
    help="Coroutines of async def handlers run at once, on one event loop beside the threads.",
)
@click.option(
    "--batch-size",
    type=Count(1, 10000),
    default=DEFAULT_CLAIM_BATCH_SIZE,
    show_default=True,
    help="Most runs claimed, and finalized, per statement (and ten times this many due "
    "schedules materialized per transaction). A tick keeps about a second's work claimed "
    "beyond --concurrency, never more than this.",
)
@click.option(
    "--max-runtime",
    default=None,
    callback=_duration("max runtime"),
    help=f"Stop claiming after this long [default: {DEFAULT_MAX_RUNTIME:g}s, inside one cron "
    "minute; with --listen, to the end of the database clock's minute and 10s into the next, "
    "so that the crontab's `* * * * *` leaves no second without a tick].",
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
    "--queues",
    metavar="Q1,Q2",
    help="Django tasks: only run the tasks with runs waiting in these queues (a Task's "
    "queue_name); a task enqueued to several queues is then run from all of them.",
)
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
@click.option(
    "--listen",
    is_flag=True,
    help="Stay until --max-runtime, asleep on LISTEN, and claim as soon as a run becomes "
    "claimable or falls due, instead of ending when nothing is due.",
)
@click.option(
    "--listen-database-url",
    envvar="JOBRUNNER_LISTEN_DATABASE_URL",
    metavar="URL",
    help="With --listen: a direct session to LISTEN on, where the database URL goes through "
    "a pooler in transaction mode (LISTEN cannot work there: without this the tick polls "
    "every second, and says so). Keep the password out of this option, which ps shows: "
    "give it in JOBRUNNER_LISTEN_DATABASE_URL or ~/.pgpass.",
)
@click.option(
    "--capture-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    envvar="JOBRUNNER_CAPTURE_LEVEL",
    expose_value=False,
    callback=_set_capture_level,
    metavar="LEVEL",
    help="Least severe of a handler's log lines kept with its attempt, for `jobrunner show` "
    "and the dashboard: debug, info, warning, error [env: JOBRUNNER_CAPTURE_LEVEL]. Apart "
    "from --log-level, which says what stderr shows: at --log-level warning a handler's "
    "info lines are still kept.",
)
@json_option
def tick(
    database_url: str | None,
    handlers: str | None,
    concurrency: int,
    async_concurrency: int,
    batch_size: int,
    max_runtime: float | None,
    lease: float | None,
    grace: float,
    types: str | None,
    queues: str | None,
    tenants_sql: str | None,
    prune_older_than: float | None,
    metrics_textfile: str | None,
    listen: bool,
    listen_database_url: str | None,
    as_json: bool,
) -> None:
    """Run what is due: materialize schedules, claim, run handlers, record outcomes.

    Loops until nothing is due or --max-runtime is spent, then prints a one-line
    summary. Safe to run on many hosts at once, and to overlap with itself.
    SIGTERM or SIGINT: claim nothing more, let running handlers finish within
    --grace, hand back the rest (due again, attempt not counted), exit 0.

    What each handler logs, through ctx.log, structlog or the standard `logging` (any
    logger's records, warnings.warn too), is written to stderr at --log-level, with the
    run's id, type and attempt, and kept with its attempt at --capture-level (`jobrunner
    show ID`). With the `otel` extra and OTEL_* settings (OTEL_EXPORTER_OTLP_ENDPOINT, ...)
    the tick exports a span per attempt, in the enqueuer's trace; with the `sentry` extra
    and SENTRY_DSN it reports handlers' exceptions. Both are flushed before it exits.

    With --listen the tick stays until --max-runtime, asleep on LISTEN, and starts a run
    within milliseconds of its enqueue's commit, a delayed run or a schedule at its time.
    SIGTERM while it waits with nothing running exits at once (143); while handlers run,
    as above.
    """
    from cronjob import log
    from cronjob.commands import django_setup, load_handlers, open_database
    from cronjob.errors import ConnectionLost, DatabaseRefused
    from cronjob.handlers import require_types
    from cronjob.inputs import comma_list
    from cronjob.tick import TickOptions, run_tick

    max_runtime = _max_runtime(max_runtime, listen, listen_database_url)
    metrics_path = _metrics_path(metrics_textfile)
    settings = Settings.build(database_url, handlers, tenants_sql)
    # A Django project's tick runs its tasks; --queues selects some of them, so needs one.
    django = django_setup("--queues selects Django tasks" if queues else None)
    load_handlers(settings)
    log.route_standard_logging()  # after the app's modules: its own logging setup stands
    # Checked before connecting; a Django tick first learns which tasks have runs waiting.
    specs = None if django else require_types(comma_list(types) or None)
    options = TickOptions(
        concurrency=concurrency,
        async_concurrency=async_concurrency,
        batch_size=batch_size,
        max_runtime=max_runtime,
        grace=grace,
        lease=lease,
        tenants_sql=settings.tenants_sql,
        prune_older_than=prune_older_than,
        metrics_path=metrics_path,
        observers=_observers(django),
        listen=listen,
        listen_url=listen_database_url,
    )
    database, conn = open_database(settings)
    try:
        if specs is None:
            specs = _django_specs(conn, queues, types, listen=listen)
        report = run_tick(conn, specs, database=database, options=options)
    except (ConnectionLost, DatabaseRefused) as exc:
        log.get_logger().warning("tick stopped", **exc.report.summary())
        raise
    finally:
        conn.close()
    _finished(report, as_json)


def _django_specs(conn: Any, queues: str | None, types: str | None, *, listen: bool) -> Any:
    """The handlers of a Django project's tasks that have runs waiting (or, listening, of
    every task), as --queues and --types select them."""
    from cronjob.django.runner import task_handlers
    from cronjob.handlers import require_types
    from cronjob.inputs import comma_list

    tasks = task_handlers(conn, comma_list(queues) or None, every=listen)
    return require_types(comma_list(types) or None, tasks)


def _max_runtime(max_runtime: float | None, listen: bool, listen_url: str | None) -> float | None:
    """--max-runtime as given, else the default; a listening tick's default (None) is the
    rest of the database clock's minute and a little into the next (Steps.listen_until)."""
    if listen_url is not None and not listen:
        raise click.BadParameter("only with --listen", param_hint="--listen-database-url")
    if max_runtime is None and not listen:
        return DEFAULT_MAX_RUNTIME
    return max_runtime


def _metrics_path(metrics_textfile: str | None) -> Path | None:
    if metrics_textfile is None:
        return None
    from cronjob.commands.ops import textfile_path

    return textfile_path(metrics_textfile)


def _finished(report: Any, as_json: bool) -> None:
    from cronjob import log

    summary = report.summary()
    if report.stopped_listening:
        _stopped_listening(report, summary, as_json)
    log.info("tick finished", **summary)
    if as_json:
        click.echo(json.dumps(summary))
    if report.problems:
        # Everything else was done; a misconfiguration that silently skipped work is worse
        # than a failing cron line.
        from cronjob.errors import ScheduleProblems
        from cronjob.materialize import describe_problems

        raise ScheduleProblems(describe_problems(report.problems))
    if report.unclaimable:
        from cronjob.errors import TypesUnclaimable

        job_type, error = next(iter(sorted(report.unclaimable.items())))
        more = len(report.unclaimable) - 1
        raise TypesUnclaimable(
            f"the runs of limited job type {job_type!r} could not be claimed: {error}"
            + (f" (and {more} more type(s), see the log)" if more else "")
            + "; every other type was"
        )


def _stopped_listening(report: Any, summary: dict[str, Any], as_json: bool) -> None:
    """A signal while the tick waited with nothing in flight: one line, and the signal's exit."""
    import signal

    from cronjob.errors import Interrupted

    if as_json:
        click.echo(json.dumps(summary))
    name = report.stopped_by or "a signal"
    done = ", ".join(f"{key} {summary[key]}" for key in ("claimed", "succeeded", "failed", "dead"))
    raise Interrupted(
        f"tick stopped by {name} while listening, with nothing running ({done})",
        signum=int(getattr(signal.Signals, name, signal.SIGTERM)),
    )


def _observers(django: bool) -> Callable[[dict[str, Any]], Sequence[Any]]:
    """What watches the tick's attempts as configured (cronjob.observe), made once it has
    found work: an idle tick imports none of it."""

    def make(handlers: dict[str, Any]) -> Sequence[Any]:
        from cronjob.observe import observers

        return observers(handlers, django=django)

    return make
