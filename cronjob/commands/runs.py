"""Commands about individual runs: enqueue, retry, cancel, list, show."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

import click

from cronjob.api import new_run
from cronjob.cli import database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.render import clip, iso, table, when
from cronjob.errors import BadInput
from cronjob.inputs import MAX_PAYLOAD_BYTES, decode_json, parse_payload, parse_timestamp

JSONL_KEYS = {
    "type", "payload", "run_at", "delay", "idempotency_key", "max_attempts", "priority", "tenant",
}  # fmt: skip
JSONL_CHUNK = 5000


@click.command()
@click.argument("job_type", metavar="TYPE", required=False)
@database_url_option
@click.option("--payload", metavar="JSON", help="The payload, as JSON (default {}).")
@click.option(
    "--payload-file",
    type=click.File("r"),
    metavar="PATH",
    help="Read the payload from a file, or - for stdin.",
)
@click.option("--run-at", metavar="ISO8601", help="When the run becomes due (default: now).")
@click.option("--delay", metavar="DURATION", help="Due after this long, e.g. 90s, 5m, 2h.")
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="A key unique among runs: if a run has it already, its id is printed "
    "and nothing is enqueued.",
)
@click.option("--max-attempts", metavar="N", help="Attempt budget (default: the handler's).")
@click.option("--priority", metavar="N", help="Lower runs first (default 0).")
@click.option("--tenant", metavar="ID", help="The tenant the run is for.")
@click.option(
    "--jsonl",
    type=click.File("r"),
    metavar="FILE",
    help='Enqueue many: one JSON object a line ({"type": ..., "payload": ...} and '
    "the optional keys run_at, delay, idempotency_key, max_attempts, priority, tenant); "
    "- for stdin. All lines are checked before anything is written.",
)
def enqueue(
    job_type: str | None,
    database_url: str | None,
    payload: str | None,
    payload_file: IO[str] | None,
    run_at: str | None,
    delay: str | None,
    idempotency_key: str | None,
    max_attempts: str | None,
    priority: str | None,
    tenant: str | None,
    jsonl: IO[str] | None,
) -> None:
    """Enqueue a run of TYPE and print its id.

    \b
    jobrunner enqueue send_email --payload '{"to": "a@example.com"}' --delay 5m
    jobrunner enqueue --jsonl runs.jsonl
    """
    from cronjob.store import runs_insert_many

    if jsonl is not None:
        if job_type or any(
            v is not None
            for v in (payload, payload_file, run_at, delay, idempotency_key, max_attempts,
                      priority, tenant)
        ):  # fmt: skip
            raise BadInput(
                "--jsonl takes every field from its lines: give no TYPE or other options"
            )
        runs = _read_jsonl(jsonl)
    else:
        if not job_type:
            raise BadInput("missing TYPE: the job type to enqueue (or use --jsonl)")
        runs = [
            _new_run(
                {
                    "type": job_type,
                    "payload": _payload_text(payload, payload_file),
                    "run_at": run_at,
                    "delay": delay,
                    "idempotency_key": idempotency_key,
                    "max_attempts": max_attempts,
                    "priority": priority,
                    "tenant": tenant,
                },
                payload_is_text=True,
            )
        ]
    conn = open_connection(database_url)
    with conn, conn.transaction():
        ids = []
        for start in range(0, len(runs), JSONL_CHUNK):
            ids.extend(e.id for e in runs_insert_many(conn, runs[start : start + JSONL_CHUNK]))
    click.echo("".join(f"{i}\n" for i in ids), nl=False)


def _payload_text(payload: str | None, payload_file: IO[str] | None) -> str | None:
    if payload is not None and payload_file is not None:
        raise BadInput("give either --payload or --payload-file, not both")
    if payload_file is not None:
        return payload_file.read()
    return payload


def _new_run(fields: dict[str, Any], *, payload_is_text: bool = False, where: str = "") -> Any:
    try:
        raw_payload = fields.get("payload")
        if payload_is_text:
            raw_payload = None if raw_payload is None else parse_payload(raw_payload)
        run_at = fields.get("run_at")
        if run_at is not None:
            if not isinstance(run_at, str):
                raise BadInput(f"invalid run_at {run_at!r}: expected an ISO-8601 string")
            run_at = parse_timestamp(run_at, what="--run-at" if not where else "run_at")
        return new_run(
            fields.get("type"),  # type: ignore[arg-type]
            raw_payload,
            run_at=run_at,
            delay=fields.get("delay"),
            idempotency_key=fields.get("idempotency_key"),
            max_attempts=fields.get("max_attempts"),
            priority=fields.get("priority"),
            tenant_id=fields.get("tenant"),
        )
    except BadInput as exc:
        if where:
            raise BadInput(f"{where}: {exc}") from None
        raise


def _read_jsonl(stream: IO[str]) -> list[Any]:
    runs = []
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        if len(line) > MAX_PAYLOAD_BYTES + 10_000:
            raise BadInput(f"{where}: longer than {MAX_PAYLOAD_BYTES} bytes")
        fields = decode_json(line, source=where)
        if not isinstance(fields, dict):
            raise BadInput(f'{where}: expected a JSON object with at least "type"')
        unknown = set(fields) - JSONL_KEYS
        if unknown:
            raise BadInput(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if "type" not in fields:
            raise BadInput(f'{where}: missing "type"')
        runs.append(_new_run(fields, where=where))
    if not runs:
        raise BadInput("--jsonl input has no runs")
    return runs


def _ids(values: tuple[str, ...]) -> list[int]:
    from cronjob.inputs import parse_run_id

    return list(dict.fromkeys(parse_run_id(v) for v in values))


def _change_runs(
    command: str, run_ids: tuple[str, ...], database_url: str | None, status_text: str | None,
    as_json: bool, options: dict[str, Any],
) -> int:  # fmt: skip
    """retry and cancel: by ids (one line per id) or by filters (counted, batched, audited)."""
    from cronjob import incident, store
    from cronjob.commands import incident as selecting

    chosen = incident.action(command)
    ids = _ids(run_ids)
    selection = selecting.build_selection(
        ids, selecting.statuses(status_text, chosen.eligible, command), options
    )
    if not ids and not selection.filtered:
        raise BadInput(f"give run ids or filters (--status, --type, ...) of the runs to {command}")
    if ids and selection.filtered:
        raise BadInput("give run ids or filters, not both")
    conn = open_connection(database_url)
    with conn:
        if ids and not options["dry_run"]:
            change_many = store.runs_retry_many if command == "retry" else store.runs_cancel_many
            changes = incident.apply_ids(
                conn, command, ids, change_many,
                actor=incident.actor_name(options["actor"]),
                reason=selecting.check_reason(options["reason"]),
            )  # fmt: skip
            return _report(changes, chosen.past, command, as_json)
        selection = selecting.with_clock(conn, selection, options)
        found, applied = selecting.act_on_selection(conn, command, selection, options)
    selecting.report_selection(command, chosen.past, selection, found, applied, as_json)
    return 0


def _selection_command(command: str, status_help: str) -> Callable[..., Any]:
    """The options retry and cancel share, stacked once."""
    from cronjob.commands.incident import change_options, filter_options

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = json_option(change_options(filter_options(func)))
        func = click.option("--status", "status_text", metavar="S1,S2", help=status_help)(func)
        func = database_url_option(func)
        func = click.argument("run_ids", metavar="[ID]...", nargs=-1)(func)
        return click.command(command)(func)

    return decorate


@_selection_command("retry", "Only runs in these statuses (any but succeeded).")
def retry(run_ids: tuple[str, ...], database_url: str | None, status_text: str | None,
          as_json: bool, **options: Any) -> int:  # fmt: skip
    """Make runs due now, with their lock cleared: by id, or every run a filter selects.

    A dead or cancelled run gets a fresh attempt budget; its history is kept.
    A succeeded run is not retried (by id: exit 1; a filter skips it).

    \b
    jobrunner retry 1234 1235
    jobrunner retry --status dead --type send_email --error-type SMTPServerDisconnected \\
        --since 2026-01-05T09:10:00Z --until 2026-01-05T09:40:00Z --dry-run

    Filters combine (all must hold); a list option takes comma-separated values. Work goes
    in batches of at most 1,000 runs, each its own transaction. A selection of more than
    100 runs asks first on a terminal, and needs --yes elsewhere. Writes one audit entry.
    """
    return _change_runs("retry", run_ids, database_url, status_text, as_json, options)


@_selection_command("cancel", "Only runs in these statuses (queued, failed, running).")
def cancel(run_ids: tuple[str, ...], database_url: str | None, status_text: str | None,
           as_json: bool, **options: Any) -> int:  # fmt: skip
    """Cancel runs that have not finished: by id, or every run a filter selects.

    A running handler is told at its next heartbeat (ctx.cancelled), and its
    outcome is discarded. Cancelling a finished run by id is refused (exit 1); a
    filter skips finished runs. Options as for `jobrunner retry`; writes one audit entry.
    """
    return _change_runs("cancel", run_ids, database_url, status_text, as_json, options)


def _report(changes: list[Any], done: str, verb: str, as_json: bool = False) -> int:
    code = 0 if all(change.changed for change in changes) else 1
    if as_json:
        click.echo(json.dumps([
            {"id": c.id, "previous": c.previous.value if c.previous else None,
             "changed": c.changed}
            for c in changes
        ], indent=2))  # fmt: skip
        return code
    for change in changes:
        if change.changed:
            click.echo(f"{done} {change.id}")
        elif change.previous is None:
            click.echo(f"jobrunner: error: run {change.id} not found", err=True)
            code = 1
        else:
            click.echo(
                f"jobrunner: error: cannot {verb} run {change.id}: it is {change.previous.value}",
                err=True,
            )
            code = 1
    return code


@click.command("list")
@database_url_option
@click.option("--status", "statuses", metavar="S1,S2", help="Only runs in these statuses.")
@click.option("--type", "job_types", metavar="T1,T2", help="Only runs of these job types.")
@click.option("--limit", type=click.IntRange(1, 100000), default=50, show_default=True)
@json_option
def list_runs(
    database_url: str | None,
    statuses: str | None,
    job_types: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest first."""
    from cronjob.models import Status
    from cronjob.store import runs_list

    status_list = _split(statuses)
    for status in status_list or []:
        if status not in {s.value for s in Status}:
            raise BadInput(
                f"unknown status {status!r}: expected one of {', '.join(s.value for s in Status)}"
            )
    conn = open_connection(database_url)
    with conn:
        runs = runs_list(conn, statuses=status_list, job_types=_split(job_types), limit=limit)
    if as_json:
        click.echo(json.dumps([_run_dict(r) for r in runs], indent=2))
        return
    rows = [
        (str(r.id), r.status.value, r.job_type, r.tenant_id or "",
         f"{r.attempts}/{r.max_attempts or '-'}", when(r.finished_at or r.run_at),
         clip(r.last_error or "", 60))
        for r in runs
    ]  # fmt: skip
    table(("ID", "STATUS", "TYPE", "TENANT", "ATTEMPTS", "RUN_AT/FINISHED", "LAST ERROR"), rows)


