"""The Python API for applications: enqueue work inside your own transaction.

What a run can be enqueued with is `cronjob.run_options.RunOptions`: `enqueue`,
`enqueue_async` and `new_run` take its keys as keywords.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cronjob import tracecontext
from cronjob.run_options import NewRun, checked_run, unknown

if TYPE_CHECKING:
    from typing import Unpack

    from cronjob.run_options import RunOptions


def new_run(job_type: str, payload: Any = None, **options: Unpack[RunOptions]) -> NewRun:
    """Check one run's type, payload and options; raises BadInput naming the first problem.

    Options given as None are left unset. The run carries the active OpenTelemetry trace
    context, if any (unless `traceparent` is given).
    """
    if bad := unknown(options):
        raise TypeError(f"new_run() got an unexpected keyword argument {bad[0]!r}")
    # The active trace, if the application traces: the run's spans continue it.
    return checked_run(job_type, payload, {**tracecontext.current(), **options})


def enqueue(conn: Any, job_type: str, payload: Any = None, **options: Unpack[RunOptions]) -> int:
    """Enqueue a run on `conn` and return its id.

    `options` are those of `cronjob.run_options.RunOptions`: `run_at` (a timezone-aware
    datetime) or `delay` (a duration), `idempotency_key`, `max_attempts`, `priority`,
    `tenant_id`. Runs in the caller's transaction: the job exists only if that
    transaction commits. An `idempotency_key` is unique per (job type, tenant): when a run
    of this type for this tenant (or for no tenant) has it already, nothing is inserted
    and that run's id is returned.
    """
    return insert_runs(conn, [new_run(job_type, payload, **options)])[0]


async def enqueue_async(
    conn: Any, job_type: str, payload: Any = None, **options: Unpack[RunOptions]
) -> int:
    """As `enqueue`, on a psycopg AsyncConnection, in the caller's transaction."""
    from cronjob.store import runs_insert_many_async

    enqueued = await runs_insert_many_async(conn, [new_run(job_type, payload, **options)])
    return enqueued[0].id


def insert_runs(conn: Any, runs: Sequence[NewRun]) -> list[int]:
    """Insert checked runs in the caller's transaction; returns their ids in order.

    A run whose idempotency key a run of the same job type and tenant holds already is not
    inserted: that run's id is returned.
    """
    from cronjob.store import runs_insert_many

    return [enqueued.id for enqueued in runs_insert_many(conn, runs)]
