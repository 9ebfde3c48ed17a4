"""Commands about schedules: add, list, show, pause, resume, remove, sync, preview."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import datetime
from typing import IO, Any

import click

from cronjob.cli import (
    Count,
    database_url_option,
    json_option,
    lock_wait_option,
    tenants_sql_option,
)
from cronjob.commands import open_connection
from cronjob.commands.incident import actor_option, check_reason, reason_option, record_audit
from cronjob.commands.render import clip, definition_json, iso, table
from cronjob.errors import BadInput
from cronjob.text import printable

UPCOMING_SHOWN = 5
RECENT_RUNS_SHOWN = 10
RECENT_SKIPS_SHOWN = 10


@click.group()
def schedule() -> None:
    """Cron schedules: definitions that `jobrunner tick` turns into runs.

    \b
    jobrunner schedule add nightly-report --cron '30 2 * * *' --type reports.nightly \\
        --timezone Europe/Amsterdam
    jobrunner schedule preview '30 2 * * *' --timezone Europe/Amsterdam --from 2026-10-24
    jobrunner schedule sync schedules.toml --dry-run
    """


@schedule.command()
@click.argument("name")
@database_url_option
@click.option(
    "--cron", required=True, metavar="EXPR", help="Five-field cron text or @daily-style alias."
)
@click.option("--type", "job_type", required=True, metavar="TYPE", help="The job type to run.")
@click.option("--payload", metavar="JSON", help="The payload of every run, as JSON (default {}).")
@click.option(
    "--timezone",
    default="UTC",
    show_default=True,
    metavar="TZ",
    help="IANA timezone the cron fields are read in.",
)
@click.option(
    "--scope",
    type=click.Choice(["global", "tenant"]),
    default="global",
    show_default=True,
    help="tenant: one run per tenant of the tenant query at each fire time.",
)
@click.option(
    "--max-attempts", metavar="N", help="Attempt budget of each run (default: the handler's)."
)
@click.option("--priority", metavar="N", help="Priority of each run; lower runs first (default 0).")
@click.option(
    "--catch-up",
    type=click.Choice(["latest", "all", "none"]),
    default="latest",
    show_default=True,
    help="Missed occurrences: run the latest once, all of them (bounded), or none.",
)
@click.option(
    "--catch-up-limit", metavar="N", help="With --catch-up all: at most this many (default 100)."
)
@click.option(
    "--overlap",
    type=click.Choice(["allow", "skip", "queue"]),
    default="allow",
    show_default=True,
    help="While a run of this schedule (per tenant) is unfinished: start the next anyway, "
    "skip it (recorded), or let one wait and skip the rest.",
)
@click.option(
    "--expect-within",
    metavar="DURATION",
    help="`check --stale-schedules` breaches when a due occurrence has not succeeded within "
    "this (default: two intervals of the schedule plus the lease).",
)
@click.option(
    "--ping-url",
    metavar="URL",
    help="Check-in URL requested after each run of this schedule succeeds "
    "(Healthchecks, Cronitor, ...).",
)
@click.option(
    "--ping-failure-url",
    metavar="URL",
    help="Requested when a run is dead (default: the ping URL followed by /fail).",
)
@click.option(
    "--then", "then_type", metavar="TYPE",
    help="With --scope tenant: each occurrence's tenant runs are a batch, and a run of TYPE "
    "follows once they have all ended (also with no tenant).",
)  # fmt: skip
@actor_option
@reason_option
def add(
    name: str,
    database_url: str | None,
    cron: str,
    job_type: str,
    payload: str | None,
    timezone: str,
    scope: str,
    max_attempts: str | None,
    priority: str | None,
    catch_up: str,
    catch_up_limit: str | None,
    overlap: str,
    expect_within: str | None,
    ping_url: str | None,
    ping_failure_url: str | None,
    then_type: str | None,
    actor: str | None,
    reason: str | None,
) -> None:
    """Define a schedule NAME. It first fires at its first occurrence from now on."""
    from cronjob import definitions
    from cronjob.inputs import parse_payload

    spec = definitions.definition_spec(
        name,
        cron=cron,
        job_type=job_type,
        payload=None if payload is None else parse_payload(payload),
        timezone=timezone,
        scope=scope,
        max_attempts=max_attempts,
        priority=priority,
        catch_up=catch_up,
        catch_up_limit=catch_up_limit,
        overlap=overlap,
        expect_within=expect_within,
        ping_url=ping_url,
        ping_failure_url=ping_failure_url,
        then_type=then_type,
    )
    conn = open_connection(database_url)
    with conn, conn.transaction():
        created = definitions.add(conn, spec)
        record_audit(conn, "schedule add", actor, reason, selection={"name": name})
    click.echo(f"added schedule {created.name}: next run {_next_run(created)}")
    if scope == "tenant" and not os.environ.get("JOBRUNNER_TENANTS_SQL"):
        click.echo(
            "note: ticks materialize a tenant-scoped schedule only with a tenant query "
            "(--tenants-sql or JOBRUNNER_TENANTS_SQL)",
            err=True,
        )


@schedule.command(name="list")
@database_url_option
@json_option
def list_schedules(database_url: str | None, as_json: bool) -> None:
    """List every schedule with its next run."""
    from cronjob import store

    conn = open_connection(database_url)
    with conn:
        found = store.definitions_list(conn)
    if as_json:
        click.echo(json.dumps([definition_json(d) for d in found], indent=2))
        return
    if not found:
        click.echo("No schedules. Add one with `jobrunner schedule add` or `schedule sync FILE`.")
        return
    rows = [
        (d.name, d.schedule, d.timezone, d.scope, d.overlap, d.job_type, _next_run(d))
        for d in found
    ]
    table(("NAME", "SCHEDULE", "TIMEZONE", "SCOPE", "OVERLAP", "TYPE", "NEXT RUN"), rows)


@schedule.command()
@click.argument("name")
@database_url_option
@json_option
def show(name: str, database_url: str | None, as_json: bool) -> None:
    """One schedule: its settings, next fire times, high-water mark and recent runs."""
    from cronjob import definitions, store

    conn = open_connection(database_url)
    with conn:
        found = definitions.get(conn, name)
        counts = store.definition_runs_count_by_status(conn, found.id)
        recent = store.definition_runs_list_recent(conn, found.id, limit=RECENT_RUNS_SHOWN)
        skips = store.definition_skips_list_recent(conn, found.id, limit=RECENT_SKIPS_SHOWN)
        health = _verdict(store.definition_get_health(conn, found.id), name)
        latest = store.definition_runs_count_latest_occurrence(conn, found.id)
    upcoming, problem = _upcoming(found)
    local = _in_zone(found.timezone)
    if as_json:
        shown = definition_json(found)
        shown["upcoming"] = [local(t) for t in upcoming]
        if problem is not None:
            shown["problem"] = problem
        shown["run_counts"] = {status.value: number for status, number in counts.items()}
        shown["recent_runs"] = [
            {"id": r.id, "tenant_id": r.tenant_id, "scheduled_for": local(r.scheduled_for),
             "status": r.status.value, "attempts": r.attempts}
            for r in recent
        ]  # fmt: skip
        shown["health"] = {
            "stale": health.stale, "window_seconds": health.window,
            "last_success_at": iso(health.last_success_at),
            "last_failure_at": iso(health.last_failure_at),
            "last_failure_error": health.last_failure_error,
            "latest_occurrence": local(latest[0]) if latest[0] else None,
            "latest_occurrence_runs": {s.value: n for s, n in latest[1].items()},
        }  # fmt: skip
        shown["recent_skips"] = [
            {"tenant_id": k.tenant_id, "scheduled_for": local(k.scheduled_for),
             "reason": k.reason, "skipped_at": local(k.created_at)}
            for k in skips
        ]  # fmt: skip
        click.echo(json.dumps(shown, indent=2))
        return
    lines = [
        ("schedule", f"{found.name} (id {found.id})"),
        ("state", "enabled" if found.enabled else "paused"),
        ("type", found.job_type),
        ("cron", f"{found.schedule}  ({found.timezone})"),
        ("scope", found.scope),
        ("payload", json.dumps(found.payload)),
        ("max attempts", str(found.max_attempts or "the handler's")),
        ("priority", str(found.priority)),
        ("catch-up", found.catch_up + (f" (at most {found.catch_up_limit})"
                                       if found.catch_up == "all" else "")),
        ("overlap", f"{found.overlap} ({found.overlap_skips} skipped so far)"),
        ("health", _health_line(health)),
        ("latest occurrence", _latest_line(latest, local)),
        ("check-in ping", found.ping_url or "none"),
        ("materialized through", local(found.materialized_through)),
        ("next runs", "\n".join(local(t) for t in upcoming) or problem or "none (paused)"),
        ("runs", ", ".join(f"{n} {s.value}" for s, n in sorted(counts.items())) or "none yet"),
    ]  # fmt: skip
    for label, value in lines:
        first, *rest = value.split("\n")
        click.echo(f"{label:<21} {printable(first)}")
        for more in rest:
            click.echo(f"{'':<21} {printable(more)}")
    if recent:
        click.echo("\nrecent runs:")
        click.echo(f"{'ID':>8}  {'SCHEDULED FOR':<25}  {'TENANT':<16}  {'STATUS':<10}  ATTEMPTS")
        for run in recent:
            tenant = printable(run.tenant_id or "-")
            click.echo(
                f"{run.id:>8}  {local(run.scheduled_for):<25}  {tenant:<16}  "
                f"{run.status.value:<10}  {run.attempts}"
            )
    _echo_skips(skips, local)


def _verdict(row: Any, name: str) -> Any:
    from cronjob.errors import DefinitionNotFound
    from cronjob.inputs import excerpt
    from cronjob.staleness import assess

    if row is None:  # removed since it was looked up, a statement earlier
        raise DefinitionNotFound(f"schedule {excerpt(name)} not found")
    return assess(row)


def _health_line(verdict: Any) -> str:
    state = "STALE" if verdict.stale else "ok"
    success = (
        f"last success {iso(verdict.last_success_at)}"
        if verdict.last_success_at
        else ("no success yet")
    )
    failure = f", last failure {iso(verdict.last_failure_at)}" if verdict.last_failure_at else ""
    return f"{state}: {success}{failure}"


def _latest_line(latest: tuple[Any, dict[Any, int]], local: Any) -> str:
    """The newest occurrence's runs by status: for a tenant-scoped schedule, its tenants."""
    scheduled_for, counts = latest
    if scheduled_for is None:
        return "no runs yet"
    runs = ", ".join(f"{n} {s.value}" for s, n in sorted(counts.items()))
    return f"{local(scheduled_for)}: {runs}"


