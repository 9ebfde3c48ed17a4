"""Commands for incidents: the selection options of retry, cancel and prune; pause, resume, audit.

The selection options are stacked by the commands that take them (one decorator
each, defined once here), and `act_on_selection` is the one path from options to a
dry run or a batched, audited change.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from cronjob.cli import database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.render import clip, iso, table, when
from cronjob.errors import BadInput
from cronjob.text import printable

# What each command is doing while its progress shows.
WORKING = {"retry": "retrying", "cancel": "cancelling", "prune": "pruning"}


def filter_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--type, --tenant, --error-type, --error-like, --schedule, --batch, --since, --until,
    --limit."""
    for option in reversed(
        (
            click.option(
                "--type", "job_types", metavar="T1,T2", help="Only runs of these job types."
            ),
            click.option(
                "--tenant", "tenants", metavar="ID1,ID2", help="Only runs of these tenants."
            ),
            click.option(
                "--error-type",
                "error_types",
                metavar="E1,E2",
                help="Only runs whose last error is of these types (e.g. SMTPServerDisconnected).",
            ),
            click.option(
                "--error-like",
                metavar="TEXT",
                help="Only runs whose last error message contains TEXT (any case).",
            ),
            click.option("--schedule", metavar="NAME", help="Only runs of this schedule."),
            click.option(
                "--batch", "batch_id", metavar="ID", help="Only the members of this batch."
            ),
            click.option(
                "--since",
                metavar="WHEN",
                help="Only runs that last changed (or finished) at or after WHEN: a duration "
                "ago (30m, 2h) or an ISO-8601 timestamp.",
            ),
            click.option(
                "--until",
                metavar="WHEN",
                help="Only runs that last changed (or finished) before WHEN.",
            ),
            click.option(
                "--limit",
                type=click.IntRange(min=1),
                metavar="N",
                help="At most N runs, lowest ids first.",
            ),
        )
    ):
        func = option(func)
    return func


def change_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--dry-run, --yes, --actor, --reason: for every command that acts on a selection."""
    for option in reversed(
        (
            click.option(
                "--dry-run",
                is_flag=True,
                help="Print how many runs would change, and the first ids; change nothing.",
            ),
            click.option(
                "--yes",
                is_flag=True,
                help="Act on a selection of many runs without asking (needed when not on a "
                "terminal).",
            ),
            actor_option,
            reason_option,
        )
    ):
        func = option(func)
    return func


actor_option = click.option(
    "--actor",
    metavar="NAME",
    help="Who is acting, for the audit trail [env: JOBRUNNER_ACTOR; default: user@host].",
)
reason_option = click.option("--reason", metavar="TEXT", help="Why, for the audit trail.")


def statuses(value: str | None, allowed: tuple[str, ...], command: str) -> tuple[str, ...] | None:
    """retry's and cancel's --status: like their other filters, refused when it names nothing."""
    from cronjob.inputs import parse_statuses

    if value is None:
        return None
    chosen = parse_statuses(value, allowed=allowed, command=command)
    if not chosen:
        raise BadInput("invalid --status: empty")
    return chosen


def check_reason(reason: str | None) -> str | None:
    from cronjob.inputs import check_text

    return None if reason is None else check_text(reason, what="--reason", max_length=1000)


def record_audit(
    conn: Any,
    command: str,
    actor: str | None,
    reason: str | None,
    *,
    selection: dict[str, Any],
    changed: int = 1,
) -> int:
    """The audit row of a command's change, in its transaction, from --actor and --reason."""
    from cronjob import incident

    return incident.record(
        conn,
        command,
        actor=incident.actor_name(actor),
        reason=check_reason(reason),
        changed=changed,
        selection=selection,
    )


def act_on_selection(
    conn: Any,
    command: str,
    selection: Any,
    options: dict[str, Any],
    *,
    batch_size: int = 1000,
    confirm: bool = True,
    as_json: bool = False,
) -> tuple[Any, Any]:
    """Count (dry run) or act on `selection`: (SelectionCount or None, Applied or None).

    With `confirm`, a filtered selection of many runs needs a yes first; routine retention
    (`prune --older-than`, from cron) passes False. On a terminal, work of more than one
    batch shows its progress toward the count a dry run gives; SIGINT or SIGTERM stops it
    after the batch under way (Interrupted).
    """
    from cronjob import incident
    from cronjob.commands.progress import on_terminal, watching

    chosen = incident.action(command)
    actor = incident.actor_name(options.get("actor"))
    reason = check_reason(options.get("reason"))
    if options.get("dry_run"):
        return incident.count(conn, chosen, selection), None
    found = None
    if confirm and selection.filtered and not options.get("yes"):
        found = incident.count(conn, chosen, selection)
        if found.total > incident.CONFIRM_ABOVE:
            _confirm(command, found.total)
    if found is None and on_terminal(as_json):
        found = incident.count(conn, chosen, selection)
    total = None if found is None else found.total
    batches = total is not None and total > min(batch_size, incident.MAX_BATCH)

    def told(done: int) -> str:
        return (
            f"{chosen.past} {done} run(s); the rest are untouched: the same command again "
            "goes on with them"
        )

    progress = watching(WORKING[command], told=told, total=total, shown=batches, as_json=as_json)
    with progress as watch:
        applied = incident.apply(
            conn,
            chosen,
            selection,
            actor=actor,
            reason=reason,
            batch_size=batch_size,
            progress=watch,
        )
    return None, applied


