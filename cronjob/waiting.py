"""Waiting for runs to finish: `cronjob.wait`, `cronjob.wait_async` and `jobrunner wait`.

A waiter LISTENs and holds the advisory lock that asks every transaction that finishes runs
to notify (migration 0027), then reads the runs it waits for, and again each time it is
told that runs finished: it returns within milliseconds of the finalize's commit, not
within a poll interval. A transaction open when it took the lock may have finished runs
without seeing it and sent nothing: until each of those has ended it asks again after short
pauses, then reads once more; and it reads every `RECHECK` seconds whatever it hears.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from cronjob.errors import BadInput, RunNotFound, WaitTimedOut

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from cronjob.store.listen import RunOutcome

RECHECK = 5.0  # seconds: the longest a waiter goes without reading its runs
# While a transaction that finished runs without seeing the waiter may still commit.
QUIET_PAUSES = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def wait(conn: Any, ids: Iterable[int], *, timeout: float | None = None) -> list[RunOutcome]:
    """Return once every run of `ids` has finished (succeeded, dead or cancelled): their
    outcomes, by id.

    `conn` is a psycopg connection outside a transaction (autocommit, or idle: it is
    switched to autocommit while it waits, then back). Raises `RunNotFound` for an id no run
    has, and `WaitTimedOut`, with the outcomes so far, when `timeout` seconds pass first.
    """
    from cronjob import store

    wanted = _ids(ids)
    until = None if timeout is None else time.monotonic() + timeout
    with _listening(conn) as opened:
        pauses = iter(QUIET_PAUSES)
        while True:
            outcomes = _finished(store.runs_list_outcomes(conn, wanted), wanted, until)
            if outcomes is not None:
                return outcomes
            pause = None
            if opened:
                opened = store.transactions_open(conn, opened)
                if not opened:
                    continue  # read once more: what they committed is seen now
                pause = next(pauses, QUIET_PAUSES[-1])
            _heard(conn, _timeout(until, pause))


async def wait_async(
    conn: Any, ids: Iterable[int], *, timeout: float | None = None
) -> list[RunOutcome]:
    """As `wait`, on a psycopg AsyncConnection."""
    from cronjob import store

    wanted = _ids(ids)
    until = None if timeout is None else time.monotonic() + timeout
    async with _listening_async(conn) as opened:
        pauses = iter(QUIET_PAUSES)
        while True:
            found = await store.runs_list_outcomes_async(conn, wanted)
            outcomes = _finished(found, wanted, until)
            if outcomes is not None:
                return outcomes
            pause = None
            if opened:
                opened = await store.transactions_open_async(conn, opened)
                if not opened:
                    continue  # read once more: what they committed is seen now
                pause = next(pauses, QUIET_PAUSES[-1])
            async for _ in conn.notifies(timeout=_timeout(until, pause), stop_after=1):
                pass


def _ids(ids: Iterable[int]) -> list[int]:
    from cronjob.inputs import parse_run_ids

    wanted = sorted(parse_run_ids(ids))
    if not wanted:
        raise BadInput("wait: no run id given")
    return wanted


def _finished(
    outcomes: list[RunOutcome], wanted: list[int], until: float | None
) -> list[RunOutcome] | None:
    """The outcomes if every run has finished; None to wait on; raises as `wait` says."""
    if len(outcomes) < len(wanted):
        missing = sorted(set(wanted) - {o.id for o in outcomes})
        raise RunNotFound(f"run {', '.join(map(str, missing[:10]))} not found")
    if all(o.finished for o in outcomes):
        return outcomes
    if until is not None and time.monotonic() >= until:
        unfinished = [o for o in outcomes if not o.finished]
        raise WaitTimedOut(
            f"timed out: {len(unfinished)} of {len(outcomes)} run(s) not finished ("
            + ", ".join(f"{o.id} {o.status}" for o in unfinished[:10])
            + ")",
            outcomes=outcomes,
        )
    return None


def _timeout(until: float | None, pause: float | None) -> float:
    remaining = RECHECK if until is None else max(0.0, min(RECHECK, until - time.monotonic()))
    return remaining if pause is None else min(pause, remaining)


def _heard(conn: Any, timeout: float) -> None:
    """Wait up to `timeout` seconds for a notification (one is enough)."""
    for _ in conn.notifies(timeout=timeout, stop_after=1):
        pass


@contextmanager
def _listening(conn: Any) -> Iterator[list[int]]:
    """LISTEN and want to hear of finishes while the block runs; yields the transactions open
    once it does (one may finish runs, having seen nobody wait, and send nothing)."""
    from cronjob import store

    restore = _outside_a_transaction(conn)
    try:
        store.runs_wait_begin(conn)
        yield store.transactions_open(conn)
    finally:
        if not (conn.closed or conn.broken):
            store.runs_wait_end(conn)
        if restore:
            conn.autocommit = False


@asynccontextmanager
async def _listening_async(conn: Any) -> AsyncIterator[list[int]]:
    from cronjob import store

    restore = await _outside_a_transaction_async(conn)
    try:
        await store.runs_wait_begin_async(conn)
        yield await store.transactions_open_async(conn)
    finally:
        if not (conn.closed or conn.broken):
            await store.runs_wait_end_async(conn)
        if restore:
            await conn.set_autocommit(False)


def _outside_a_transaction(conn: Any) -> bool:
    """Switch an idle connection to autocommit; True if it has to be switched back."""
    if conn.autocommit:
        return False
    _require_idle(conn)
    conn.autocommit = True
    return True


async def _outside_a_transaction_async(conn: Any) -> bool:
    if conn.autocommit:
        return False
    _require_idle(conn)
    await conn.set_autocommit(True)
    return True


def _require_idle(conn: Any) -> None:
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        # Inside one, notifications wait for it to end, and a snapshot may never see the runs
        # finish at all.
        raise BadInput("wait: the connection is inside a transaction: commit or roll it back")
