"""The Python API for applications: enqueue work inside your own transaction.

What a run can be enqueued with is `cronjob.run_options.RunOptions`: `enqueue`,
`enqueue_async` and `new_run` take its keys as keywords; `enqueue_many` takes the runs
`new_run` checks, any number of them; `enqueue_batch` takes them with the run to enqueue
once they have all ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from cronjob import tracecontext
from cronjob.run_options import WAITING, NewRun, checked_run, unknown

if TYPE_CHECKING:
    from typing import Unpack

    from cronjob.models import Batch
    from cronjob.run_options import RunOptions

# Runs per statement of enqueue_many, and the most JSON one statement carries: what keeps
# memory flat however many runs come.
ENQUEUE_CHUNK = 5000
ENQUEUE_CHUNK_BYTES = 4_000_000
# Fewer runs than this go in by the insert even when they hold no key: a COPY takes a
# round trip more (the ids first), which a handful of rows does not pay back.
COPY_AT_LEAST = 16


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
    `tenant_id`, `after` (the ids of runs that must succeed first; `after_policy="finished"`:
    end first, however). Runs in the caller's transaction: the job exists only if that
    transaction commits. An `idempotency_key` is unique per (job type, tenant): when a run
    of this type for this tenant (or for no tenant) has it already, nothing is inserted
    and that run's id is returned.
    """
    return insert_runs(conn, [new_run(job_type, payload, **options)])[0]


async def enqueue_async(
    conn: Any, job_type: str, payload: Any = None, **options: Unpack[RunOptions]
) -> int:
    """As `enqueue`, on a psycopg AsyncConnection, in the caller's transaction."""
    from cronjob.store import (
        dependencies_insert_many_async,
        dependencies_list_unknown_async,
        runs_insert_many_async,
    )

    run = new_run(job_type, payload, **options)
    plain, parents = _apart([run])
    if parents:
        await dependencies_list_unknown_async(conn, parents)
    enqueued = await runs_insert_many_async(conn, plain)
    if parents:
        await dependencies_insert_many_async(conn, _edges([run], enqueued))
    return enqueued[0].id


def enqueue_many(conn: Any, runs: Iterable[NewRun]) -> list[int]:
    """Enqueue many runs (each from `new_run`) on `conn` and return their ids, in order.

    Runs in the caller's transaction, as `enqueue` does, and means the same for each run:
    a run whose idempotency key (or unique key) another run holds is not inserted, that
    run's id is returned. Runs without either key go in by COPY, many times faster than
    inserting them. `runs` may be any iterable, a generator too: it is read and sent
    ENQUEUE_CHUNK runs at a time, so memory stays flat whatever the count. A batch that
    holds keys takes turns with the others that do (`jobrunner enqueue --jsonl` too), until
    the transaction ends: two batches holding each other's keys in different orders would
    otherwise deadlock.
    """
    from cronjob.store import runs_lock_for_keyed_batch

    if isinstance(runs, Sequence):
        # A list is checked whole first, so that a mistake in it sends nothing at all.
        for position, run in enumerate(runs):
            _check_new_run(run, position)
    ids: list[int] = []
    keyed = False
    for chunk in _chunks(runs):
        if not keyed and any(run.keyed for run in chunk):
            runs_lock_for_keyed_batch(conn)
            keyed = True
        ids.extend(insert_runs(conn, chunk))
    return ids


def _chunks(runs: Iterable[NewRun]) -> Iterator[list[NewRun]]:
    chunk: list[NewRun] = []
    size = 0
    for position, run in enumerate(runs):
        _check_new_run(run, position)
        chunk.append(run)
        size += len(run.payload_json)
        if len(chunk) >= ENQUEUE_CHUNK or size >= ENQUEUE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _check_new_run(run: Any, position: int) -> None:
    if not isinstance(run, NewRun):
        raise TypeError(
            f"enqueue_many() takes runs made by new_run(job_type, payload, ...), not "
            f"{type(run).__name__} (run {position}): enqueue_many(conn, [new_run(...), ...])"
        )


def insert_runs(conn: Any, runs: Sequence[NewRun]) -> list[int]:
    """Insert checked runs in the caller's transaction, all at once: by COPY when none holds
    a key and there are enough of them, else by one insert; returns their ids in order.

    A run whose idempotency key a run of the same job type and tenant holds already is not
    inserted: that run's id is returned. `enqueue_many` takes any number of runs.
    """
    from cronjob.store import (
        dependencies_insert_many,
        dependencies_list_unknown,
        runs_copy_many,
        runs_insert_many,
    )

    plain, parents = _apart(runs)
    if parents:
        # Refused before anything is written; the runs go in by the insert, which tells
        # which of them it created (a run whose key another holds waits for nothing new).
        dependencies_list_unknown(conn, parents)
        enqueued = runs_insert_many(conn, plain)
        dependencies_insert_many(conn, _edges(runs, enqueued))
        return [run.id for run in enqueued]
    if len(runs) >= COPY_AT_LEAST and not any(run.keyed for run in runs):
        return runs_copy_many(conn, runs)
    return [enqueued.id for enqueued in runs_insert_many(conn, runs)]