def _echo_skips(skips: list[Any], local: Any) -> None:
    if not skips:
        return
    click.echo("\nrecent skips:")
    click.echo(f"{'SCHEDULED FOR':<25}  {'TENANT':<16}  REASON")
    for skip in skips:
        click.echo(f"{local(skip.scheduled_for):<25}  {skip.tenant_id or '-':<16}  {skip.reason}")


@schedule.command()
@click.argument("name")
@database_url_option
@actor_option
@reason_option
def pause(name: str, database_url: str | None, actor: str | None, reason: str | None) -> None:
    """Stop materializing runs of NAME (runs already created are untouched)."""
    from cronjob import incident, operations

    who, why = incident.actor_name(actor), check_reason(reason)
    conn = open_connection(database_url)
    with conn:
        changed = operations.pause_schedule(conn, name, actor=who, reason=why).changed
    click.echo(printable(f"paused {name}" if changed else f"{name} was already paused"))


@schedule.command()
@click.argument("name")
@database_url_option
@actor_option
@reason_option
def resume(name: str, database_url: str | None, actor: str | None, reason: str | None) -> None:
    """Materialize runs of NAME again, from now on: time spent paused is not made up."""
    from cronjob import incident, operations

    who, why = incident.actor_name(actor), check_reason(reason)
    conn = open_connection(database_url)
    with conn:
        found, done = operations.resume_schedule(conn, name, actor=who, reason=why)
    if done.changed:
        click.echo(printable(f"resumed {name}: next run {_next_run(found)}"))
    else:
        click.echo(printable(f"{name} was not paused"))


