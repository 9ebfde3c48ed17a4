"""The Python API for applications: enqueue work inside your own transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronjob.errors import BadInput, IdempotencyConflict
from cronjob.inputs import (
    MAX_ID,
    MAX_IDEMPOTENCY_KEY_BYTES,
    check_text,
    check_time_in_range,
    encode_payload,
    parse_duration,
    parse_int,
    parse_integer,
    parse_max_attempts,
)
from cronjob.store import NewRun, runs_insert_many


def new_run(
    job_type: str,
    payload: Any = None,
    *,
    run_at: datetime | None = None,
    delay: str | float | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    tenant_id: str | None = None,
) -> NewRun:
    """Validate one run's fields; raises BadInput naming the first problem."""
    check_text(job_type, what="job type", max_length=200)
    if run_at is not None and delay is not None:
        raise BadInput("give either run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.utcoffset() is None:
            raise BadInput("run_at must be a timezone-aware datetime")
        check_time_in_range(run_at, what="run_at")
    return NewRun(
        job_type=job_type,
        payload_json=encode_payload({} if payload is None else payload),
        run_at=run_at,
        delay=None if delay is None else parse_duration(delay, what="delay"),
        idempotency_key=None
        if idempotency_key is None
        else check_text(
            idempotency_key,
            what="idempotency key",
            max_length=MAX_IDEMPOTENCY_KEY_BYTES,
            max_bytes=MAX_IDEMPOTENCY_KEY_BYTES,
        ),
        max_attempts=None if max_attempts is None else parse_max_attempts(max_attempts),
        priority=None if priority is None else parse_int(priority, what="priority"),
        tenant_id=None
        if tenant_id is None
        else check_text(_tenant_text(tenant_id), what="tenant id"),
    )


def _tenant_text(tenant_id: Any) -> str:
    if isinstance(tenant_id, int) and not isinstance(tenant_id, bool):
        # str() refuses integers of thousands of digits.
        return str(parse_integer(tenant_id, what="tenant id", low=-MAX_ID - 1, high=MAX_ID))
    return tenant_id if isinstance(tenant_id, str) else str(tenant_id)


def enqueue(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    run_at: datetime | None = None,
    delay: str | float | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    tenant_id: str | None = None,
) -> int:
    """Enqueue a run on `conn` and return its id.

    Runs in the caller's transaction: the job exists only if that transaction
    commits. With an `idempotency_key` that already exists, nothing is inserted
    and the existing run's id is returned if it is of the same job type and tenant;
    if not, IdempotencyConflict (exit 1) names it.
    """
    run = new_run(
        job_type,
        payload,
        run_at=run_at,
        delay=delay,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        priority=priority,
        tenant_id=tenant_id,
    )
    return insert_runs(conn, [run])[0]


async def enqueue_async(
    conn: Any,
    job_type: str,
    payload: Any = None,
    *,
    run_at: datetime | None = None,
    delay: str | float | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
    tenant_id: str | None = None,
) -> int:
    """As `enqueue`, on a psycopg AsyncConnection, in the caller's transaction."""
    from cronjob.store import runs_insert_many_async

    run = new_run(
        job_type,
        payload,
        run_at=run_at,
        delay=delay,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        priority=priority,
        tenant_id=tenant_id,
    )
    return _same_work(  # as insert_runs
        [run], await runs_insert_many_async(conn, [run])
    )[0]


def insert_runs(conn: Any, runs: Sequence[NewRun]) -> list[int]:
    """Insert validated runs in the caller's transaction; returns their ids in order.

    A run whose idempotency key exists already is not inserted: the existing run's id
    is returned when it is the same piece of work (same job type, same tenant), and
    IdempotencyConflict is raised, naming it, when it is not.
    """
    return _same_work(runs, runs_insert_many(conn, runs))


def _same_work(runs: Sequence[NewRun], found: Sequence[Any]) -> list[int]:
    for run, enqueued in zip(runs, found, strict=True):
        if not enqueued.created and (enqueued.job_type, enqueued.tenant_id) != (
            run.job_type,
            run.tenant_id,
        ):
            key = (run.idempotency_key or "")[:80]
            raise IdempotencyConflict(
                f"idempotency key {key!r} belongs to run {enqueued.id} "
                f"({_work(enqueued.job_type, enqueued.tenant_id)}), not to "
                f"{_work(run.job_type, run.tenant_id)}: nothing enqueued"
            )
    return [enqueued.id for enqueued in found]


def _work(job_type: str, tenant_id: str | None) -> str:
    tenant = "no tenant" if tenant_id is None else f"tenant {tenant_id[:80]!r}"
    return f"type {job_type[:80]!r}, {tenant}"
