"""`jobrunner limit` and `jobrunner limits`: flow control's limits, kept in the database like
pauses, so every tick on every host enforces the same numbers from its next claim on."""

from __future__ import annotations

import json

import click

from cronjob.cli import database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.incident import actor_option, check_reason, reason_option
from cronjob.commands.render import clip, iso, table, when
from cronjob.errors import BadInput
from cronjob.text import printable


@click.command()
@click.argument("job_type", metavar="TYPE")
@click.option("--concurrency", metavar="N", help="At most N runs of TYPE (or of each key) at once.")
@click.option(
    "--per",
    metavar="tenant|payload:FIELD",
    help="Count each key apart: the run's tenant, or a top-level payload field's value.",
)
@click.option(
    "--rate",
    metavar="N/DURATION",
    help="At most N starts in any span of the period, e.g. 10/1s.",
)
@click.option("--clear", is_flag=True, help="Remove TYPE's limit.")
@database_url_option
@reason_option
@actor_option
def limit(
    job_type: str,
    concurrency: str | None,
    per: str | None,
    rate: str | None,
    clear: bool,
    database_url: str | None,
    reason: str | None,
    actor: str | None,
) -> None:
    """Limit how many runs of TYPE run at once or start per period, on every host.

    A run held back waits queued: no attempt spent, no error recorded; it starts when a
    place is free or its rate allows. A rate of N per period never starts more than N of a
    key in any span of the period: N at once after a period without, then one every
    period/N. Setting a limit replaces the one TYPE had. Takes effect at every tick's next
    claim; audited.
    """
    from cronjob import incident, limits, operations
    from cronjob.inputs import check_text

    check_text(job_type, what="job type", max_length=200)
    why, who = check_reason(reason), incident.actor_name(actor)
    if clear:
        if concurrency is not None or per is not None or rate is not None:
            raise BadInput("--clear takes no --concurrency, --per or --rate")
        conn = open_connection(database_url)
        with conn:
            done = operations.clear_limit(conn, job_type, actor=who, reason=why)
        # A type is any text: shown escaped, as every name the command line echoes.
        said = f"cleared the limit of {job_type}" if done.changed else f"{job_type} had no limit"
        click.echo(printable(said))
        return
    checked = limits.parse_limit(job_type, concurrency=concurrency, per=per, rate=rate, reason=why)
    conn = open_connection(database_url)
    with conn:
        operations.set_limit(conn, checked, actor=who)
    click.echo(printable(f"limited {job_type}: {limits.describe(checked)}"))


@click.command("limits")
@database_url_option
@json_option
def list_limits(database_url: str | None, as_json: bool) -> None:
    """List the job types with a limit, with how many of their runs are due and waiting."""
    from cronjob import limits, store

    conn = open_connection(database_url)
    with conn:
        found = store.job_type_limits_list(conn)
        waiting = store.job_type_limits_throttled(conn)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "job_type": x.job_type,
                        "concurrency": x.concurrency,
                        "rate": limits.rate_text(x),
                        "per": limits.per_text(x),
                        "reason": x.reason,
                        "set_by": x.set_by,
                        "set_at": iso(x.set_at),
                        "due_waiting": waiting.get(x.job_type, 0),
                    }
                    for x in found
                ],
                indent=2,
            )
        )
        return
    if not found:
        click.echo("no limits")
        return
    rows = [
        (
            x.job_type,
            "" if x.concurrency is None else str(x.concurrency),
            limits.rate_text(x) or "",
            limits.per_text(x),
            str(waiting.get(x.job_type, 0)),
            when(x.set_at),
            clip(x.set_by, 30),
            clip(x.reason or "", 40),
        )
        for x in found
    ]
    table(("TYPE", "CONCURRENCY", "RATE", "PER", "DUE", "SET", "BY", "REASON"), rows)