@schedule.command(name="run")
@click.argument("name")
@database_url_option
@tenants_sql_option
@actor_option
@reason_option
def run_now(
    name: str, database_url: str | None, tenants_sql: str | None, actor: str | None,
    reason: str | None,
) -> None:  # fmt: skip
    """Enqueue one occurrence of NAME now, as a tick would when it falls due.

    Its payload, scope and overlap policy apply: a tenant-scoped schedule gets a run per
    tenant (--tenants-sql), and under overlap skip or queue an occurrence that finds its
    earlier runs unfinished is recorded as skipped. Its next fire times are unchanged, and a
    paused schedule stays paused. Writes one audit entry.
    """
    from cronjob import incident, operations
    from cronjob.inputs import check_tenants_sql

    who, why = incident.actor_name(actor), check_reason(reason)
    query = check_tenants_sql(tenants_sql)
    conn = open_connection(database_url)
    with conn:
        done = operations.run_schedule_now(conn, name, actor=who, reason=why, tenants_sql=query)
    if done.created:
        click.echo(f"ran {name} now: {done.created} run(s) enqueued; audit #{done.audit_id}")
    else:
        click.echo(f"{name} not run now: its overlap policy skipped the occurrence "
                   f"(see `jobrunner schedule show {name}`); audit #{done.audit_id}")  # fmt: skip


