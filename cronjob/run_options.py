"""What a run can be enqueued with, besides its job type and payload: declared once, here.

Every door derives from `RunOptions`. `enqueue()` and `enqueue_async()` take its keys as
keywords; `jobrunner enqueue` makes an option of each key that has a `flag`; a `--jsonl`
line takes each key's `key`; the Django backend fills the keys a task sets; and the
insert statement (queries.enqueue) sends each key's array and writes its `column`. Runs that
set no `keyed` option may go in by COPY instead, which writes the same columns: what the
insert computes with an option's `expression`, the COPY computes with its `copied`. An
option that can be enqueued is one entry below, plus the migration that adds its column
and puts that column in the enqueuer role's INSERT grant (jobrunner_role_grants(), migration
0024: the migration replaces it and calls jobrunner_grant_roles()).

Values are checked the same way from every door (`check_options`), each by its option's
`check`, which takes what any door may give: a Python value, or the text of a command
line or a JSON line.
"""

# Not `from __future__ import annotations`: the metadata inside Annotated is read at
# import, from RunOptions' own annotations.
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, NamedTuple, TypedDict

from cronjob.errors import BadInput
from cronjob.inputs import (
    MAX_ID,
    MAX_IDEMPOTENCY_KEY_BYTES,
    check_text,
    check_time_in_range,
    encode_payload,
    excerpt,
    parse_duration,
    parse_id,
    parse_int,
    parse_integer,
    parse_max_attempts,
    parse_timestamp,
)


class Option(NamedTuple):
    """How one option of a run is given, checked and stored."""

    check: Callable[[Any, str], Any]  # (value, what it is called at that door) -> stored value
    what: str  # its name in messages from the Python API and a --jsonl line
    sql_type: str  # the type of its array in the insert
    column: str | None  # the job_runs column it is stored in; None: it only shapes another
    # The column's value, from the insert's input row (its options by name, and `{now}`).
    expression: str | None = None
    # The same value computed by the client, for a COPY: from the run's checked options and
    # the transaction's clock, read from the database. Given exactly when `expression` is.
    copied: Callable[[Mapping[str, Any], datetime], Any] | None = None
    # A key that another run may hold already: a run that sets it goes in by the insert,
    # whose ON CONFLICT finds the holder; the others may go in by COPY.
    keyed: bool = False
    # Sent only when a run of the batch sets it: a column a later migration added, so an
    # app upgraded before `jobrunner migrate` ran still enqueues everything else.
    optional: bool = False
    flag: str | None = None  # the option of `jobrunner enqueue`; None: not on the command line
    key: str | None = None  # the key of a --jsonl line; None: not in one
    metavar: str = "VALUE"
    help: str = ""
    is_flag: bool = False  # on the command line, a flag without a value; False means unset
    multiple: bool = False  # on the command line, given once per value (a list in a JSON line)


def _run_at(value: Any, what: str) -> datetime:
    if isinstance(value, str):
        return parse_timestamp(value, what=what)
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise BadInput(f"{what} must be a timezone-aware datetime")
    return check_time_in_range(value, what=what)


def _idempotency_key(value: Any, what: str) -> str:
    limit = MAX_IDEMPOTENCY_KEY_BYTES
    return check_text(value, what=what, max_length=limit, max_bytes=limit)


