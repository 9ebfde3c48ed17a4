"""Commands for operating jobrunner: status, metrics, check."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from cronjob.cli import Count, database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.render import clip, iso, table, when
from cronjob.errors import BadInput
from cronjob.inputs import excerpt
from cronjob.text import printable

SCHEDULES_SHOWN = 20


def _seconds(value: str | None, what: str) -> float | None:
    from cronjob.inputs import parse_duration

    return None if value is None else parse_duration(value, what=what)


def textfile_path(value: str) -> Path:
    """A path for an atomically replaced file; its directory must exist already."""
    path = Path(value).expanduser()
    if not value.strip() or path.name in ("", ".", ".."):
        raise BadInput(f"invalid metrics textfile {excerpt(value)}: expected a file path")
    if not path.parent.is_dir():
        # The directory is not named on its own: a path made of a URL loses the // that
        # shows where the URL's password is, and the value's excerpt names it anyway.
        raise BadInput(f"invalid metrics textfile {excerpt(value)}: its directory does not exist")
    if path.is_dir():
        raise BadInput(f"invalid metrics textfile {excerpt(value)}: it is a directory")
    return path


# -- status -------------------------------------------------------------------


@click.command()
@database_url_option
@click.option(
    "--unclaimed-after",
    default="10m",
    show_default=True,
    metavar="DURATION",
    help="Report job types whose runs have been due this long with none of their runs "
    "started in that time.",
)
@json_option
def status(database_url: str | None, unclaimed_after: str, as_json: bool) -> None:
    """How the queue is doing: runs by status and type, oldest due run, stuck and
    dead runs, job types nobody claims, what holds back cleanup (the oldest snapshot),
    which sessions hold jobrunner's locks, and when each schedule fires next."""
    from cronjob import horizon, locks, store
    from cronjob.health import read_overview
    from cronjob.inputs import parse_duration
    from cronjob.settings import LISTENING_TICK_STALE

    after = parse_duration(unclaimed_after, what="--unclaimed-after")
    conn = open_connection(database_url)
    with conn:
        overview = read_overview(conn)
        schedules = store.definitions_list_schedules(conn)
        health = _health(store.definitions_list_health(conn))
        holders = horizon.read_holders(conn)[: horizon.HOLDERS_SHOWN]
        held = locks.read_held(conn)
        unhandled = store.handlers_seen_missing_due(conn, [], most=NO_HANDLER_SHOWN)
        ticks = store.ticks_list(conn, stale=LISTENING_TICK_STALE)
    if as_json:
        found = _status_dict(overview, schedules, after, health)
        found["snapshot_holders"] = [horizon.as_json(h) for h in holders]
        found["advisory_locks"] = [locks.held_json(x) for x in held]
        found["no_handler_seen_job_types"] = unhandled
        found["ticks"] = [{k: iso(v) for k, v in vars(t).items()} for t in ticks]
        click.echo(json.dumps(found, indent=2))
    else:
        _print_status(overview, schedules, after, health, holders, held, ticks)
        _fact(
            "no handler seen",
            ", ".join(clip(t, 60) for t in unhandled)
            + ": due, and no tick has had a handler for them in the last hour (load them "
            "with --handlers, JOBRUNNER_HANDLERS, entry points or --handlers-path)"
            if unhandled
            else "none",
            problem=bool(unhandled),
        )


# How many job types with due runs and no handler seen `status` names.
NO_HANDLER_SHOWN = 20


def _health(rows: list[Any]) -> dict[str, Any]:
    """Each schedule's staleness verdict, by name."""
    from cronjob.staleness import assess

    return {row.name: assess(row) for row in rows}


def _status_dict(
    overview: Any, schedules: list[Any], after: float, health: dict[str, Any]
) -> dict[str, Any]:
    oldest = overview.oldest_due
    return {
        "now": overview.now.isoformat(),
        "runs": overview.by_status,
        "total": overview.total,
        "due": overview.due,
        "oldest_due_age_seconds": _rounded(overview.oldest_due_age),
        "oldest_due_job_type": oldest.job_type if oldest else None,
        "expired_leases": overview.expired_leases,
        "dead": overview.dead,
        "job_types": {
            t.job_type: {
                "runs": t.by_status,
                "due": t.due,
                "oldest_due_age_seconds": _rounded(t.oldest_due_age),
                "expired_leases": t.expired_leases,
                "last_started_at": iso(t.last_started_at),
            }
            for t in overview.types
        },
        "paused_job_types": _pauses_json(overview.paused),
        "throttled_job_types": _throttled_json(overview),
        "unclaimed_after_seconds": after,
        "unclaimed_job_types": [
            {
                "job_type": t.job_type,
                "due": t.due,
                "oldest_due_age_seconds": _rounded(t.oldest_due_age),
                "last_started_at": iso(t.last_started_at),
            }
            for t in overview.unclaimed(after)
        ],
        "schedules": [
            {
                "name": d.name,
                "job_type": d.job_type,
                "schedule": d.schedule,
                "timezone": d.timezone,
                "enabled": d.enabled,
                "next_fire_at": iso(d.next_fire_at),
                **_health_dict(health.get(d.name)),
            }
            for d in schedules
        ],
    }


