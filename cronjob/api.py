"""The Python API for applications: enqueue work inside your own transaction.

What a run can be enqueued with is `cronjob.run_options.RunOptions`: `enqueue`,
`enqueue_async` and `new_run` take its keys as keywords.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cronjob.errors import IdempotencyConflict
from cronjob.run_options import NewRun, checked_run, unknown

if TYPE_CHECKING:
    from typing import Unpack

    from cronjob.run_options import RunOptions


def new_run(job_type: str, payload: Any = None, **options: Unpack[RunOptions]) -> NewRun:
    """Check one run's type, payload and options; raises BadInput naming the first problem.

    Options given as None are left unset.
    """
    if bad := unknown(options):
        raise TypeError(f"new_run() got an unexpected keyword argument {bad[0]!r}")
    return checked_run(job_type, payload, options)


def enqueue(conn: Any, job_type: str, payload: Any = None, **options: Unpack[RunOptions]) -> int:
    """Enqueue a run on `conn` and return its id.

    `options` are those of `cronjob.run_options.RunOptions`: `run_at` (a timezone-aware
    datetime) or `delay` (a duration), `idempotency_key`, `max_attempts`, `priority`,
    `tenant_id`. Runs in the caller's transaction: the job exists only if that
    transaction commits. With an `idempotency_key` that already exists, nothing is
    inserted and the existing run's id is returned if it is of the same job type and
    tenant; if not, IdempotencyConflict (exit 1) names it.
    """
    return insert_runs(conn, [new_run(job_type, payload, **options)])[0]


async def enqueue_async(
    conn: Any, job_type: str, payload: Any = None, **options: Unpack[RunOptions]
) -> int:
    """As `enqueue`, on a psycopg AsyncConnection, in the caller's transaction."""
    from cronjob.store import runs_insert_many_async

    runs = [new_run(job_type, payload, **options)]
    return _same_work(runs, await runs_insert_many_async(conn, runs))[0]


def insert_runs(conn: Any, runs: Sequence[NewRun]) -> list[int]:
    """Insert checked runs in the caller's transaction; returns their ids in order.

    A run whose idempotency key exists already is not inserted: the existing run's id
    is returned when it is the same piece of work (same job type, same tenant), and
    IdempotencyConflict is raised, naming it, when it is not.
    """
    from cronjob.store import runs_insert_many

    return _same_work(runs, runs_insert_many(conn, runs))


def _same_work(runs: Sequence[NewRun], found: Sequence[Any]) -> list[int]:
    for run, enqueued in zip(runs, found, strict=True):
        tenant = run.options.get("tenant_id")
        if not enqueued.created and (enqueued.job_type, enqueued.tenant_id) != (
            run.job_type,
            tenant,
        ):
            key = run.options.get("idempotency_key", "")[:80]
            raise IdempotencyConflict(
                f"idempotency key {key!r} belongs to run {enqueued.id} "
                f"({_work(enqueued.job_type, enqueued.tenant_id)}), not to "
                f"{_work(run.job_type, tenant)}: nothing enqueued"
            )
    return [enqueued.id for enqueued in found]


def _work(job_type: str, tenant_id: str | None) -> str:
    tenant = "no tenant" if tenant_id is None else f"tenant {tenant_id[:80]!r}"
    return f"type {job_type[:80]!r}, {tenant}"
