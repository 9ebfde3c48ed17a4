"""The store's functions that read and write runs, definitions and effects, as models.

Like every store function they never commit on their own, but for the claim
functions: on the autocommit connection they require, they group their statements
in one transaction of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.rows import RowFactory, class_row, dict_row, kwargs_row

from cronjob import queries
from cronjob.models import (
    Advance,
    Attempt,
    AuditEntry,
    BatchResult,
    ClaimedRun,
    Decision,
    Definition,
    DefinitionSchedule,
    DefinitionSpec,
    DueDefinition,
    DurationSummary,
    PingTarget,
    Run,
    RunCell,
    RunSnapshot,
    ScheduleHealthRow,
    ScheduleSkip,
    Selection,
    SelectionCount,
    Status,
    TypePause,
    UnreadablePayload,
)
from cronjob.store.preflight import _advisory_lock

if TYPE_CHECKING:
    from collections.abc import Callable
    from uuid import UUID

_T = TypeVar("_T")


@dataclass(frozen=True)
class NewRun:
    """A run to enqueue, already validated."""

    job_type: str
    payload_json: str = "{}"
    run_at: datetime | None = None
    delay: float | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    priority: int | None = None
    tenant_id: str | None = None
    queue: str | None = None  # a Django task's queue_name; None for every other run


@dataclass(frozen=True)
class Enqueued:
    """One enqueued run, or the run that already had its idempotency key, with that
    run's job type and tenant."""

    id: int
    created: bool
    job_type: str
    tenant_id: str | None


@dataclass(frozen=True)
class Change:
    """The result of retry/cancel for one id: its status before, and whether it changed."""

    id: int
    previous: Status | None  # None: no such run
    changed: bool