def _throttled_json(overview: Any) -> list[dict[str, Any]]:
    from cronjob import limits

    due = {t.job_type: t.due for t in overview.types}
    return [
        {
            "job_type": x.job_type,
            "due": due.get(x.job_type, 0),
            "concurrency": x.concurrency,
            "rate": limits.rate_text(x),
            "per": limits.per_text(x),
            "reason": x.reason,
        }
        for x in overview.throttled
    ]


def _pauses_json(pauses: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "job_type": p.job_type,
            "reason": p.reason,
            "paused_by": p.paused_by,
            "paused_at": iso(p.paused_at),
        }
        for p in pauses
    ]


def _health_dict(verdict: Any) -> dict[str, Any]:
    if verdict is None:
        return {}
    return {
        "last_success_at": iso(verdict.last_success_at),
        "last_failure_at": iso(verdict.last_failure_at),
        "stale": verdict.stale,
    }


def _print_status(
    overview: Any,
    schedules: list[Any],
    after: float,
    health: dict[str, Any],
    holders: Any,
    held: Any,
    ticks: Sequence[Any] = (),
) -> None:
    from cronjob.health import seconds_text
    from cronjob.horizon import status_lines

    click.echo(f"jobrunner status at {when(overview.now)}")
    click.echo()
    _print_counts(overview)
    click.echo()
    oldest = overview.oldest_due
    _fact(
        "oldest due run",
        f"waiting {seconds_text(oldest.oldest_due_age)} ({oldest.job_type})"
        if oldest
        else "nothing is waiting",
    )
    stuck = overview.expired_leases
    _fact(
        "stuck runs",
        f"{stuck} running with an expired lease: no tick has rescued them, are ticks running?"
        if stuck
        else "none",
        problem=bool(stuck),
    )
    dead = overview.dead
    _fact(
        "dead runs",
        f"{dead}: see `jobrunner list --status dead`, then `jobrunner show ID`" if dead else "none",
        problem=bool(dead),
    )
    _print_paused(overview)
    _print_throttled(overview)
    unclaimed = overview.unclaimed(after)
    if unclaimed:
        for i, t in enumerate(unclaimed):
            started = (
                f"last started {when(t.last_started_at)}" if t.last_started_at else "never started"
            )
            _fact(
                "unclaimed types" if i == 0 else "",
                f"{t.job_type}: {t.due} due, oldest waiting {seconds_text(t.oldest_due_age)}, "
                f"{started}",
                problem=True,
            )
        _fact(
            "",
            f"(due over {seconds_text(after)} with no run started since: does any tick "
            "load a handler for it?)",
        )
    else:
        _fact("unclaimed types", "none")
    stale = [v for v in health.values() if v.stale and v.enabled]
    _fact(
        "stale schedules",
        "; ".join(v.detail for v in stale) if stale else "none",
        problem=bool(stale),
    )
    for i, line in enumerate(status_lines(holders)):
        _fact("oldest snapshot" if i == 0 else "", line)
    _print_held_locks(held)
    _print_ticks(ticks, overview.now)
    click.echo()
    _print_schedules(schedules, overview.now)


def _print_held_locks(held: Any) -> None:
    """Sessions holding jobrunner's locks: a key's lock held for long holds its runs back."""
    from cronjob.locks import HELD_SHOWN, held_text

    if not held:
        _fact("held locks", "none")
        return
    for i, lock in enumerate(held[:HELD_SHOWN]):
        _fact("held locks" if i == 0 else "", held_text(lock))
    if len(held) > HELD_SHOWN:
        _fact("", f"… and {len(held) - HELD_SHOWN} more (`status --json` lists all)")


