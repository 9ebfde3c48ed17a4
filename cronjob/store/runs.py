"""A run's life after its enqueue (store.enqueue), as models: claimed, finalized, heartbeat,
handed back, rescued, read, retried or cancelled by id, pruned; the marks of the handler's
transaction. The statements are queries.runs.

Like every store function they never commit on their own, but for the claim
functions: on the autocommit connection they require, they group their statements
in one transaction of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg.rows import class_row, dict_row, kwargs_row

from cronjob.models import (
    Attempt,
    AttemptLog,
    ClaimedRun,
    Decision,
    Floors,
    Run,
    Status,
    UnreadablePayload,
)
from cronjob.queries import runs as queries

if TYPE_CHECKING:
    from uuid import UUID


@dataclass(frozen=True)
class Change:
    """The result of retry/cancel for one id: its status before, and whether it changed."""

    id: int
    previous: Status | None  # None: no such run
    changed: bool


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
    after: ClaimedRun | None = None,
    floors: Floors | None = None,
    in_transaction: bool = False,
    flushed: bool = True,
) -> list[ClaimedRun]:
    """Claim up to `limit` due runs in a transaction of their own (commits them).

    `token` is the claim's lease token (a new one unless given): a caller that knows
    it can find what the claim holds even if its answer is lost. `after` is the last run
    the previous claim handed over: the tenants take turns from the one after its own.
    `floors`, for a claim that resumes, are the last run taken of each (priority, tenant)
    since the last full claim (None: a full claim; cronjob/tick/resume.py). Without
    `flushed` the commit does not wait for the log to reach disk
    (RUNS_CLAIM_MANY_PLAN_UNFLUSHED). `in_transaction`: in the caller's open transaction
    instead (`_in_transaction`).
    """
    if in_transaction:
        return runs_finalize_and_claim_many(
            conn, [], job_types=job_types, leases=leases, max_attempts=max_attempts,
            limit=limit, worker=worker, now=now, token=token, after=after, floors=floors,
            in_transaction=True,
        )[1]  # fmt: skip
    _require_autocommit(conn)
    params = _claim_params(
        job_types, leases, max_attempts, limit, worker, now, token, after, floors
    )
    with conn.pipeline(), conn.transaction():
        if flushed:
            conn.execute(queries.RUNS_CLAIM_MANY_PLAN)
        else:
            conn.execute(queries.RUNS_CLAIM_MANY_PLAN_UNFLUSHED)
        claiming = conn.execute(queries.RUNS_CLAIM_MANY, params)
    return _claimed_runs(claiming.fetchall(), params["token"])


def _require_autocommit(conn: Any) -> None:
    # Inside a caller's transaction the claim would commit only with it, and the
    # planner settings of queries.RUNS_CLAIM_MANY_PLAN would stay on for the rest of it.
    if not conn.autocommit:
        raise ValueError("claiming needs an autocommit connection: a claim commits on its own")


def _in_transaction(
    conn: Any, decisions: Sequence[Decision], worker: str, now: datetime | None, params: Any
) -> tuple[set[int], list[ClaimedRun]]:
    """The finalize of `decisions` and a claim, in the caller's open transaction: for the
    pytest plugin's drain (cronjob.testing), whose runs and claims are a test's, rolled back
    with it. Without the claim's planner settings, which would stay on for the rest of that
    transaction: a test's tables hold a handful of rows. Nor in a pipeline: the test's code
    may have left the connection just after a `stream()`, which psycopg's next pipeline
    then fails on."""
    kept = runs_finalize_many(conn, decisions, worker=worker, now=now)
    claiming = conn.execute(queries.RUNS_CLAIM_MANY, params)
    return kept, _claimed_runs(claiming.fetchall(), params["token"])


def _claim_params(
    job_types: Sequence[str],
    leases: Sequence[float],
    max_attempts: Sequence[int],
    limit: int,
    worker: str,
    now: datetime | None,
    token: UUID | None,
    after: ClaimedRun | None,
    floors: Floors | None = None,
) -> dict[str, Any]:
    import uuid  # the busy path only: an idle tick claims nothing

    pairs = list(floors.items()) if floors else None
    return {
        "token": token or uuid.uuid4(),
        "job_types": list(job_types),
        "leases": list(leases),
        "max_attempts": list(max_attempts),
        "limit": limit,
        "worker": worker,
        "now": now,
        # No run yet: the lowest (priority, tenant) there can be, so the walk takes every
        # tenant in order (jobrunner_tenant_walk, migration 0021).
        "cursor_priority": -(2**31) if after is None else after.priority,
        "cursor_tenant": "" if after is None else after.tenant_id or "",
        "floor_priorities": pairs and [pair[0] for pair, _ in pairs],
        "floor_tenants": pairs and [pair[1] for pair, _ in pairs],
        "floor_run_ats": pairs and [last[0] for _, last in pairs],
        "floor_ids": pairs and [last[1] for _, last in pairs],
    }


def runs_finalize_many(
    conn: Any, decisions: Sequence[Decision], *, worker: str, now: datetime | None = None
) -> set[int]:
    """Apply decisions; returns the ids whose lease was still held (the others are lost)."""
    if not decisions:
        return set()
    rows = conn.execute(*_finalizing(decisions, worker, now))
    return {row[0] for row in rows.fetchall()}


async def runs_finalize_many_async(
    conn: Any, decisions: Sequence[Decision], *, worker: str, now: datetime | None = None
) -> set[int]:
    if not decisions:
        return set()
    rows = await (await conn.execute(*_finalizing(decisions, worker, now))).fetchall()
    return {row[0] for row in rows}


# psycopg's jsonb loader costs several times the decoding itself; the claim asks
# for payload::text (PostgreSQL's canonical JSON) and one shared decoder reads it,
# to the same Python values json.loads gives.
_decode_payload = json.JSONDecoder().decode


def _claimed_runs(rows: list[Sequence[Any]], token: UUID) -> list[ClaimedRun]:
    # By position, on the tick's hot path (by name costs a run about a microsecond more):
    # the columns are ClaimedRun's fields in order, bar the lease token, the claim's own.
    decode = _decode_payload
    try:
        # id, job type, payload, tenant, due, attempt, final, schedule, traceparent,
        # tracestate, result id, priority, run_at: unpacked by name, as a starred tail costs a
        # list a run
        return [
            ClaimedRun(id_, jt, decode(pl), te, due, n, fin, token, sch, tp, ts, res, pr, ra)
            for id_, jt, pl, te, due, n, fin, sch, tp, ts, res, pr, ra in rows
        ]
    except (RecursionError, ValueError):
        # A payload written by someone else's SQL may be valid JSON that Python cannot
        # read (nested thousands deep, an integer of thousands of digits): it fails its
        # own run only, never the runs claimed beside it.
        readable = _payload_or_unreadable
        return [
            ClaimedRun(run[0], run[1], readable(run[2]), *run[3:7], token, *run[7:]) for run in rows
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
    after: ClaimedRun | None = None,
    floors: Floors | None = None,
    in_transaction: bool = False,
    flushed: bool = True,
) -> tuple[set[int], list[ClaimedRun]]:
    """Finalize one batch and claim the next in one transaction and one round trip.

    On an autocommit connection (required) each statement would commit, and wait
    for the log flush, on its own; together they pay for one commit. `flushed` is
    runs_claim_many's, for a claim that carries no decision: outcomes always wait.
    `in_transaction`: in the caller's open transaction instead (`_in_transaction`).
    """
    if in_transaction:
        params = _claim_params(
            job_types, leases, max_attempts, limit, worker, now, token, after, floors
        )
        return _in_transaction(conn, decisions, worker, now, params)
    if not decisions:
        return set(), runs_claim_many(
            conn, job_types=job_types, leases=leases, max_attempts=max_attempts,
            limit=limit, worker=worker, now=now, token=token, after=after, floors=floors,
            flushed=flushed,
        )  # fmt: skip
    _require_autocommit(conn)
    claim_params = _claim_params(
        job_types, leases, max_attempts, limit, worker, now, token, after, floors
    )
    with conn.pipeline(), conn.transaction():
        finalized = conn.execute(*_finalizing(decisions, worker, now))
        conn.execute(queries.RUNS_CLAIM_MANY_PLAN)
        claiming = conn.execute(queries.RUNS_CLAIM_MANY, claim_params)
    return {row[0] for row in finalized.fetchall()}, _claimed_runs(
        claiming.fetchall(), claim_params["token"]
    )


def _finalizing(
    decisions: Sequence[Decision], worker: str, now: datetime | None
) -> tuple[str, dict[str, Any]]:
    """The finalize of `decisions`, and its parameters; with what their handlers logged."""
    params = _finalize_params(decisions, worker, now)
    logged = [d for d in decisions if d.logs]  # a handler given up at its timeout may have none
    if not logged:
        return queries.RUNS_FINALIZE_MANY, params
    params["log_ids"] = [d.run.id for d in logged]
    params["log_events"] = [d.logs.json() for d in logged]  # type: ignore[union-attr]
    params["log_trimmed"] = [d.logs.trimmed for d in logged]  # type: ignore[union-attr]
    return queries.RUNS_FINALIZE_MANY_LOGGED, params


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


def run_logs_get(conn: Any, run_id: int) -> list[AttemptLog]:
    """What the run's handlers logged, an attempt a row, oldest first."""
    rows = conn.cursor(row_factory=dict_row).execute(queries.RUN_LOGS_GET, {"id": run_id})
    return [
        AttemptLog(**{**row, "events": _decode_payload(row["events"])}) for row in rows.fetchall()
    ]