def runs_insert_many(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    cursor = conn.cursor(row_factory=dict_row)
    rows = cursor.execute(*_inserting(runs, now)).fetchall()
    missing = [row["idempotency_key"] for row in rows if row["id"] is None]
    found: dict[str, dict[str, Any]] = {}
    if missing:
        # Another transaction inserted these keys while ours waited on them; they
        # are visible now, in a statement with a fresh snapshot.
        by_key = conn.cursor(row_factory=dict_row).execute(
            queries.RUNS_INSERT_MANY_IDS_BY_KEY, {"keys": missing}
        )
        found = {row["idempotency_key"]: row for row in by_key.fetchall()}
    return _enqueued(rows, found)


def _inserting(runs: Sequence[NewRun], now: datetime | None) -> tuple[str, dict[str, Any]]:
    """The insert for `runs`, and its parameters."""
    # Only a Django task names a queue (and so needs migration 0014's column).
    queued = any(r.queue is not None for r in runs)
    statement = queries.RUNS_INSERT_MANY_QUEUED if queued else queries.RUNS_INSERT_MANY
    return statement, {
        "job_types": [r.job_type for r in runs],
        "payloads": [r.payload_json for r in runs],
        "run_ats": [r.run_at for r in runs],
        "delays": [r.delay for r in runs],
        "keys": [r.idempotency_key for r in runs],
        "max_attempts": [r.max_attempts for r in runs],
        "priorities": [r.priority for r in runs],
        "tenants": [r.tenant_id for r in runs],
        **({"queues": [r.queue for r in runs]} if queued else {}),
        "now": now,
    }


def _enqueued(rows: list[dict[str, Any]], found: dict[str, dict[str, Any]]) -> list[Enqueued]:
    """Each input row's run: its own, or the run already holding its key (`found`)."""
    for row in rows:
        if row["id"] is None:
            row.update(found[row["idempotency_key"]])
    return [
        Enqueued(
            id=int(row["id"]),
            created=bool(row["created"]),
            job_type=row["job_type"],
            tenant_id=row["tenant_id"],
        )
        for row in rows
    ]


def runs_lock_for_keyed_batch(conn: Any, *, wait: bool = True) -> bool:
    """Take the keyed-batch lock, held until this transaction ends; with `wait`, queue for
    any other batch with idempotency keys, else return False at once if one holds it."""
    return _advisory_lock(
        conn, queries.RUNS_LOCK_FOR_KEYED_BATCH, queries.RUNS_LOCK_FOR_KEYED_BATCH_TRY, wait=wait
    )


def runs_claim_many(
    conn: Any,
    *,
    job_types: Sequence[str],
    leases: Sequence[float],
    max_attempts: Sequence[int],
    limit: int,
    worker: str,
    now: datetime | None = None,
    token: UUID | None = None,
) -> list[ClaimedRun]:
    """Claim up to `limit` due runs in a transaction of their own (commits them).

    `token` is the claim's lease token (a new one unless given): a caller that knows
    it can find what the claim holds even if its answer is lost.
    """
    _require_autocommit(conn)
    params = _claim_params(job_types, leases, max_attempts, limit, worker, now, token)
    with conn.pipeline(), conn.transaction():
        conn.execute(queries.RUNS_CLAIM_MANY_PLAN)
        claiming = conn.execute(queries.RUNS_CLAIM_MANY, params)
    return _claimed_runs(claiming.fetchall(), params["token"])


def _require_autocommit(conn: Any) -> None:
    # Inside a caller's transaction the claim would commit only with it, and the
    # planner settings of queries.RUNS_CLAIM_MANY_PLAN would stay on for the rest of it.
    if not conn.autocommit:
        raise ValueError("claiming needs an autocommit connection: a claim commits on its own")


def _claim_params(
    job_types: Sequence[str],
    leases: Sequence[float],
    max_attempts: Sequence[int],
    limit: int,
    worker: str,
    now: datetime | None,
    token: UUID | None,
) -> dict[str, Any]:
    import uuid  # the busy path only: an idle tick claims nothing

    return {
        "token": token or uuid.uuid4(),
        "job_types": list(job_types),
        "leases": list(leases),
        "max_attempts": list(max_attempts),
        "limit": limit,
        "worker": worker,
        "now": now,
    }


def runs_finalize_many(
    conn: Any, decisions: Sequence[Decision], *, worker: str, now: datetime | None = None
) -> set[int]:
    """Apply decisions; returns the ids whose lease was still held (the others are lost)."""
    if not decisions:
        return set()
    rows = conn.execute(queries.RUNS_FINALIZE_MANY, _finalize_params(decisions, worker, now))
    return {row[0] for row in rows.fetchall()}


# psycopg's jsonb loader costs several times the decoding itself; the claim asks
# for payload::text (PostgreSQL's canonical JSON) and one shared decoder reads it,
# to the same Python values json.loads gives.
_decode_payload = json.JSONDecoder().decode


def _claimed_runs(rows: list[Sequence[Any]], token: UUID) -> list[ClaimedRun]:
    # By position, on the tick's hot path: the columns are queries.RUNS_CLAIM_MANY_COLUMNS,
    # which lists ClaimedRun's fields in order, bar the lease token.
    decode = _decode_payload
    try:
        return [
            ClaimedRun(id_, type_, decode(payload), tenant, due, attempt, final, token, schedule)
            for id_, type_, payload, tenant, due, attempt, final, schedule in rows
        ]
    except (RecursionError, ValueError):
        # A payload written by someone else's SQL may be valid JSON that Python cannot
        # read (nested thousands deep, an integer of thousands of digits): it fails its
        # own run only, never the runs claimed beside it.
        readable = _payload_or_unreadable
        return [
            ClaimedRun(
                run_id, job_type, readable(payload), tenant, due, attempt, final, token, schedule
            )
            for run_id, job_type, payload, tenant, due, attempt, final, schedule in rows
        ]


def _payload_or_unreadable(text: str) -> Any:
    try:
        return _decode_payload(text)
    except (RecursionError, ValueError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        return UnreadablePayload(f"the payload cannot be decoded: {reason}")


def runs_finalize_and_claim_many(
    conn: Any,
    decisions: Sequence[Decision],
    *,
    job_types: Sequence[str],
    leases: Sequence[float],
    max_attempts: Sequence[int],
    limit: int,
    worker: str,
    now: datetime | None = None,
    token: UUID | None = None,
) -> tuple[set[int], list[ClaimedRun]]:
    """Finalize one batch and claim the next in one transaction and one round trip.

    On an autocommit connection (required) each statement would commit, and wait
    for the log flush, on its own; together they pay for one commit.
    """
    if not decisions:
        return set(), runs_claim_many(
            conn, job_types=job_types, leases=leases, max_attempts=max_attempts,
            limit=limit, worker=worker, now=now, token=token,
        )  # fmt: skip
    _require_autocommit(conn)
    claim_params = _claim_params(job_types, leases, max_attempts, limit, worker, now, token)
    with conn.pipeline(), conn.transaction():
        finalized = conn.execute(
            queries.RUNS_FINALIZE_MANY, _finalize_params(decisions, worker, now)
        )
        conn.execute(queries.RUNS_CLAIM_MANY_PLAN)
        claiming = conn.execute(queries.RUNS_CLAIM_MANY, claim_params)
    return {row[0] for row in finalized.fetchall()}, _claimed_runs(
        claiming.fetchall(), claim_params["token"]
    )


def _finalize_params(
    decisions: Sequence[Decision], worker: str, now: datetime | None
) -> dict[str, Any]:
    # Column by column, on the tick's hot path; most decisions carry no error.
    errors = [d.error for d in decisions]
    if any(errors):
        error_types = [e.error_type if e else None for e in errors]
        messages = [e.message if e else None for e in errors]
        tracebacks = [e.traceback if e else None for e in errors]
    else:
        error_types = messages = tracebacks = errors  # all None
    return {
        "ids": [d.run.id for d in decisions],
        "tokens": [d.run.lease_token for d in decisions],
        "statuses": [d.status.value for d in decisions],
        "delays": [d.retry_delay for d in decisions],
        "error_types": error_types, "messages": messages, "tracebacks": tracebacks,
        "worker": worker, "now": now,
    }  # fmt: skip


def runs_heartbeat_many(
    conn: Any, runs: Sequence[ClaimedRun], leases: Sequence[float], *, now: datetime | None = None
) -> dict[int, datetime]:
    """Renew leases; returns the new lease expiry of each run still held."""
    rows = conn.execute(
        queries.RUNS_HEARTBEAT_MANY,
        {
            "ids": [r.id for r in runs],
            "tokens": [r.lease_token for r in runs],
            "leases": list(leases),
            "now": now,
        },
    ).fetchall()
    return dict(rows)


def runs_hand_back_many(
    conn: Any, runs: Sequence[ClaimedRun], *, now: datetime | None = None
) -> set[int]:
    if not runs:
        return set()
    rows = conn.execute(
        queries.RUNS_HAND_BACK_MANY,
        {"ids": [r.id for r in runs], "tokens": [r.lease_token for r in runs], "now": now},
    ).fetchall()
    return {row[0] for row in rows}


def runs_hand_back_claim(conn: Any, token: UUID, *, now: datetime | None = None) -> list[int]:
    """Hand back every run still held under one claim's lease token; returns their ids."""
    rows = conn.execute(queries.RUNS_HAND_BACK_CLAIM, {"token": token, "now": now}).fetchall()
    return sorted(row[0] for row in rows)


def runs_list_decided(conn: Any, decisions: Sequence[Decision], *, worker: str) -> set[int]:
    """The runs of `decisions` that are as those decisions, written by `worker`, left them."""
    if not decisions:
        return set()
    rows = conn.execute(queries.RUNS_LIST_DECIDED, {
        "ids": [d.run.id for d in decisions],
        "attempts": [d.run.attempt for d in decisions],
        "statuses": [d.status.value for d in decisions],
        "error_types": [d.error.error_type if d.error else None for d in decisions],
        "worker": worker,
    })  # fmt: skip
    return {row[0] for row in rows.fetchall()}


def runs_rescue_many(conn: Any, *, limit: int = 1000, now: datetime | None = None) -> list[int]:
    rows = conn.execute(queries.RUNS_RESCUE_MANY, {"limit": limit, "now": now}).fetchall()
    return [row[0] for row in rows]


def _with_status(model: Callable[..., _T]) -> RowFactory[_T]:
    """Rows of a model whose `status` column is a Status."""

    def build(*, status: str, **columns: Any) -> _T:
        return model(status=Status(status), **columns)

    return kwargs_row(build)


def _run(*, status: str, payload: str, **columns: Any) -> Run:
    # A payload Python cannot decode is shown as the JSON text it is stored as:
    # readers print what they can, one odd row never fails a listing.
    decoded = _payload_or_unreadable(payload)
    readable = payload if isinstance(decoded, UnreadablePayload) else decoded
    return Run(status=Status(status), payload=readable, **columns)


_RUN = kwargs_row(_run)
_ATTEMPT = class_row(Attempt)


def run_get(conn: Any, run_id: int) -> Run | None:
    return conn.cursor(row_factory=_RUN).execute(queries.RUN_GET, {"id": run_id}).fetchone()


def runs_list_ids_by_definition(conn: Any, definition_ids: Sequence[int]) -> list[int]:
    params = {"definition_ids": list(definition_ids)}
    return [row[0] for row in conn.execute(queries.RUNS_LIST_IDS_BY_DEFINITION, params).fetchall()]


def run_attempts_get(conn: Any, run_id: int) -> list[Attempt]:
    cursor = conn.cursor(row_factory=_ATTEMPT)
    return cursor.execute(queries.RUN_ATTEMPTS_GET, {"id": run_id}).fetchall()


def runs_list(
    conn: Any,
    *,
    statuses: Sequence[str] | None = None,
    job_types: Sequence[str] | None = None,
    limit: int = 50,
    payloads: bool = True,
) -> Iterator[Run]:
    """Runs, newest first, streamed a row at a time (payloads None unless `payloads`)."""
    params = {
        "statuses": list(statuses) if statuses else None,
        "job_types": list(job_types) if job_types else None,
        "limit": limit,
    }
    sql = queries.RUNS_LIST if payloads else queries.RUNS_LIST_WITHOUT_PAYLOAD
    # Streamed: the whole result of a client-side cursor is held in memory at once.
    return conn.cursor(row_factory=_RUN).stream(sql, params)


def runs_retry_many(conn: Any, ids: Sequence[int], *, now: datetime | None = None) -> list[Change]:
    return _changes(conn, queries.RUNS_RETRY_MANY, ids, now)


def runs_cancel_many(conn: Any, ids: Sequence[int], *, now: datetime | None = None) -> list[Change]:
    return _changes(conn, queries.RUNS_CANCEL_MANY, ids, now)


def _changes(conn: Any, sql: str, ids: Sequence[int], now: datetime | None) -> list[Change]:
    rows = conn.cursor(row_factory=dict_row).execute(sql, {"ids": list(ids), "now": now})
    found = {
        row["id"]: Change(id=row["id"], previous=Status(row["status"]), changed=row["changed"])
        for row in rows.fetchall()
    }
    return [found.get(i, Change(id=i, previous=None, changed=False)) for i in ids]


# -- effects: the handler's transaction and the effects ledger --


def handler_transaction_mark(conn: Any, lease_token: str) -> None:
    """Mark `conn`'s open transaction as the one opened for the run holding `lease_token`."""
    conn.execute(queries.HANDLER_TRANSACTION_MARK, {"token": lease_token})


def handler_transaction_get_mark(conn: Any) -> str | None:
    """The lease token the transaction was marked with; None or '' once it ended."""
    return conn.execute(queries.HANDLER_TRANSACTION_GET_MARK).fetchone()[0]


def handler_transaction_restore_limits(conn: Any) -> None:
    conn.execute(queries.HANDLER_TRANSACTION_RESTORE_LIMITS)


def effect_insert_once(conn: Any, key: str, run: ClaimedRun) -> bool:
    """Record `key` in the caller's transaction; True if it was not recorded yet."""
    row = conn.execute(
        queries.EFFECT_INSERT_ONCE, {"key": key, "run_id": run.id, "attempt": run.attempt}
    ).fetchone()
    return row is not None


def effect_insert_at_most_once(conn: Any, key: str, run: ClaimedRun) -> tuple[bool, bool]:
    """Record `key` for `run` if it still holds its lease: (lease held, newly recorded)."""
    held, recorded = conn.execute(
        queries.EFFECT_INSERT_AT_MOST_ONCE,
        {"key": key, "run_id": run.id, "token": run.lease_token},
    ).fetchone()
    return bool(held), bool(recorded)


def effects_prune_many(
    conn: Any,
    *,
    older_than_seconds: float = 0.0,
    batch_size: int,
    now: datetime | None = None,
) -> int:
    """Delete ledger keys whose run is gone and that are older than `older_than_seconds`.

    Works in batches of `batch_size` keys, one statement each (on an autocommit
    connection, each batch commits on its own, so locks stay short). Returns how
    many keys were deleted. Keys whose run still exists are never deleted.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    params = {"older_than": float(older_than_seconds), "limit": batch_size, "now": now}
    total = 0
    while True:
        deleted = conn.execute(queries.EFFECTS_PRUNE_MANY, params).rowcount
        total += deleted
        if deleted < batch_size:
            return total


# -- operations --


def runs_snapshot(conn: Any, *, now: datetime | None = None) -> RunSnapshot:
    cursor = conn.cursor(row_factory=dict_row)
    if conn.autocommit:
        with conn.pipeline(), conn.transaction():  # one round trip
            conn.execute(queries.RUNS_SNAPSHOT_PLAN)
            cursor.execute(queries.RUNS_SNAPSHOT, {"now": now})
        rows = cursor.fetchall()
    else:  # the caller's transaction: its planner settings are the caller's to choose
        rows = cursor.execute(queries.RUNS_SNAPSHOT, {"now": now}).fetchall()
    cells = tuple(_run_cell(**row) for row in rows if row["job_type"] is not None)
    return RunSnapshot(now=rows[0]["now"], cells=cells)


def _run_cell(*, now: datetime, status: str, **counts: Any) -> RunCell:
    # `now` is on every row, and belongs to the snapshot rather than to a cell.
    return RunCell(status=Status(status), **counts)


def run_tally_compact(conn: Any) -> None:
    """Fold the finished-run tally into one row per (job type, status), unless another does."""
    conn.execute(queries.RUN_TALLY_COMPACT)


def definitions_list_schedules(conn: Any) -> list[DefinitionSchedule]:
    cursor = conn.cursor(row_factory=class_row(DefinitionSchedule))
    return cursor.execute(queries.DEFINITIONS_LIST_SCHEDULES).fetchall()


def runs_summarize_durations(
    conn: Any,
    *,
    window: float,
    quantiles: Sequence[float],
    now: datetime | None = None,
) -> list[DurationSummary]:
    rows = conn.cursor(row_factory=dict_row).execute(
        queries.RUNS_SUMMARIZE_DURATIONS,
        {"window": window, "quantiles": list(quantiles), "now": now},
    )
    return [
        DurationSummary(
            job_type=row["job_type"],
            count=row["count"],
            total=row["total"],
            quantiles=tuple(zip(quantiles, row["seconds"], strict=True)),
        )
        for row in rows.fetchall()
    ]


def runs_prune_batch(
    conn: Any,
    *,
    statuses: Sequence[str],
    older_than: float,
    limit: int,
    now: datetime | None = None,
) -> dict[str, int]:
    """Delete one batch of finished runs; returns how many of each status went."""
    params = {"statuses": list(statuses), "older_than": older_than, "limit": limit, "now": now}
    return dict(conn.execute(queries.RUNS_PRUNE_BATCH, params).fetchall())


# -- incidents: selections of runs, paused job types, the audit trail --

AUDIT_SAMPLE = 10  # ids kept in an audit row, and shown by a dry run


def _selection_params(
    selection: Selection, eligible: Sequence[str], now: datetime | None
) -> dict[str, Any]:
    def listed(values: tuple[Any, ...] | None) -> list[Any] | None:
        return None if values is None else list(values)

    return {
        "eligible": list(eligible),
        "ids": listed(selection.ids),
        "statuses": listed(selection.statuses),
        "job_types": listed(selection.job_types),
        "tenants": listed(selection.tenants),
        "error_types": listed(selection.error_types),
        "error_like": selection.error_like,
        "definition_id": selection.definition_id,
        "since": selection.since,
        "until": selection.until,
        "now": now,
    }


def runs_count_selected(
    conn: Any, selection: Selection, *, eligible: Sequence[str], now: datetime | None = None
) -> SelectionCount:
    """How many runs of `selection` the command may act on, by status, with a sample of ids."""
    params = {
        **_selection_params(selection, eligible, now),
        "limit": selection.limit,
        "sample": AUDIT_SAMPLE,
    }
    rows = conn.execute(queries.RUNS_COUNT_SELECTED, params).fetchall()
    sample = sorted(i for _, _, ids in rows for i in ids)[:AUDIT_SAMPLE]
    return SelectionCount({status: n for status, n, _ in rows}, tuple(sample))


def _selected_batch(
    conn: Any, sql: str, selection: Selection, *, eligible: Sequence[str], after: int,
    limit: int, now: datetime | None,
) -> BatchResult:  # fmt: skip
    params = {**_selection_params(selection, eligible, now), "after": after, "limit": limit}
    last_id, ids, statuses = conn.execute(sql, params).fetchone()
    return BatchResult(last_id, tuple(ids), tuple(statuses))


def runs_retry_selected(
    conn: Any, selection: Selection, *, eligible: Sequence[str], after: int, limit: int,
    now: datetime | None = None,
) -> BatchResult:  # fmt: skip
    """Retry the next `limit` runs of `selection` with an id above `after`."""
    return _selected_batch(conn, queries.RUNS_RETRY_SELECTED, selection, eligible=eligible,
                           after=after, limit=limit, now=now)  # fmt: skip


def runs_cancel_selected(
    conn: Any, selection: Selection, *, eligible: Sequence[str], after: int, limit: int,
    now: datetime | None = None,
) -> BatchResult:  # fmt: skip
    """Cancel the next `limit` runs of `selection` with an id above `after`."""
    return _selected_batch(conn, queries.RUNS_CANCEL_SELECTED, selection, eligible=eligible,
                           after=after, limit=limit, now=now)  # fmt: skip


def runs_prune_selected(
    conn: Any, selection: Selection, *, eligible: Sequence[str], after: int, limit: int,
    now: datetime | None = None,
) -> BatchResult:  # fmt: skip
    """Delete the next `limit` runs of `selection` with an id above `after`."""
    return _selected_batch(conn, queries.RUNS_PRUNE_SELECTED, selection, eligible=eligible,
                           after=after, limit=limit, now=now)  # fmt: skip


def job_type_pauses_list(conn: Any) -> list[TypePause]:
    cursor = conn.cursor(row_factory=class_row(TypePause))
    return cursor.execute(queries.JOB_TYPE_PAUSES_LIST).fetchall()


def job_types_pause(
    conn: Any, job_types: Sequence[str], *, reason: str | None, actor: str,
    now: datetime | None = None,
) -> list[str]:  # fmt: skip
    """Pause `job_types`; returns those that were not paused already."""
    params = {"job_types": list(job_types), "reason": reason, "actor": actor, "now": now}
    return [row[0] for row in conn.execute(queries.JOB_TYPES_PAUSE, params).fetchall()]


def job_types_resume(conn: Any, job_types: Sequence[str]) -> list[str]:
    """Resume `job_types`; returns those that were paused."""
    params = {"job_types": list(job_types)}
    return [row[0] for row in conn.execute(queries.JOB_TYPES_RESUME, params).fetchall()]


def audit_insert(
    conn: Any, *, actor: str, command: str, selection: dict[str, Any], changed: int,
    sample_ids: Sequence[int], reason: str | None, now: datetime | None = None,
) -> int:  # fmt: skip
    """Record a state-changing command in the caller's transaction; returns its id."""
    params = {
        "actor": actor, "command": command, "selection": json.dumps(selection),
        "changed": changed, "sample_ids": list(sample_ids)[:AUDIT_SAMPLE], "reason": reason,
        "now": now,
    }  # fmt: skip
    return int(conn.execute(queries.AUDIT_INSERT, params).fetchone()[0])


def audit_add_changed(conn: Any, audit_id: int, ids: Sequence[int]) -> None:
    """Count a later batch's runs in the command's audit row, in that batch's transaction."""
    params = {"id": audit_id, "changed": len(ids), "sample_ids": list(ids)[:AUDIT_SAMPLE],
              "sample": AUDIT_SAMPLE}  # fmt: skip
    conn.execute(queries.AUDIT_ADD_CHANGED, params)


def audit_list(
    conn: Any, *, since: float | None = None, now: datetime | None = None
) -> list[AuditEntry]:
    cursor = conn.cursor(row_factory=class_row(AuditEntry))
    return cursor.execute(queries.AUDIT_LIST, {"since": since, "now": now}).fetchall()


def audit_prune(conn: Any, *, older_than: float, now: datetime | None = None) -> int:
    """Delete audit rows older than `older_than` seconds; returns how many went."""
    return conn.execute(queries.AUDIT_PRUNE, {"older_than": older_than, "now": now}).rowcount


# -- schedules --


@dataclass(frozen=True)
class DefinitionRun:
    """A run of a definition, as `schedule show` lists it."""

    id: int
    tenant_id: str | None
    scheduled_for: datetime | None
    status: Status
    attempts: int


def clock_now(conn: Any, *, now: datetime | None = None) -> datetime:
    """The database clock (or the pinned `now`): the only clock anything stored comes from."""
    return conn.execute(queries.CLOCK_NOW, {"now": now}).fetchone()[0]


_DEFINITION = class_row(Definition)


def definition_insert(
    conn: Any, spec: DefinitionSpec, *, enabled: bool, now: datetime,
    next_fire_at: datetime | None,
) -> Definition | None:  # fmt: skip
    """Insert a definition starting at `now`; None when the name is taken."""
    params = {**_spec_params(spec), "enabled": enabled, "now": now, "next_fire_at": next_fire_at}
    return (
        conn.cursor(row_factory=_DEFINITION).execute(queries.DEFINITION_INSERT, params).fetchone()
    )


def definition_update(
    conn: Any, definition_id: int, spec: DefinitionSpec, *, enabled: bool, now: datetime,
    materialized_through: datetime, next_fire_at: datetime | None,
) -> Definition:  # fmt: skip
    return conn.cursor(row_factory=_DEFINITION).execute(
        queries.DEFINITION_UPDATE,
        {**_spec_params(spec), "id": definition_id, "enabled": enabled, "now": now,
         "materialized_through": materialized_through, "next_fire_at": next_fire_at},
    ).fetchone()  # fmt: skip


def definition_set_enabled(
    conn: Any, definition_id: int, enabled: bool, *, now: datetime,
    materialized_through: datetime, next_fire_at: datetime | None,
) -> Definition:  # fmt: skip
    return conn.cursor(row_factory=_DEFINITION).execute(
        queries.DEFINITION_SET_ENABLED,
        {"id": definition_id, "enabled": enabled, "now": now,
         "materialized_through": materialized_through, "next_fire_at": next_fire_at},
    ).fetchone()  # fmt: skip


def _spec_params(spec: DefinitionSpec) -> dict[str, Any]:
    import json

    return {
        "name": spec.name, "job_type": spec.job_type, "payload": json.dumps(spec.payload),
        "schedule": spec.schedule, "timezone": spec.timezone, "scope": spec.scope,
        "max_attempts": spec.max_attempts, "priority": spec.priority,
        "catch_up": spec.catch_up, "catch_up_limit": spec.catch_up_limit,
        "overlap": spec.overlap, "expect_within": spec.expect_within,
        "ping_url": spec.ping_url, "ping_failure_url": spec.ping_failure_url,
    }  # fmt: skip


def definition_get(conn: Any, name: str, *, lock: bool = False) -> Definition | None:
    sql = queries.DEFINITION_GET_FOR_UPDATE if lock else queries.DEFINITION_GET
    return conn.cursor(row_factory=_DEFINITION).execute(sql, {"name": name}).fetchone()


def definitions_list(conn: Any, *, lock: bool = False) -> list[Definition]:
    sql = queries.DEFINITIONS_LIST_FOR_UPDATE if lock else queries.DEFINITIONS_LIST
    return conn.cursor(row_factory=_DEFINITION).execute(sql).fetchall()


def definition_delete(conn: Any, definition_id: int) -> None:
    conn.execute(queries.DEFINITION_DELETE, {"id": definition_id})


def definition_runs_count_by_status(conn: Any, definition_id: int) -> dict[Status, int]:
    rows = conn.execute(queries.DEFINITION_RUNS_COUNT_BY_STATUS, {"id": definition_id}).fetchall()
    return {Status(status): number for status, number in rows}


def definition_runs_count_latest_occurrence(
    conn: Any, definition_id: int
) -> tuple[datetime | None, dict[Status, int]]:
    """The newest occurrence that has runs, and its runs counted by status."""
    rows = conn.execute(
        queries.DEFINITION_RUNS_COUNT_LATEST_OCCURRENCE, {"id": definition_id}
    ).fetchall()
    return (rows[0][0] if rows else None), {Status(status): n for _, status, n in rows}


def definition_runs_list_recent(
    conn: Any, definition_id: int, *, limit: int
) -> list[DefinitionRun]:
    cursor = conn.cursor(row_factory=_with_status(DefinitionRun))
    params = {"id": definition_id, "limit": limit}
    return cursor.execute(queries.DEFINITION_RUNS_LIST_RECENT, params).fetchall()


def definitions_due_exists(conn: Any, *, now: datetime | None = None) -> tuple[datetime, bool]:
    """The clock this tick materializes by, and whether any definition is due by it."""
    clock, due = conn.execute(queries.DEFINITIONS_DUE_EXISTS, {"now": now}).fetchone()
    return clock, due


def definitions_claim_due_many(
    conn: Any,
    *,
    now: datetime,
    limit: int,
    skip: Sequence[int] = (),
    only: Sequence[int] | None = None,
) -> list[DueDefinition]:
    """Lock up to `limit` due definitions no other tick holds, among `only` if given;
    call inside a transaction."""
    cursor = conn.cursor(row_factory=class_row(DueDefinition))
    params = {
        "now": now,
        "limit": limit,
        "skip": list(skip),
        "only": None if only is None else list(only),
    }
    return cursor.execute(queries.DEFINITIONS_CLAIM_DUE_MANY, params).fetchall()


def runs_materialize_many(
    conn: Any, advances: Sequence[Advance], *, global_runs: Sequence[Advance], now: datetime
) -> int:
    """Create the runs of `global_runs` and move every advance's high-water mark; one statement.

    Returns the number of runs created (occurrences that already had a run are skipped).
    """
    run_definition_ids: list[int] = []
    scheduled_fors: list[datetime] = []
    for advance in global_runs:
        run_definition_ids.extend([advance.definition.id] * len(advance.scheduled_fors))
        scheduled_fors.extend(advance.scheduled_fors)
    created, _ = conn.execute(
        queries.RUNS_MATERIALIZE_MANY,
        {
            "run_definition_ids": run_definition_ids,
            "scheduled_fors": scheduled_fors,
            "ids": [a.definition.id for a in advances],
            "throughs": [a.materialized_through for a in advances],
            "next_fire_ats": [a.next_fire_at for a in advances],
            "now": now,
        },
    ).fetchone()
    return int(created)


def runs_materialize_tenants(
    conn: Any, advance: Advance, *, tenants_sql: str, now: datetime
) -> int:
    """Create one run per tenant and occurrence of a tenant-scoped definition.

    Call while holding the definition's row lock (as materializing does).
    """
    params = {
        "id": advance.definition.id,
        "scheduled_fors": list(advance.scheduled_fors),
        "now": now,
    }
    first = not conn.execute(queries.RUNS_MATERIALIZE_TENANTS_OCCURRENCES_EXIST, params).fetchone()[
        0
    ]
    template = queries.RUNS_MATERIALIZE_TENANTS_FIRST if first else queries.RUNS_MATERIALIZE_TENANTS
    # The tenant query is the operator's own SQL: `%` in it must not read as a placeholder.
    sql = template.replace("{tenants_sql}", tenants_sql.replace("%", "%%"))
    return conn.execute(sql, params).rowcount


SKIPS_KEPT = 1000  # recorded skips kept per definition, the newest

# Room per schedule and tenant for unfinished runs under each overlap policy.
_OVERLAP_CAPACITY = {"skip": 1, "queue": 2}
_OVERLAP_REASON = {
    "skip": "overlap skip: the previous run had not finished",
    "queue": "overlap queue: a run was already waiting behind the unfinished one",
}


def runs_materialize_exclusive(
    conn: Any, advance: Advance, *, tenants_sql: str | None, now: datetime
) -> tuple[int, int]:
    """Create the runs of a definition under overlap policy skip or queue; record the rest.

    Global when `tenants_sql` is None, else one key per tenant. Returns (created, skipped).
    Call while holding the definition's row lock (as materializing does).
    """
    policy = advance.definition.overlap
    if tenants_sql is None:
        keys = queries.RUNS_MATERIALIZE_EXCLUSIVE_GLOBAL_KEYS
    else:
        # The tenant query is the operator's own SQL: `%` in it must not read as a placeholder.
        keys = queries.RUNS_MATERIALIZE_EXCLUSIVE_TENANT_KEYS.replace(
            "{tenants_sql}", tenants_sql.replace("%", "%%")
        )
    params = {
        "id": advance.definition.id,
        "scheduled_fors": list(advance.scheduled_fors),
        "capacity": _OVERLAP_CAPACITY[policy],
        "reason": _OVERLAP_REASON[policy],
        "keep": SKIPS_KEPT,
        "now": now,
    }
    sql = queries.RUNS_MATERIALIZE_EXCLUSIVE.replace("{keys_sql}", keys)
    created, skipped, _, _ = conn.execute(sql, params).fetchone()
    return int(created), int(skipped)


def definitions_list_ping_targets(conn: Any) -> dict[int, PingTarget]:
    cursor = conn.cursor(row_factory=class_row(PingTarget))
    return {t.definition_id: t for t in cursor.execute(queries.DEFINITIONS_LIST_PING_TARGETS)}


def definitions_list_health(conn: Any, *, now: datetime | None = None) -> list[ScheduleHealthRow]:
    cursor = conn.cursor(row_factory=class_row(ScheduleHealthRow))
    return cursor.execute(queries.DEFINITIONS_LIST_HEALTH, {"now": now}).fetchall()


def definition_get_health(
    conn: Any, definition_id: int, *, now: datetime | None = None
) -> ScheduleHealthRow | None:
    cursor = conn.cursor(row_factory=class_row(ScheduleHealthRow))
    params = {"id": definition_id, "now": now}
    return cursor.execute(queries.DEFINITION_GET_HEALTH, params).fetchone()


def definition_skips_list_recent(
    conn: Any, definition_id: int, *, limit: int
) -> list[ScheduleSkip]:
    cursor = conn.cursor(row_factory=class_row(ScheduleSkip))
    params = {"id": definition_id, "limit": limit}
    return cursor.execute(queries.DEFINITION_SKIPS_LIST_RECENT, params).fetchall()


def definitions_lock_for_sync(conn: Any, *, wait: bool = True) -> bool:
    """Take the sync lock, held until this transaction ends; with `wait`, queue for any other
    `schedule sync` to finish, else return False at once if one holds it."""
    return _advisory_lock(
        conn, queries.DEFINITIONS_LOCK_FOR_SYNC, queries.DEFINITIONS_LOCK_FOR_SYNC_TRY, wait=wait
    )


# -- the same statements on an AsyncConnection: async handlers, enqueue_async -----


async def runs_insert_many_async(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(*_inserting(runs, now))
    rows = await cursor.fetchall()
    missing = [row["idempotency_key"] for row in rows if row["id"] is None]
    found: dict[str, dict[str, Any]] = {}
    if missing:
        # As in runs_insert_many: keys another transaction inserted while ours waited.
        by_key = conn.cursor(row_factory=dict_row)
        await by_key.execute(queries.RUNS_INSERT_MANY_IDS_BY_KEY, {"keys": missing})
        found = {row["idempotency_key"]: row for row in await by_key.fetchall()}
    return _enqueued(rows, found)


async def runs_finalize_many_async(
    conn: Any, decisions: Sequence[Decision], *, worker: str, now: datetime | None = None
) -> set[int]:
    if not decisions:
        return set()
    params = _finalize_params(decisions, worker, now)
    rows = await (await conn.execute(queries.RUNS_FINALIZE_MANY, params)).fetchall()
    return {row[0] for row in rows}


async def handler_transaction_mark_async(conn: Any, lease_token: str) -> None:
    await conn.execute(queries.HANDLER_TRANSACTION_MARK, {"token": lease_token})


async def handler_transaction_get_mark_async(conn: Any) -> str | None:
    return (await (await conn.execute(queries.HANDLER_TRANSACTION_GET_MARK)).fetchone())[0]


async def handler_transaction_restore_limits_async(conn: Any) -> None:
    await conn.execute(queries.HANDLER_TRANSACTION_RESTORE_LIMITS)


async def effect_insert_once_async(conn: Any, key: str, run: ClaimedRun) -> bool:
    params = {"key": key, "run_id": run.id, "attempt": run.attempt}
    return (await (await conn.execute(queries.EFFECT_INSERT_ONCE, params)).fetchone()) is not None


async def effect_insert_at_most_once_async(
    conn: Any, key: str, run: ClaimedRun
) -> tuple[bool, bool]:
    params = {"key": key, "run_id": run.id, "token": run.lease_token}
    held, recorded = await (
        await conn.execute(queries.EFFECT_INSERT_AT_MOST_ONCE, params)
    ).fetchone()
    return bool(held), bool(recorded)


# -- Django Tasks (cronjob.django) ------------------------------------------------


def task_types_waiting(conn: Any, queues: Sequence[str] | None) -> list[str]:
    """The task types with runs waiting, in `queues` (any queue if None)."""
    rows = conn.execute(queries.TASK_TYPES_WAITING, {"queues": queues}).fetchall()
    return [row[0] for row in rows]


def task_return_value_set(conn: Any, run: ClaimedRun, value_json: str) -> bool:
    """Write what the task returned in the handler's transaction; False if the lease is gone."""
    params = {"value": value_json, "id": run.id, "token": run.lease_token}
    return conn.execute(queries.TASK_RETURN_VALUE_SET, params).rowcount == 1


async def task_return_value_set_async(conn: Any, run: ClaimedRun, value_json: str) -> bool:
    params = {"value": value_json, "id": run.id, "token": run.lease_token}
    cursor = await conn.execute(queries.TASK_RETURN_VALUE_SET, params)
    return cursor.rowcount == 1


def task_result_get(conn: Any, run_id: int) -> dict[str, Any] | None:
    """One task run with its failed attempts (a list of dicts), or None."""
    return (
        conn.cursor(row_factory=dict_row)
        .execute(queries.TASK_RESULT_GET, {"id": run_id})
        .fetchone()
    )


async def task_result_get_async(conn: Any, run_id: int) -> dict[str, Any] | None:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(queries.TASK_RESULT_GET, {"id": run_id})
    return await cursor.fetchone()
