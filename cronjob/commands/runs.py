"""Commands about individual runs: enqueue, retry, cancel, list, show."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from cronjob.cli import Count, database_url_option, json_option, lock_wait_option
from cronjob.commands import open_connection
from cronjob.commands.batches import batch_callback, batch_member, then_options
from cronjob.commands.progress import tuned_for_bulk
from cronjob.commands.render import clip, iso, table, when
from cronjob.errors import BadInput
from cronjob.inputs import (
    MAX_PAYLOAD_BYTES,
    comma_list,
    decode_json,
    decode_text,
    excerpt,
    loads,
    parse_payload,
    read_text,
)
from cronjob.run_options import RUN_OPTIONS, NewRun, checked_run
from cronjob.text import printable

# A --jsonl line holds one payload and a few short fields.
MAX_JSONL_LINE_BYTES = MAX_PAYLOAD_BYTES + 10_000
# Runs inserted per statement, and the most JSON one statement carries: far below the 1 GB
# PostgreSQL takes in one message, and what keeps memory flat however long the input is.
JSONL_CHUNK = 5000
JSONL_CHUNK_BYTES = 4_000_000
# `show` writes its own lines at most two spaces in; stored text of several lines goes deeper.
TEXT_INDENT = "    "
# A --jsonl line's keys: the type, the payload, and each option's own (run_options).
JSONL_OPTIONS = {option.key: name for name, option in RUN_OPTIONS.items() if option.key}
JSONL_KEYS = {"type", "payload", *JSONL_OPTIONS}
# The options of `jobrunner enqueue` a run's options come from, by name.
FLAGS = {name: option.flag for name, option in RUN_OPTIONS.items() if option.flag}


def run_option_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """A command-line option for each option of a run that has a flag, in declared order."""
    for name, flag in reversed(FLAGS.items()):
        option = RUN_OPTIONS[name]
        if option.is_flag:
            func = click.option(flag, name, is_flag=True, default=None, help=option.help)(func)
        elif option.multiple:
            func = click.option(
                flag, name, metavar=option.metavar, multiple=True, help=option.help
            )(func)
        else:
            func = click.option(flag, name, metavar=option.metavar, help=option.help)(func)
    return func


@click.command()
@click.argument("job_type", metavar="TYPE", required=False)
@database_url_option
@click.option("--payload", metavar="JSON", help="The payload, as JSON (default {}).")
@click.option(
    "--payload-file",
    type=click.File("rb"),
    metavar="PATH",
    help="Read the payload from a file, or - for stdin "
    f"(UTF-8, at most {MAX_PAYLOAD_BYTES} bytes).",
)
@run_option_flags
@click.option(
    "--jsonl",
    type=click.File("rb"),
    metavar="FILE",
    help='Enqueue many: one JSON object a line ({"type": ..., "payload": ...} and '
    f"the optional keys {', '.join(JSONL_OPTIONS)}); "
    "- for stdin. One transaction: a bad line anywhere, or SIGINT or SIGTERM, and nothing "
    "is enqueued.",
)
@then_options
@lock_wait_option("another --jsonl batch with idempotency keys")
def enqueue(
    job_type: str | None,
    database_url: str | None,
    payload: str | None,
    payload_file: IO[bytes] | None,
    jsonl: IO[bytes] | None,
    then_type: str | None,
    then_payload: str | None,
    as_json: bool,
    lock_wait: float,
    **options: str | None,
) -> None:
    """Enqueue a run of TYPE and print its id.

    \b
    jobrunner enqueue send_email --payload '{"to": "a@example.com"}' --delay 5m
    jobrunner enqueue --jsonl runs.jsonl
    jobrunner enqueue --jsonl reports.jsonl --then reports.summary

    Each run records the caller's trace from TRACEPARENT and TRACESTATE, if set
    (OpenTelemetry's carrier for processes), so that its attempts are traced in it.
    """
    from cronjob.api import insert_runs

    # An option given once per value (--after) that was not given at all: unset.
    options = {name: None if value == () else value for name, value in options.items()}
    then = batch_callback(then_type, then_payload, as_json, jsonl is not None, _trace_context())
    if jsonl is not None:
        if (
            job_type
            or payload is not None
            or payload_file is not None
            or any(value is not None for value in options.values())
        ):
            raise BadInput(
                "--jsonl takes every field from its lines: give no TYPE or other options"
            )
        _enqueue_jsonl(jsonl, database_url, lock_wait, then=then, as_json=as_json)
        return
    if not job_type:
        raise BadInput("missing TYPE: the job type to enqueue (or use --jsonl)")
    text = _payload_text(payload, payload_file)
    payload_value = None if text is None else parse_payload(text)
    run = checked_run(job_type, payload_value, {**_trace_context(), **options}, names=FLAGS)
    conn = open_connection(database_url)
    with conn:
        [run_id] = insert_runs(conn, [run])
    click.echo(run_id)


def _enqueue_jsonl(
    stream: IO[bytes],
    database_url: str | None,
    lock_wait: float,
    *,
    then: NewRun | None = None,
    as_json: bool = False,
) -> None:
    """Check and insert chunk by chunk in one transaction, and print the ids once it commits.

    The first chunk is checked before connecting; a bad line further on rolls everything
    back, and so does SIGINT or SIGTERM (between two chunks). A thread of its own sends each
    chunk while the next is read and checked: the server stores one while this process
    decodes the other. The ids wait in a temporary file, so memory does not grow with the
    input.
    """
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from itertools import chain

    from cronjob import store
    from cronjob.commands.progress import on_terminal, watching

    with tuned_for_bulk():
        chunks = _jsonl_chunks(stream)
        first = next(chunks, None)
        if first is None:
            raise BadInput("--jsonl input has no runs")
        total = _lines_in(stream) if on_terminal() else None
        conn = open_connection(database_url)
        with conn, tempfile.TemporaryFile("w+") as ids:
            progress = watching("enqueueing", told=_nothing_enqueued, total=total)
            # The sender is inner to the transaction: whatever happened, it is done with the
            # connection before the transaction ends.
            with progress as watch, conn.transaction(), ThreadPoolExecutor(1) as sender:
                keyed = False
                sending = None
                batch_id = None if then is None else store.batch_insert(conn, then, "finished")
                for chunk in chain([first], chunks):
                    if batch_id is not None:
                        chunk = [batch_member(run, batch_id) for run in chunk]
                    watch.checkpoint()
                    lock = not keyed and any(run.keyed for run in chunk)
                    keyed = keyed or lock
                    if sending is not None:
                        _sent(sending, ids, watch)
                    sending = sender.submit(_send, conn, chunk, lock, lock_wait)
                if sending is not None:
                    _sent(sending, ids, watch)
                if batch_id is not None:
                    store.batch_end(conn, batch_id)
            ids.seek(0)
            if batch_id is not None:
                run_ids = [int(line) for line in ids]
                shown = {"batch_id": batch_id, "run_ids": run_ids} if as_json else batch_id
                click.echo(json.dumps(shown) if as_json else shown)
                return
            while block := ids.read(1 << 16):
                click.echo(block, nl=False)


def _send(conn: Any, chunk: list[Any], lock: bool, lock_wait: float) -> list[int]:
    """Insert a chunk; `lock`: take the keyed-batch lock first (a run in it has a key)."""
    from cronjob import locks
    from cronjob.api import insert_runs
    from cronjob.store import runs_lock_for_keyed_batch

    if lock:
        what = "batch with idempotency keys"
        locks.take(conn, runs_lock_for_keyed_batch, what=what, wait=lock_wait)
    return insert_runs(conn, chunk)


def _sent(sending: Any, ids: IO[str], watch: Any) -> None:
    """Wait for a chunk to be sent, and keep its ids."""
    run_ids = sending.result()
    ids.write("".join(f"{run_id}\n" for run_id in run_ids))
    watch.advance(len(run_ids))


def _nothing_enqueued(_done: int) -> str:
    return (
        "nothing enqueued: the input goes in one transaction, rolled back; the same command "
        "again enqueues all of it"
    )


def _lines_in(stream: IO[bytes]) -> int | None:
    """How many lines a --jsonl file holds, for its progress: None unless it is a regular
    file. Read beside the stream, which stays where it is. Blank lines, which hold no run,
    leave the count of runs short of it."""
    import os
    import stat

    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError):
        return None
    lines, offset, last = 0, 0, b"\n"
    while block := os.pread(fd, 1 << 20, offset):
        lines += block.count(b"\n")
        offset += len(block)
        last = block[-1:]
    return lines + (last != b"\n")


def _payload_text(payload: str | None, payload_file: IO[bytes] | None) -> str | None:
    if payload is not None and payload_file is not None:
        raise BadInput("give either --payload or --payload-file, not both")
    if payload_file is not None:
        return read_text(payload_file, MAX_PAYLOAD_BYTES, source="--payload-file")
    return payload


def _jsonl_chunks(stream: IO[bytes]) -> Iterator[list[Any]]:
    """Checked runs, a chunk at a time: at most JSONL_CHUNK runs or JSONL_CHUNK_BYTES of JSON.
    A line's place ("line 12") is spelled out for its error only: this loop bounds a bulk
    enqueue."""
    chunk: list[Any] = []
    size = 0
    trace = _trace_context()
    for number, line in _jsonl_lines(stream):
        try:
            fields = loads(line)
        except (ValueError, RecursionError):
            fields = decode_json(line, source=f"line {number}")  # raises its one-line error
        if not isinstance(fields, dict) or "type" not in fields or not fields.keys() <= JSONL_KEYS:
            _refuse_fields(fields, f"line {number}")
        options = dict(trace)
        if len(fields) > 2 or "payload" not in fields:  # more than the type and payload
            options.update((JSONL_OPTIONS[k], v) for k, v in fields.items() if k in JSONL_OPTIONS)
        try:
            run = checked_run(fields["type"], fields.get("payload"), options)
        except BadInput as exc:
            raise BadInput(f"line {number}: {exc}") from None
        chunk.append(run)
        size += len(run.payload_json)
        if len(chunk) >= JSONL_CHUNK or size >= JSONL_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _refuse_fields(fields: Any, where: str) -> None:
    """Raise the error for a --jsonl line that is no object of known keys with a type."""
    if not isinstance(fields, dict):
        raise BadInput(f'{where}: expected a JSON object with at least "type"')
    unknown = set(fields) - JSONL_KEYS
    if unknown:
        shown = ", ".join(excerpt(key, 40) for key in sorted(unknown)[:5])
        raise BadInput(f"{where}: unknown key(s) {shown}")
    raise BadInput(f'{where}: missing "type"')


def _trace_context() -> dict[str, str]:
    """The caller's trace, from the environment-variable carrier OpenTelemetry defines for
    processes (TRACEPARENT, TRACESTATE): the runs' spans continue it."""
    from cronjob.tracecontext import from_environment

    return from_environment()


def _jsonl_lines(stream: IO[bytes]) -> Iterator[tuple[int, str]]:
    """Each non-blank line with its number, read no further than the longest line allowed."""
    number = 0
    while data := stream.readline(MAX_JSONL_LINE_BYTES + 2):
        number += 1
        content = data[:-1] if data.endswith(b"\n") else data
        if len(content) > MAX_JSONL_LINE_BYTES:
            raise BadInput(f"line {number}: longer than {MAX_JSONL_LINE_BYTES} bytes")
        if content and not content.isspace():
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError:
                text = decode_text(content, source=f"line {number}")  # raises, saying where
            yield number, text


def _change_runs(
    command: str, run_ids: tuple[str, ...], database_url: str | None, status_text: str | None,
    as_json: bool, options: dict[str, Any],
) -> int:  # fmt: skip
    """retry and cancel: by ids (one line per id) or by filters (counted, batched, audited)."""
    from cronjob import incident, operations
    from cronjob.commands import incident as selecting
    from cronjob.inputs import parse_run_ids

    chosen = incident.action(command)
    ids = parse_run_ids(run_ids)
    selection = incident.build_selection(
        ids, selecting.statuses(status_text, chosen.eligible, command), options
    )
    if not ids and not selection.filtered:
        raise BadInput(f"give run ids or filters (--status, --type, ...) of the runs to {command}")
    if ids and selection.filtered:
        raise BadInput("give run ids or filters, not both")
    conn = open_connection(database_url)
    with conn:
        if ids and not options["dry_run"]:
            changes = operations.change_runs(
                conn, command, ids, actor=incident.actor_name(options["actor"]),
                reason=selecting.check_reason(options["reason"]),
            )  # fmt: skip
            return _report(changes, chosen.past, command, as_json)
        selection = incident.with_clock(conn, selection, options)
        found, applied = selecting.act_on_selection(
            conn, command, selection, options, as_json=as_json
        )
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
    in batches of at most 1,000 runs, each its own transaction, with its progress shown on
    a terminal; SIGINT or SIGTERM stops it after the batch under way (exit 130 or 143). A
    selection of more than 100 runs asks first on a terminal, and needs --yes elsewhere.
    Writes one audit entry.
    """
    return _change_runs("retry", run_ids, database_url, status_text, as_json, options)


@_selection_command("cancel", "Only runs in these statuses (queued, failed, running, waiting).")
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
@click.option("--limit", type=Count(1, 100000), default=50, show_default=True)
@json_option
def list_runs(
    database_url: str | None,
    statuses: str | None,
    job_types: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest first."""
    from cronjob.inputs import parse_statuses
    from cronjob.store import runs_list

    chosen = parse_statuses(statuses) or None
    conn = open_connection(database_url)
    with conn:
        found = runs_list(
            conn, statuses=chosen, job_types=comma_list(job_types) or None, limit=limit,
            payloads=as_json,
        )  # fmt: skip
        if as_json:
            _echo_json_array(_run_dict(r) for r in found)
            return
        runs = list(found)
    rows = [
        (str(r.id), r.status.value, r.job_type, r.tenant_id or "",
         f"{r.attempts}/{r.max_attempts or '-'}", when(r.finished_at or r.run_at),
         clip(r.last_error or "", 60))
        for r in runs
    ]  # fmt: skip
    table(("ID", "STATUS", "TYPE", "TENANT", "ATTEMPTS", "RUN_AT/FINISHED", "LAST ERROR"), rows)


def _throttled_text(limit: Any) -> str:
    from cronjob.limits import describe

    return f"waiting for its type's limit ({describe(limit)}; `jobrunner limits`)"


@click.command()
@click.argument("run_id", metavar="ID")
@database_url_option
@json_option
def show(run_id: str, database_url: str | None, as_json: bool) -> None:
    """Show one run, its batch and dependencies, its attempt history and what its handler
    logged in each attempt.

    Each attempt's kept log lines are printed under it (--json: `attempt_logs`, each
    with its `events`), redacted, the newest 100 at most.
    """
    from cronjob.commands.batches import echo_run_relations, run_relations
    from cronjob.errors import RunNotFound
    from cronjob.inputs import parse_run_id
    from cronjob.store import job_type_limit_get_for_run, run_attempts_get, run_get, run_logs_get

    number = parse_run_id(run_id)
    conn = open_connection(database_url)
    with conn:
        run = run_get(conn, number)
        if run is None:
            raise RunNotFound(f"run {number} not found")
        attempts = run_attempts_get(conn, number)
        logs = run_logs_get(conn, number)
        limit = job_type_limit_get_for_run(conn, number)
        related = run_relations(conn, number)
    # A due run of a limited type waits for a place or a window, as it was told to.
    throttled = {} if limit is None else {"throttled": _throttled_text(limit)}
    if as_json:
        click.echo(
            json.dumps(
                {
                    **_run_dict(run),
                    **throttled,
                    **related,
                    "attempt_history": [_attempt_dict(a) for a in attempts],
                    "attempt_logs": [_attempt_dict(log) for log in logs],
                },
                indent=2,
            )
        )
        return
    fields = {**_run_dict(run), **throttled}
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        if key == "payload":
            value = json.dumps(value)
        click.echo(f"{key:<{width}}  {'' if value is None else printable(str(value))}")
    echo_run_relations(related)
    if attempts or logs:
        click.echo("\nattempts:")
        for attempt, log in _attempts_with_logs(attempts, logs):
            if attempt is not None:
                click.echo(
                    printable(
                        f"  #{attempt.attempt}  {when(attempt.finished_at)}  "
                        f"{attempt.error_type}: {attempt.message or ''}  "
                        f"(worker {attempt.worker or '?'})"
                    )
                )
            elif log is not None:
                click.echo(
                    printable(
                        f"  #{log.attempt}  {when(log.created_at)}  {log.outcome}  "
                        f"(worker {log.worker or '?'})"
                    )
                )
            if log is not None:
                _echo_events(log)
    if attempts:
        last = attempts[-1]
        if last.traceback:
            click.echo(f"\nlast traceback (attempt {last.attempt}):")
            click.echo(_indented(printable(last.traceback.rstrip(), keep_newlines=True)))


def _attempts_with_logs(attempts: list[Any], logs: list[Any]) -> list[tuple[Any, Any]]:
    """Each failed attempt with its run log, and each other attempt's run log, in order.

    A failed attempt and its log are written by one statement, at one time: that, and the
    attempt number, pairs them (numbers repeat once a retry gives a dead run a fresh budget).
    """
    by_attempt = {(log.attempt, log.created_at): log for log in logs}
    paired = [(a, by_attempt.pop((a.attempt, a.finished_at), None)) for a in attempts]
    rest = [(None, log) for log in by_attempt.values()]
    return sorted(paired + rest, key=_moment)


def _moment(pair: tuple[Any, Any]) -> Any:
    attempt, log = pair
    return attempt.finished_at if attempt is not None else log.created_at


def _echo_events(log: Any) -> None:
    """A run log's events, one a line, deeper than the attempt's own line; the run's own
    fields, which `ctx.log` binds to each of them, are the attempt's line already."""
    from cronjob.runlog import event_line

    if log.trimmed:
        click.echo(f"{TEXT_INDENT}({log.trimmed} earlier events not kept)")
    for event in log.events:
        if isinstance(event, dict):
            line, exception = event_line(event)
            click.echo(TEXT_INDENT + line)
            if exception:
                click.echo(_indented(_indented(exception)))


def _indented(text: str) -> str:
    """Stored text of several lines, each indented deeper than any line `show` writes itself,
    so that no line of it can pass for one of them (or for a line of another command)."""
    return "\n".join(f"{TEXT_INDENT}{line}" if line else "" for line in text.split("\n"))


def _echo_json_array(items: Iterator[dict[str, Any]]) -> None:
    """What json.dumps(list(items), indent=2) prints, written an item at a time."""
    opened = False
    for item in items:
        text = json.dumps(item, indent=2).replace("\n", "\n  ")
        click.echo(f"{',' if opened else '['}\n  {text}", nl=False)
        opened = True
    click.echo("\n]" if opened else "[]")


def _run_dict(run: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(run)
    data["status"] = run.status.value
    return {k: iso(v) for k, v in data.items()}


def _attempt_dict(attempt: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: iso(v) for k, v in asdict(attempt).items()}