def runs_list(
    conn: Any,
    *,
    statuses: Sequence[str] | None = None,
    job_types: Sequence[str] | None = None,
    limit: int = 50,
    payloads: bool = True,
    streamed: bool = True,
) -> Iterator[Run]:
    """Runs, newest first, streamed a row at a time (payloads None unless `payloads`);
    without `streamed`, fetched at once (a test's few: cronjob.testing, where the code under
    test may start a psycopg pipeline next, which fails just after a stream)."""
    params = {
        "statuses": list(statuses) if statuses else None,
        "job_types": list(job_types) if job_types else None,
        "limit": limit,
    }
    sql = queries.RUNS_LIST if payloads else queries.RUNS_LIST_WITHOUT_PAYLOAD
    if not streamed:
        return iter(conn.cursor(row_factory=_RUN).execute(sql, params).fetchall())
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


# -- the handler's transaction --


def handler_transaction_mark(conn: Any, lease_token: str) -> None:
    """Mark `conn`'s open transaction as the one opened for the run holding `lease_token`."""
    conn.execute(queries.HANDLER_TRANSACTION_MARK, {"token": lease_token})


async def handler_transaction_mark_async(conn: Any, lease_token: str) -> None:
    await conn.execute(queries.HANDLER_TRANSACTION_MARK, {"token": lease_token})


def handler_transaction_get_mark(conn: Any) -> str | None:
    """The lease token the transaction was marked with; None or '' once it ended."""
    return conn.execute(queries.HANDLER_TRANSACTION_GET_MARK).fetchone()[0]


async def handler_transaction_get_mark_async(conn: Any) -> str | None:
    return (await (await conn.execute(queries.HANDLER_TRANSACTION_GET_MARK)).fetchone())[0]


def handler_transaction_restore_limits(conn: Any) -> None:
    conn.execute(queries.HANDLER_TRANSACTION_RESTORE_LIMITS)


async def handler_transaction_restore_limits_async(conn: Any) -> None:
    await conn.execute(queries.HANDLER_TRANSACTION_RESTORE_LIMITS)


# -- retention --


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