@click.command()
@click.argument("run_id", metavar="ID")
@database_url_option
@json_option
def show(run_id: str, database_url: str | None, as_json: bool) -> None:
    """Show one run and its attempt history."""
    from cronjob.errors import RunNotFound
    from cronjob.inputs import parse_run_id
    from cronjob.store import run_attempts_get, run_get

    number = parse_run_id(run_id)
    conn = open_connection(database_url)
    with conn:
        run = run_get(conn, number)
        if run is None:
            raise RunNotFound(f"run {number} not found")
        attempts = run_attempts_get(conn, number)
    if as_json:
        click.echo(json.dumps(
            {**_run_dict(run), "attempt_history": [_attempt_dict(a) for a in attempts]}, indent=2
        ))  # fmt: skip
        return
    fields = _run_dict(run)
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        if key == "payload":
            value = json.dumps(value)
        click.echo(f"{key:<{width}}  {'' if value is None else value}")
    if attempts:
        click.echo("\nfailed attempts:")
        for a in attempts:
            click.echo(f"  #{a.attempt}  {when(a.finished_at)}  {a.error_type}: {a.message or ''}"
                       f"  (worker {a.worker or '?'})")  # fmt: skip
        last = attempts[-1]
        if last.traceback:
            click.echo(f"\nlast traceback (attempt {last.attempt}):")
            click.echo(last.traceback.rstrip())


def _split(value: str | None) -> list[str] | None:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    return items or None


def _run_dict(run: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(run)
    data["status"] = run.status.value
    return {k: iso(v) for k, v in data.items()}


def _attempt_dict(attempt: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: iso(v) for k, v in asdict(attempt).items()}