def _print_counts(overview: Any) -> None:
    from cronjob.health import seconds_text
    from cronjob.models import Status

    if not overview.types:
        click.echo("no runs")
        return
    headers = ("JOB TYPE", *(s.value.upper() for s in Status), "DUE", "OLDEST DUE", "STUCK")
    rows = [
        (
            t.job_type,
            *(str(t.by_status[s.value]) for s in Status),
            str(t.due),
            seconds_text(t.oldest_due_age) if t.oldest_due_age is not None else "-",
            str(t.expired_leases),
        )
        for t in overview.types
    ]
    age = overview.oldest_due_age
    rows.append(
        (
            "total",
            *(str(overview.by_status[s.value]) for s in Status),
            str(overview.due),
            seconds_text(age) if age is not None else "-",
            str(overview.expired_leases),
        )
    )
    table(headers, rows, right_from=1, bold_header=True)


def _print_schedules(schedules: list[Any], now: Any) -> None:
    if not schedules:
        click.echo("no schedules")
        return
    click.echo(f"schedules ({len(schedules)}):")
    rows = [
        (
            d.name,
            d.job_type,
            d.schedule,
            d.timezone,
            _next_fire(d, now),
            "yes" if d.enabled else "paused",
        )
        for d in schedules[:SCHEDULES_SHOWN]
    ]
    table(("NAME", "TYPE", "SCHEDULE", "TIMEZONE", "NEXT FIRE", "ENABLED"), rows, bold_header=True)
    if len(schedules) > SCHEDULES_SHOWN:
        click.echo(f"… and {len(schedules) - SCHEDULES_SHOWN} more (`status --json` lists all)")


def _print_paused(overview: Any) -> None:
    from cronjob.health import pause_text

    if not overview.paused:
        _fact("paused types", "none")
        return
    due = {t.job_type: t.due for t in overview.types}
    for i, p in enumerate(overview.paused):
        _fact(
            "paused types" if i == 0 else "",
            f"{pause_text(p, overview.now)} ({due.get(p.job_type, 0)} due, "
            f"waiting; `jobrunner resume {p.job_type}`)",
            problem=True,
        )


def _print_ticks(ticks: Sequence[Any], now: Any) -> None:
    """The ticks that stay (`tick --listen`): each with its host, and since when it listens."""
    from cronjob.health import seconds_text

    if not ticks:
        _fact("listening ticks", "none (ticks end when nothing is due)")
        return
    for i, t in enumerate(ticks):
        since = t.listening_since or t.started_at
        how = "listening" if t.listening_since else f"polling every {t.poll_interval:g}s"
        age = seconds_text(max(0.0, (now - since).total_seconds()))
        _fact(
            "listening ticks" if i == 0 else "",
            f"{t.host} (pid {t.pid}): {how} since {when(since)} ({age})",
        )


def _print_throttled(overview: Any) -> None:
    from cronjob.health import throttle_text

    if not overview.throttled:
        _fact("throttled types", "none")
        return
    due = {t.job_type: t.due for t in overview.types}
    for i, limit in enumerate(overview.throttled):
        _fact(
            "throttled types" if i == 0 else "",
            f"{throttle_text(limit)} ({due.get(limit.job_type, 0)} due, waiting for a place "
            "or a window; `jobrunner limits`)",
        )


def _next_fire(definition: Any, now: Any) -> str:
    from cronjob.health import seconds_text

    fire_at = definition.next_fire_at
    if fire_at is None:
        return "-"
    try:
        from zoneinfo import ZoneInfo

        local = fire_at.astimezone(ZoneInfo(definition.timezone))
    except Exception:
        local = fire_at
    delta = (fire_at - now).total_seconds()
    relative = f"in {seconds_text(delta)}" if delta >= 0 else f"{seconds_text(-delta)} ago"
    return f"{local.strftime('%Y-%m-%d %H:%M%z')} ({relative})"


def _fact(label: str, text: str, *, problem: bool = False) -> None:
    label_text = f"{label}:" if label else ""
    text = printable(text)
    click.echo(f"{label_text:<17}" + (click.style(text, fg="red", bold=True) if problem else text))


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


# -- metrics ------------------------------------------------------------------


@click.command()
@database_url_option
@click.option(
    "--textfile",
    metavar="PATH",
    help="Write to PATH atomically (temporary file + rename) instead of stdout, for "
    "node_exporter's textfile collector; name it *.prom.",
)
def metrics(database_url: str | None, textfile: str | None) -> None:
    """Print the queue's metrics in the Prometheus text format."""
    from cronjob import metrics as exposition

    path = textfile_path(textfile) if textfile is not None else None
    conn = open_connection(database_url)
    with conn:
        text = exposition.collect(conn)
    if path is None:
        click.echo(text, nl=False)
    else:
        write_metrics(path, text)