def _confirm(command: str, total: int) -> None:
    if sys.stdin.isatty() and sys.stdout.isatty():
        click.confirm(f"{command} {total} runs?", abort=True, err=True)
        return
    from cronjob.incident import CONFIRM_ABOVE

    raise BadInput(
        f"the selection holds {total} runs, more than {CONFIRM_ABOVE}: add --yes to {command} "
        "them (or --dry-run to see which)"
    )


def report_selection(
    command: str, past: str, selection: Any, found: Any, applied: Any, as_json: bool
) -> None:
    """What a dry run would change, or what the command changed, as text or JSON."""
    if found is not None:
        total, by_status, sample = found.total, found.by_status, list(found.sample_ids)
    else:
        total, by_status, sample = applied.total, applied.by_status, applied.sample_ids
    if as_json:
        shown = {
            "command": command,
            "dry_run": found is not None,
            "selection": selection.as_json(),
            "total": total,
            "by_status": by_status,
            "sample_ids": sample,
        }
        if applied is not None:
            shown.update(batches=applied.batches, audit_id=applied.audit_id)
        click.echo(json.dumps(shown, indent=2))
        return
    detail = ", ".join(f"{s} {n}" for s, n in sorted(by_status.items()))
    ids = ", ".join(str(i) for i in sample) + (" …" if total > len(sample) else "")
    if found is not None:
        click.echo(f"would {command} {total} run(s)" + (f" ({detail})" if detail else ""))
        if ids:
            click.echo(f"first ids: {ids}")
        click.echo("dry run: nothing changed")
    else:
        click.echo(
            f"{past} {total} run(s)"
            + (f" ({detail})" if detail else "")
            + f" in {applied.batches} batch(es); audit #{applied.audit_id}"
        )


# -- pause / resume -----------------------------------------------------------


def _types(values: tuple[str, ...]) -> list[str]:
    from cronjob.inputs import check_text

    if not values:
        raise BadInput("give at least one job type")
    return list(dict.fromkeys(check_text(v, what="job type", max_length=200) for v in values))


@click.command()
@click.argument("job_types", metavar="TYPE...", nargs=-1)
@database_url_option
@reason_option
@actor_option
def pause(
    job_types: tuple[str, ...], database_url: str | None, reason: str | None, actor: str | None
) -> None:
    """Stop claiming runs of these job types, on every host, from the next claim on.

    Running runs finish. Due runs, and runs that schedules keep creating, wait until
    `jobrunner resume TYPE`. `status` and `check` list paused types with their reason.
    """
    from cronjob import incident, operations

    types = _types(job_types)
    why, who = check_reason(reason), incident.actor_name(actor)
    conn = open_connection(database_url)
    with conn:
        paused = operations.pause_types(conn, types, actor=who, reason=why).changed
    for job_type in types:
        said = f"paused {job_type}" if job_type in paused else f"{job_type} was already paused"
        click.echo(printable(said))


@click.command()
@click.argument("job_types", metavar="TYPE...", nargs=-1)
@database_url_option
@reason_option
@actor_option
def resume(
    job_types: tuple[str, ...], database_url: str | None, reason: str | None, actor: str | None
) -> None:
    """Claim runs of these paused job types again, on every host."""
    from cronjob import incident, operations

    types = _types(job_types)
    why, who = check_reason(reason), incident.actor_name(actor)
    conn = open_connection(database_url)
    with conn:
        resumed = operations.resume_types(conn, types, actor=who, reason=why).changed
    for job_type in types:
        said = f"resumed {job_type}" if job_type in resumed else f"{job_type} was not paused"
        click.echo(printable(said))


# -- audit --------------------------------------------------------------------


@click.command()
@database_url_option
@click.option("--since", metavar="DURATION", help="Only entries this recent, e.g. 2h, 7d.")
@json_option
def audit(database_url: str | None, since: str | None, as_json: bool) -> None:
    """List what state-changing commands did: when, who, what, how many runs, and why.

    AT is the database's clock and LOGIN the database user that wrote the entry, both set
    by the database; ACTOR is who the command said was acting (--actor).
    """
    from cronjob import store
    from cronjob.inputs import parse_duration

    seconds = None if since is None else parse_duration(since, what="--since")
    conn = open_connection(database_url)
    with conn:
        entries = store.audit_list(conn, since=seconds)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": e.id,
                        "at": iso(e.at),
                        "actor": e.actor,
                        "login": e.login,
                        "command": e.command,
                        "selection": e.selection,
                        "changed": e.changed,
                        "sample_ids": e.sample_ids,
                        "reason": e.reason,
                    }
                    for e in entries
                ],
                indent=2,
            )
        )
        return
    if not entries:
        click.echo("no audit entries" + (f" in the last {since}" if since else ""))
        return
    rows = [
        (
            str(e.id),
            when(e.at),
            clip(e.actor, 30),
            clip(e.login or "?", 30),
            e.command,
            str(e.changed),
            clip(json.dumps(e.selection, ensure_ascii=False), 60),
            clip(e.reason or "", 40),
        )
        for e in entries
    ]
    table(("ID", "AT", "ACTOR", "LOGIN", "COMMAND", "CHANGED", "SELECTION", "REASON"), rows)