def _apart(runs: Sequence[NewRun]) -> tuple[Sequence[NewRun], list[int]]:
    """`runs` without the options that make a run wait (recorded after the insert), and every
    run id they wait for; `runs` itself when none waits."""
    if not any("after" in run.options for run in runs):
        return runs, []
    plain = [
        NewRun(run.job_type, run.payload_json,
               {k: v for k, v in run.options.items() if k not in WAITING})
        for run in runs
    ]  # fmt: skip
    return plain, sorted({parent for run in runs for parent in run.options.get("after", ())})


def _edges(runs: Sequence[NewRun], enqueued: Sequence[Any]) -> list[tuple[int, int, str]]:
    """(run id, parent id, policy) for each run created that waits for others."""
    return [
        (done.id, parent, run.options.get("after_policy", "succeeded"))
        for run, done in zip(runs, enqueued, strict=True)
        if done.created
        for parent in run.options.get("after", ())
    ]


# What a batch's callback may be enqueued with besides its type and payload: it is enqueued
# by the database, when the last member ends, due at once.
_THEN_OPTIONS = frozenset({"tenant_id", "priority", "max_attempts", "traceparent", "tracestate"})
_ON = ("finished", "succeeded")


def enqueue_batch(
    conn: Any, runs: Iterable[NewRun], *, then: NewRun, on: str = "finished"
) -> Batch:
    """Enqueue `runs` (each from `new_run`) as a batch, and `then` (from `new_run`) to run once
    every one of them has ended; returns the batch: its id and the runs' ids, in order.

    `then` is enqueued exactly once, in the transaction that finishes the last member
    (succeeded, dead or cancelled): with `on="succeeded"`, only if every member succeeded
    (else the batch records why). Its handler sees `ctx.batch`. A batch of no runs ends at
    once. Runs in the caller's transaction, as `enqueue_many` does; a run whose key another
    run holds is that run, which is no member of the batch.
    """
    from cronjob.models import Batch
    from cronjob.store import batch_end, batch_insert, runs_copy_many, runs_lock_for_keyed_batch

    _check_then(then, on)
    if isinstance(runs, Sequence):
        # A list is checked whole first, so that a mistake in it makes no batch at all.
        for position, run in enumerate(runs):
            _check_new_run(run, position)
    batch_id = batch_insert(conn, then, on)
    ids: list[int] = []
    keyed = False
    for chunk in _chunks(runs):
        if len(chunk) >= COPY_AT_LEAST and not any(run.options for run in chunk):
            # The common batch: runs that set no option, copied with their batch's id.
            ids.extend(runs_copy_many(conn, chunk, batch_id=batch_id))
            continue
        if not keyed and any(run.keyed for run in chunk):
            runs_lock_for_keyed_batch(conn)  # as enqueue_many: keyed batches take turns
            keyed = True
        ids.extend(insert_runs(conn, [_member(run, batch_id) for run in chunk]))
    batch_end(conn, batch_id)
    return Batch(batch_id, ids)


async def enqueue_batch_async(
    conn: Any, runs: Iterable[NewRun], *, then: NewRun, on: str = "finished"
) -> Batch:
    """As `enqueue_batch`, on a psycopg AsyncConnection, in the caller's transaction."""
    from cronjob.models import Batch
    from cronjob.store import batch_end_async, batch_insert_async, runs_insert_many_async

    _check_then(then, on)
    if isinstance(runs, Sequence):
        for position, run in enumerate(runs):
            _check_new_run(run, position)
    batch_id = await batch_insert_async(conn, then, on)
    ids: list[int] = []
    for chunk in _chunks(runs):
        members = [_member(run, batch_id) for run in chunk]
        ids.extend(enqueued.id for enqueued in await runs_insert_many_async(conn, members))
    await batch_end_async(conn, batch_id)
    return Batch(batch_id, ids)


def _check_then(then: Any, on: Any) -> None:
    from cronjob.errors import BadInput
    from cronjob.run_options import RUN_OPTIONS

    if not isinstance(then, NewRun):
        raise TypeError("then= takes a run made by new_run(job_type, payload, ...)")
    if on not in _ON:
        raise BadInput(f"on= takes 'finished' or 'succeeded', not {on!r:.40}")
    if extra := sorted(set(then.options) - _THEN_OPTIONS):
        raise BadInput(
            "a batch's callback is enqueued when its last member ends: it takes no"
            f" {RUN_OPTIONS[extra[0]].what}"
        )


def _member(run: NewRun, batch_id: int) -> NewRun:
    """`run` as a member of batch `batch_id`."""
    return NewRun(run.job_type, run.payload_json, {**run.options, "batch_id": batch_id})