@schedule.command()
@click.argument("name")
@database_url_option
@actor_option
@reason_option
def remove(name: str, database_url: str | None, actor: str | None, reason: str | None) -> None:
    """Delete the schedule NAME. Its runs are kept; queued ones still run."""
    from cronjob import definitions

    conn = open_connection(database_url)
    with conn, conn.transaction():
        definitions.remove(conn, name)
        record_audit(conn, "schedule remove", actor, reason, selection={"name": name})
    click.echo(f"removed {name}")


def sync_options(source: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a sync from `source`: `schedule sync FILE`, and `sync` (Django settings)."""
    options = [
        database_url_option,
        click.option("--prune", is_flag=True, help=f"Remove schedules that are not in {source}."),
        click.option("--dry-run", is_flag=True, help="Print the plan; change nothing."),
        lock_wait_option("another host's schedule sync"),
        actor_option,
        reason_option,
    ]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


@schedule.command()
@click.argument("file", type=click.File("rb"))
@sync_options("FILE")
def sync(
    file: IO[bytes],
    database_url: str | None,
    prune: bool,
    dry_run: bool,
    lock_wait: float,
    actor: str | None,
    reason: str | None,
) -> None:
    """Make the schedules match a TOML FILE (- for stdin), upserting by name.

    \b
    [schedules.nightly-report]
    cron = "30 2 * * *"               # required
    type = "reports.nightly"          # required
    timezone = "Europe/Amsterdam"     # default UTC
    payload = { format = "pdf" }      # default {}
    scope = "global"                  # or "tenant"
    max_attempts = 5                  # default: the handler's
    priority = 0
    catch_up = "latest"               # or "all" (with catch_up_limit, default 100), "none"
    overlap = "allow"                 # or "skip", "queue" (while a run is unfinished)
    expect_within = "2h"              # default: two intervals plus the lease
    ping_url = "https://hc-ping.com/UUID"  # called on success; ping_failure_url when dead
    then = "reports.summary"          # scope tenant: a run once an occurrence's runs ended
    enabled = true                    # leave out to keep a paused schedule paused

    The whole file is checked before anything is written; one bad entry rejects it.
    Prints one line per schedule: add, change (with the fields), unchanged, remove,
    or keep (not in the file, and no --prune).
    """
    from cronjob import definitions
    from cronjob.inputs import read_text

    source = getattr(file, "name", "FILE")
    if not isinstance(source, str) or source == "<stdin>":
        source = "-"
    text = read_text(file, definitions.MAX_FILE_BYTES, source=source)
    specs = definitions.load_file(text, source=source)
    limits = definitions.load_file_limits(text, source=source)
    apply_sync(specs, database_url, prune, dry_run, lock_wait, actor, reason, limits=limits)


def apply_sync(
    specs: list[Any],
    database_url: str | None,
    prune: bool,
    dry_run: bool,
    lock_wait: float,
    actor: str | None,
    reason: str | None,
    *,
    source: str = "the file",
    limits: list[Any] | None = None,
) -> None:
    """Sync the definitions with `specs` (and any `limits`), audit it, print the plan."""
    from cronjob import definitions, incident
    from cronjob.commands.progress import watching
    from cronjob.limits import sync as sync_limits

    conn = open_connection(database_url)
    progress = watching("syncing", told=_nothing_synced, unit="schedules", shown=not dry_run)
    with conn, progress as watch, conn.transaction():
        items = definitions.sync(
            conn, specs, prune=prune, dry_run=dry_run, lock_wait=lock_wait, progress=watch
        )
        who = incident.actor_name(actor)
        limited = sync_limits(conn, limits, prune=prune, dry_run=dry_run, actor=who)
        if not dry_run:
            changed = [i.name for i in items if i.action in ("add", "change", "remove")]
            types = [job_type for action, job_type in limited if action in ("limit", "unlimit")]
            selection = {"names": changed, "prune": prune, **({"limits": types} if types else {})}
            record_audit(conn, "schedule sync", actor, reason, changed=len(changed) + len(types),
                         selection=selection)  # fmt: skip
    click.echo("".join(printable(f"{action:<10}limit of {t}\n") for action, t in limited), nl=False)
    for item in items:
        detail = ""
        if item.changes:
            detail = f"  ({', '.join(item.changes)})"
        elif item.action == "keep":
            detail = f"  (not in {source}; --prune removes it)"
        click.echo(printable(f"{item.action:<10}{item.name}{detail}"))
    actions = ("add", "change", "unchanged", "remove")
    add, change, unchanged, remove = (sum(i.action == a for i in items) for a in actions)
    if dry_run:
        click.echo(
            f"dry run, nothing written: {add} to add, {change} to change, {unchanged} unchanged,"
            f" {remove} to remove"
        )
    else:
        click.echo(
            f"synced: {add} added, {change} changed, {unchanged} unchanged, {remove} removed"
        )


def _nothing_synced(_done: int) -> str:
    return (
        "nothing written: a sync is one transaction, rolled back; the same command again "
        "applies all of it"
    )


@schedule.command()
@click.argument("expr", metavar="EXPR")
@click.option("--timezone", default="UTC", show_default=True, metavar="TZ")
@click.option(
    "--from", "start", metavar="ISO8601",
    help="Show fire times strictly after this (default: now). Without an offset it is read "
    "in --timezone.",
)  # fmt: skip
@click.option("--count", type=Count(1, 10000), default=10, show_default=True)
def preview(expr: str, timezone: str, start: str | None, count: int) -> None:
    """Print the next fire times of EXPR, one ISO-8601 timestamp a line.

    Computed by the same code that materializes runs, daylight-saving rules included;
    needs no database.
    """
    from zoneinfo import ZoneInfo

    from cronjob import cron

    try:
        zone_name = cron.validate_timezone(timezone)
        cron.validate_expression(expr)
    except cron.CronError as exc:
        raise BadInput(str(exc)) from None
    zone = ZoneInfo(zone_name)
    after = _parse_from(start, zone) if start is not None else datetime.now(zone)
    for moment in cron.next_after(expr, zone_name, after, count):
        click.echo(moment.astimezone(zone).isoformat())


def _parse_from(text: str, zone: Any) -> datetime:
    from cronjob.inputs import check_time_in_range, excerpt

    try:
        if len(text) > 64:
            raise ValueError(text)
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"invalid --from {excerpt(text)}: expected ISO-8601, e.g. 2026-10-24T00:00:00+02:00"
        ) from None
    # An offset-less time means the schedule's own wall clock (its first reading, if the
    # clocks go back then).
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone)
    return check_time_in_range(moment, what="--from", shown=text)


def _upcoming(definition: Any) -> tuple[list[datetime], str | None]:
    """The next fire times, or none and why: a stored row may hold what no command accepts."""
    from cronjob import definitions

    try:
        return definitions.upcoming_fire_times(definition, UPCOMING_SHOWN), None
    except Exception as exc:
        return [], f"cannot be evaluated ({clip(' '.join(str(exc).split()), 200)})"


def _in_zone(name: str) -> Any:
    from datetime import UTC
    from zoneinfo import ZoneInfo

    try:
        zone: Any = ZoneInfo(name)
    except Exception:
        # A zone since removed from the system's database, or stored by someone
        # else's SQL: the times are still shown, with their UTC offset.
        zone = UTC

    def local(moment: datetime | None) -> str:
        return "-" if moment is None else moment.astimezone(zone).isoformat()

    return local


def _next_run(definition: Any) -> str:
    if not definition.enabled:
        return "paused"
    if definition.next_fire_at is None:
        return "never"
    return _in_zone(definition.timezone)(definition.next_fire_at)