def _tenant_id(value: Any, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        # str() refuses integers of thousands of digits.
        value = str(parse_integer(value, what=what, low=-MAX_ID - 1, high=MAX_ID))
    elif not isinstance(value, str):
        value = str(value)
    return check_text(value, what=what)


def _traceparent(value: Any, what: str) -> str:
    from cronjob.tracecontext import valid_traceparent

    text = check_text(value, what=what, max_length=55)
    if not valid_traceparent(text):
        raise BadInput(
            f"invalid {what} {excerpt(text)}: expected W3C 00-<trace id>-<span id>-<flags>"
        )
    return text


def _tracestate(value: Any, what: str) -> str:
    from cronjob.tracecontext import MAX_TRACESTATE

    text = check_text(value, what=what, max_length=MAX_TRACESTATE)
    if not (text.isascii() and text.isprintable()):
        raise BadInput(f"invalid {what} {excerpt(text)}: expected printable ASCII")
    return text


def _replace(value: Any, what: str) -> bool | None:
    if value in (True, "true", "1"):
        return True
    if value in (False, None, "false", "0"):
        return None
    raise BadInput(f"invalid {what} {excerpt(value)}: expected true or false")


def _result_id(value: Any, what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    text = check_text(value, what=what, max_length=100)
    try:
        return uuid.UUID(text)
    except ValueError:
        raise BadInput(f"invalid {what} {excerpt(text)}: expected a UUID") from None


# The most runs one run may wait for.
MAX_AFTER = 1000


def _after(value: Any, what: str) -> tuple[int, ...] | None:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) > MAX_AFTER:
        raise BadInput(f"{what} takes at most {MAX_AFTER} run ids")
    ids = tuple(dict.fromkeys(parse_id(v, what=what) for v in values))
    return ids or None


def _after_policy(value: Any, what: str) -> str:
    if value not in ("succeeded", "finished"):
        raise BadInput(f"invalid {what} {excerpt(value)}: expected succeeded or finished")
    return str(value)


def _copied_run_at(options: Mapping[str, Any], now: datetime) -> datetime:
    at = options.get("run_at")
    if at is not None:
        return at
    # As make_interval(secs => delay) counts it: microseconds, rounded half to even.
    return now + timedelta(microseconds=round(options.get("delay", 0) * 1_000_000))


class RunOptions(TypedDict, total=False):
    """The options of a run, by the keyword `enqueue` takes each as."""

    run_at: Annotated[
        datetime | str,
        Option(
            check=_run_at,
            what="run_at",
            sql_type="timestamptz",
            column="run_at",
            expression="coalesce(run_at, {now} + make_interval(secs => coalesce(delay, 0)))",
            copied=_copied_run_at,
            flag="--run-at",
            key="run_at",
            metavar="ISO8601",
            help="When the run becomes due (default: now), from 1900-01-01 to 9000-01-01 UTC.",
        ),
    ]
    delay: Annotated[
        str | float,
        Option(
            check=lambda value, what: parse_duration(value, what=what),
            what="delay",
            sql_type="float8",
            column=None,
            flag="--delay",
            key="delay",
            metavar="DURATION",
            help="Due after this long, e.g. 90s, 5m, 2h.",
        ),
    ]
    idempotency_key: Annotated[
        str,
        Option(
            check=_idempotency_key,
            what="idempotency key",
            sql_type="text",
            column="idempotency_key",
            keyed=True,
            flag="--idempotency-key",
            key="idempotency_key",
            metavar="KEY",
            help="A key unique per job type and tenant (at most 1000 bytes): if a run of the "
            "same type and tenant has it already, its id is printed and nothing is enqueued.",
        ),
    ]
    max_attempts: Annotated[
        int | str,
        Option(
            check=lambda value, what: parse_max_attempts(value, what=what),
            what="max attempts",
            sql_type="int",
            column="max_attempts",
            flag="--max-attempts",
            key="max_attempts",
            metavar="N",
            help="Attempt budget (default: the handler's).",
        ),
    ]
    priority: Annotated[
        int | str,
        Option(
            check=lambda value, what: parse_int(value, what=what),
            what="priority",
            sql_type="int",
            column="priority",
            expression="coalesce(priority, 0)",
            copied=lambda options, now: options.get("priority", 0),
            flag="--priority",
            key="priority",
            metavar="N",
            help="Lower runs first (default 0).",
        ),
    ]
    tenant_id: Annotated[
        str | int,
        Option(
            check=_tenant_id,
            what="tenant id",
            sql_type="text",
            column="tenant_id",
            flag="--tenant",
            key="tenant",
            metavar="ID",
            help="The tenant the run is for.",
        ),
    ]
    # Unique while active (migration 0021): unlike the idempotency key, free again once the
    # run holding it has finished.
    unique_key: Annotated[
        str,
        Option(
            check=_idempotency_key,
            what="unique key",
            sql_type="text",
            column="unique_key",
            optional=True,
            keyed=True,
            flag="--unique-key",
            key="unique_key",
            metavar="KEY",
            help="While a run of the same type and tenant with this key has not finished, its "
            "id is printed and nothing is enqueued; once it has, the key is free again.",
        ),
    ]
    # With a unique key: the waiting run that holds it takes this run's payload and run_at, if
    # it has not started (a debounce).
    replace: Annotated[
        bool,
        Option(
            check=_replace,
            what="replace",
            sql_type="bool",
            column=None,
            optional=True,
            flag="--replace",
            key="replace",
            is_flag=True,
            help="With --unique-key: give the run that holds the key this payload and run_at "
            "(--run-at, --delay; default now) if it has not started yet.",
        ),
    ]
    # A Django task's queue_name (migration 0014): the backend sets it, no other door does.
    queue: Annotated[
        str,
        Option(
            check=lambda value, what: check_text(value, what=what, max_length=200),
            what="queue",
            sql_type="text",
            column="queue",
            optional=True,
        ),
    ]
    # A Django task's result id (migration 0015), unguessable where run ids are counted:
    # the backend sets it, no other door does.
    result_id: Annotated[
        uuid.UUID | str,
        Option(
            check=_result_id,
            what="result id",
            sql_type="uuid",
            column="result_id",
            optional=True,
        ),
    ]
    # A Django task's run_after (migration 0020), for TaskResult.task: run_at moves on with
    # retries, this stays. The backend sets it, no other door does.
    run_after: Annotated[
        datetime | str,
        Option(
            check=_run_at,
            what="run_after",
            sql_type="timestamptz",
            column="run_after",
            optional=True,
        ),
    ]
    # The W3C trace context of the enqueuer (migration 0018), continued by the tick's span
    # for each attempt: taken from the active OpenTelemetry context by enqueue() and the
    # Django backend, from TRACEPARENT and TRACESTATE by `jobrunner enqueue`.
    traceparent: Annotated[
        str,
        Option(
            check=_traceparent,
            what="traceparent",
            sql_type="text",
            column="traceparent",
            optional=True,
        ),
    ]
    tracestate: Annotated[
        str,
        Option(
            check=_tracestate,
            what="tracestate",
            sql_type="text",
            column="tracestate",
            optional=True,
        ),
    ]
    # The runs this one waits for (migration 0026): it is 'waiting', and claimable only once
    # they have all succeeded. Not a column: the enqueue records the edges after the insert.
    after: Annotated[
        list[int] | tuple[int, ...] | int | str,
        Option(
            check=_after,
            what="after",
            sql_type="bigint",
            column=None,
            optional=True,
            flag="--after",
            key="after",
            metavar="ID",
            multiple=True,
            help="Start only once run ID has succeeded (again for each run to wait for); if it "
            "is dead or cancelled, this run is cancelled with a reason naming it.",
        ),
    ]
    after_policy: Annotated[
        str,
        Option(
            check=_after_policy,
            what="after policy",
            sql_type="text",
            column=None,
            optional=True,
            flag="--after-policy",
            key="after_policy",
            metavar="POLICY",
            help="With --after: succeeded (default) waits for every run to succeed; finished "
            "runs once they have all ended, however.",
        ),
    ]
    # The batch the run is a member of (migration 0026): enqueue_batch sets it, on the runs it
    # is given, after making the batch.
    batch_id: Annotated[
        int,
        Option(
            check=lambda value, what: parse_id(value, what=what),
            what="batch id",
            sql_type="bigint",
            column="batch_id",
            optional=True,
        ),
    ]


RUN_OPTIONS: dict[str, Option] = {
    name: hint.__metadata__[0]
    for name, hint in typing.get_type_hints(RunOptions, include_extras=True).items()
}
# Sent in every insert, in this order; the optional ones follow when a batch sets them.
ALWAYS_SENT = tuple(name for name, option in RUN_OPTIONS.items() if not option.optional)
# The options that make a run keyed (Option.keyed).
KEYED = frozenset(name for name, option in RUN_OPTIONS.items() if option.keyed)
# The options that make a run wait for others: recorded apart from its insert.
WAITING = frozenset({"after", "after_policy"})


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to enqueue, already checked: its options hold only those that were set."""

    job_type: str
    payload_json: str = "{}"
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def keyed(self) -> bool:
        """Whether it sets a key that another run may hold (`Option.keyed`)."""
        return not KEYED.isdisjoint(self.options)


def check_options(given: Mapping[str, Any], *, names: Mapping[str, str] = {}) -> dict:
    """The options in `given` that are set (not None), each checked; raises BadInput naming
    the first bad one. `names`: what the door calls each option, for its messages (the
    command line's flags); by default `Option.what`. Unknown keys are the caller's to refuse."""
    options = {}
    for name, value in given.items():
        if value is None:
            continue
        option = RUN_OPTIONS[name]
        checked = option.check(value, names.get(name, option.what))
        if checked is not None:
            options[name] = checked
    if "replace" in options and "unique_key" not in options:
        raise BadInput(f"{names.get('replace', 'replace')} needs a unique key")
    if "after_policy" in options and "after" not in options:
        raise BadInput(
            f"{names.get('after_policy', 'after policy')} needs {names.get('after', 'after')}"
        )
    if "run_at" in options and "delay" in options:
        at, delay = names.get("run_at", "run_at"), names.get("delay", "delay")
        raise BadInput(f"give either {at} or {delay}, not both")
    return options


def checked_run(
    job_type: Any, payload: Any, options: Mapping[str, Any], *, names: Mapping[str, str] = {}
) -> NewRun:
    """A run to enqueue, every part checked (`check_options` for `options` and `names`);
    raises BadInput naming the first problem."""
    check_text(job_type, what="job type", max_length=200)
    payload_json = encode_payload({} if payload is None else payload)
    # Most runs of a bulk enqueue set no option: a check that finds nothing, skipped.
    return NewRun(job_type, payload_json, check_options(options, names=names) if options else {})


def unknown(given: Mapping[str, Any]) -> list[str]:
    """The keys of `given` that are no option of a run."""
    return [name for name in given if name not in RUN_OPTIONS]