def write_metrics(path: Path, text: str) -> None:
    from cronjob import metrics as exposition
    from cronjob.errors import JobrunnerError

    try:
        exposition.write_textfile(path, text)
    except OSError as exc:
        raise JobrunnerError(f"cannot write metrics to {path}: {exc.strerror or exc}") from None


# -- check --------------------------------------------------------------------


@click.command()
@database_url_option
@click.option(
    "--max-queue-age",
    metavar="DURATION",
    help="Breached when the oldest due run has waited longer than this.",
)
@click.option(
    "--max-stuck",
    type=Count(0),
    metavar="N",
    help="Breached when more than N running runs have an expired lease.",
)
@click.option(
    "--max-dead",
    type=Count(0),
    metavar="N",
    help="Breached when more than N runs are dead (and not yet pruned).",
)
@click.option(
    "--stale-schedules",
    is_flag=True,
    help="Breached when a schedule's due occurrences have not succeeded within its window "
    "(its expect_within, or two intervals plus the lease); names each one.",
)
@click.option(
    "--include-paused",
    is_flag=True,
    help="With --stale-schedules: look at paused schedules too.",
)
@click.option(
    "--max-snapshot-age",
    metavar="DURATION",
    help="Breached when a transaction (or prepared transaction, or replication slot) has "
    "held back cleanup of the queue's tables for longer than this; names it.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing unless a threshold is breached.")
@json_option
def check(
    database_url: str | None,
    max_queue_age: str | None,
    max_stuck: int | None,
    max_dead: int | None,
    stale_schedules: bool,
    include_paused: bool,
    max_snapshot_age: str | None,
    quiet: bool,
    as_json: bool,
) -> int:
    """Exit 1 if a threshold is breached, naming each one with its value; 0 otherwise.

    One line per threshold checked, for cron, Nagios-style monitoring or a CI smoke test:

    \b
    jobrunner check --max-queue-age 10m --max-stuck 0 --max-dead 0
    """
    from cronjob import horizon, store
    from cronjob.health import Thresholds, evaluate, read_overview

    thresholds = Thresholds(_seconds(max_queue_age, "--max-queue-age"), max_stuck, max_dead)
    snapshot_age = _seconds(max_snapshot_age, "--max-snapshot-age")
    if not thresholds.any and not stale_schedules and snapshot_age is None:
        raise BadInput(
            "nothing to check: give --max-queue-age, --max-stuck, --max-dead, "
            "--stale-schedules and/or --max-snapshot-age"
        )
    if include_paused and not stale_schedules:
        raise BadInput("--include-paused applies to --stale-schedules only")
    conn = open_connection(database_url)
    with conn:
        overview = None
        if thresholds.any:
            overview = read_overview(conn)
        health = store.definitions_list_health(conn) if stale_schedules else None
        pauses = overview.paused if overview is not None else store.job_type_pauses_list(conn)
        holders = horizon.read_holders(conn) if snapshot_age is not None else None
    findings = evaluate(overview, thresholds) if overview is not None else []
    if health is not None:
        findings.append(_stale_finding(health, include_paused))
    if holders is not None and snapshot_age is not None:
        findings.append(horizon.finding(holders, snapshot_age))
    breached = [f for f in findings if f.breached]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": not breached,
                    "findings": [
                        {
                            "threshold": f.threshold,
                            "value": _rounded(f.value),
                            "limit": f.limit,
                            "breached": f.breached,
                            "detail": f.detail,
                        }
                        for f in findings
                    ],
                    "paused_job_types": _pauses_json(pauses),
                },
                indent=2,
            )
        )
    else:
        for finding in findings:
            if finding.breached or not quiet:
                click.echo(printable(finding.line))
    return 1 if breached else 0


def _stale_finding(rows: list[Any], include_paused: bool) -> Any:
    from cronjob.health import Finding
    from cronjob.staleness import stale_schedules

    verdicts = stale_schedules(rows, include_paused=include_paused)
    stale = [v for v in verdicts if v.stale]
    if stale:
        detail = f"{len(stale)} stale schedule(s): " + "; ".join(v.detail for v in stale)
    else:
        detail = f"{len(verdicts)} schedule(s) checked, none stale"
    return Finding("stale-schedules", len(stale), 0, bool(stale), detail)
