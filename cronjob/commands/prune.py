"""`jobrunner prune`: delete finished runs, old effects-ledger keys and old audit entries."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from cronjob.cli import Count, database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.errors import BadInput
from cronjob.settings import DEFAULT_PRUNE_BATCH_SIZE


def _prune_options(func: Any) -> Any:
    from cronjob.commands.incident import change_options, filter_options

    func = json_option(change_options(filter_options(func)))
    for option in reversed(
        (
            click.option(
                "--older-than",
                metavar="DURATION",
                help="Only runs that finished longer ago than this, e.g. 30d.",
            ),
            click.option(
                "--status",
                "statuses",
                metavar="S1,S2",
                help="Only these finished statuses (default: succeeded, dead, cancelled).",
            ),
            click.option(
                "--keep-effects",
                metavar="DURATION",
                default="0s",
                show_default=True,
                help="Keep effects-ledger keys at least this long after they were "
                "recorded; keys of pruned runs that are older go with them.",
            ),
            click.option(
                "--batch-size",
                type=Count(1, 1000),
                default=DEFAULT_PRUNE_BATCH_SIZE,
                show_default=True,
                help="Runs deleted per transaction.",
            ),
            click.option(
                "--audit-older-than",
                metavar="DURATION",
                help="Also delete audit entries older than this.",
            ),
        )
    ):
        func = option(func)
    return click.command("prune")(
        click.argument("run_ids", metavar="[ID]...", nargs=-1)(database_url_option(func))
    )


@_prune_options
def prune(
    run_ids: tuple[str, ...],
    database_url: str | None,
    older_than: str | None,
    statuses: str | None,
    keep_effects: str,
    batch_size: int,
    audit_older_than: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Delete finished runs (and their history, run logs and ledger keys) in small batches.

    \b
    jobrunner prune --older-than 30d
    jobrunner prune --status dead --type send_email --until 2h --dry-run
    jobrunner prune --audit-older-than 365d

    Runs that can still execute (queued, running, failed) are never deleted. Takes
    run ids, or the filters of `jobrunner retry`; each batch is its own transaction,
    and the command writes one audit entry. On a terminal it shows its progress; SIGINT
    or SIGTERM stops it after the batch under way (exit 130 or 143).
    """
    from dataclasses import replace

    from cronjob import incident, store
    from cronjob.commands import incident as selecting
    from cronjob.inputs import parse_duration, parse_run_ids, parse_statuses
    from cronjob.models import Selection
    from cronjob.prune import PRUNABLE

    age = parse_duration(older_than, what="--older-than") if older_than is not None else None
    effects_age = parse_duration(keep_effects, what="--keep-effects")
    audit_age = (
        parse_duration(audit_older_than, what="--audit-older-than")
        if audit_older_than is not None
        else None
    )
    chosen = parse_statuses(statuses, allowed=PRUNABLE, command="prune") or PRUNABLE
    ids = parse_run_ids(run_ids)
    selection = incident.build_selection(ids, chosen if statuses else None, options)
    runs_too = bool(ids) or selection.filtered or age is not None
    # --older-than and --status alone are the retention job cron runs: no question asked.
    routine = not replace(selection, statuses=None).filtered
    if not runs_too and audit_age is None:
        raise BadInput(
            "nothing to prune: give --older-than, filters, run ids or --audit-older-than"
        )
    if ids and (selection.filtered or age is not None):
        raise BadInput("give run ids or filters, not both")
    conn = open_connection(database_url)
    with conn:
        found = applied = None
        effects = 0
        if runs_too:
            until = (lambda clock: clock - timedelta(seconds=age)) if age is not None else None
            selection = incident.with_clock(conn, selection, options, until=until)
            found, applied = selecting.act_on_selection(
                conn,
                "prune",
                selection,
                options,
                batch_size=batch_size,
                confirm=not routine,
                as_json=as_json,
            )
            if applied is not None:
                effects = _prune_effects(conn, effects_age, batch_size)
                store.batches_prune(conn, older_than=age or 0.0)
        audits = _prune_audit(conn, audit_age, options) if audit_age is not None else None
    _report_prune(
        selection if runs_too else Selection(),
        chosen,
        age,
        found,
        applied,
        effects,
        audits,
        as_json,
    )


def _prune_effects(conn: Any, keep: float, batch_size: int) -> int:
    from cronjob import store

    return store.effects_prune_many(conn, older_than_seconds=keep, batch_size=batch_size)


def _prune_audit(conn: Any, older_than: float, options: dict[str, Any]) -> int | None:
    from cronjob import store
    from cronjob.commands.incident import record_audit
    from cronjob.db import INSUFFICIENT_PRIVILEGE, database_errors
    from cronjob.errors import DatabaseError, JobrunnerError

    if options.get("dry_run"):
        return None
    try:
        with database_errors(), conn.transaction():
            deleted = store.audit_prune(conn, older_than=older_than)
            record_audit(
                conn,
                "prune",
                options.get("actor"),
                options.get("reason"),
                selection={"audit_older_than": older_than},
                changed=deleted,
            )
    except DatabaseError as exc:
        if exc.sqlstate != INSUFFICIENT_PRIVILEGE:
            raise
        raise JobrunnerError(
            f"cannot trim the audit trail as role {conn.info.user}: {exc.primary}; only its "
            "owner may: run `jobrunner prune --audit-older-than` as jobrunner_owner "
            "(deploy/roles.sql)"
        ) from None
    return deleted


def _report_prune(
    selection: Any,
    chosen: tuple[str, ...],
    age: float | None,
    found: Any,
    applied: Any,
    effects: int,
    audits: int | None,
    as_json: bool,
) -> None:
    from cronjob.health import seconds_text

    source = found if found is not None else applied
    by_status = source.by_status if source is not None else {}
    sample = list(source.sample_ids) if source is not None else []
    total = sum(by_status.values())
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": found is not None,
                    "older_than_seconds": age,
                    "selection": selection.as_json(),
                    "statuses": list(chosen),
                    "pruned": {s: by_status.get(s, 0) for s in chosen},
                    "total": total,
                    "sample_ids": sample,
                    "effects": effects,
                    "batches": applied.batches if applied else 0,
                    "audit_id": applied.audit_id if applied else None,
                    "audit_entries": audits,
                },
                indent=2,
            )
        )
        return
    verb = "would prune" if found is not None else "pruned"
    if found is not None or applied is not None:
        detail = ", ".join(f"{s} {by_status.get(s, 0)}" for s in chosen)
        which = f" finished more than {seconds_text(age)} ago" if age is not None else ""
        effects_text = f"; {effects} effects-ledger key(s)" if effects else ""
        click.echo(f"{verb} {total} run(s){which} ({detail}){effects_text}")
    if audits is not None:
        click.echo(f"pruned {audits} audit entr{'y' if audits == 1 else 'ies'}")
