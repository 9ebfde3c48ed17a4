"""The test's drain: the tick's claim, handler call, decision and finalize, in-process, on the
test's connection and in its transaction.

A tick claims on one connection, writes outcomes on a second and gives each handler a
third; none of them would see a test's runs, which exist only in the test's transaction.
This drain runs the same steps one run at a time on the test's connection: the claim and
the finalize are the tick's statements (`store.runs_finalize_and_claim_many`, in the
caller's transaction), the handler is called by the tick's `execute` (and `execute_async`)
with a real `JobContext`, whose `ctx.db` is a savepoint (cronjob.testing.transaction), a
success in it recorded by the tick's `commit_success`, and every other outcome decided by
`transitions.decide` (backoff, dead on the final attempt) and written by the next claim's
finalize. What the handler logged goes with its outcome, as the tick writes it; Django's
task signals are sent as the tick sends them, on this thread.

What a tick does and this drain does not: timeouts (a handler runs to its end), heartbeats
and leases running out (the test's clock moves only when told), rescue, hand-back at a
signal. Schedules are materialized by `Jobrunner.materialize`, not by the drain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from cronjob import store, transitions
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun, Decision, Errored, Succeeded
from cronjob.testing.transaction import InTransaction
from cronjob.tick import observers as tick_observers
from cronjob.tick.execute import (
    commit_success,
    commit_success_async,
    errored,
    execute,
    execute_async,
)
from cronjob.tick.flight import Flight, Result
from cronjob.tick.steps import worker_name

BATCH_SIZE = 100  # runs per claim: they run one at a time whatever it is
T = TypeVar("T")


@dataclass(frozen=True)
class Attempted:
    """One attempt the drain made: its run, and what became of it."""

    run_id: int
    job_type: str
    attempt: int
    status: str  # succeeded, failed (a retry is due later), dead, or lost
    error: Errored | None = None


@dataclass(frozen=True)
class Drained:
    """What a drain did: how many attempts ended each way, and each of them (`attempts`,
    left out of comparisons: `drain() == Drained(succeeded=2)` reads as it says)."""

    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    lost: int = 0  # its outcome was not written: the run was cancelled, or taken from it
    attempts: tuple[Attempted, ...] = field(default=(), compare=False, repr=False)

    @property
    def claimed(self) -> int:
        return len(self.attempts)


class TestDrain:
    """Claims, runs and records the due runs of `handlers`' job types until none is left."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(
        self,
        conn: Any,
        handlers: dict[str, HandlerSpec],
        *,
        now: datetime,
        observers: tick_observers.Observers | None,
    ) -> None:
        self.conn = conn
        self.handlers = handlers
        self.now = now
        self.database = InTransaction(conn)
        self.observers = observers
        self.worker = worker_name()
        self._decisions: list[Decision] = []
        self._claimed: list[ClaimedRun] = []  # the last claim's runs not run yet
        self._attempts: list[Attempted] = []
        types = sorted(handlers)
        self._claim_args = {
            "job_types": types,
            "leases": [handlers[t].lease for t in types],
            "max_attempts": [handlers[t].max_attempts for t in types],
        }

    def run(self) -> Drained:
        for flight in self._flights():
            if flight.spec.is_async:
                if _loop_running():
                    self._give_back(flight)
                    raise RuntimeError(
                        "an async def handler's run cannot be drained by drain() inside a"
                        " running event loop: use `await jobrunner.adrain()` in an async test"
                    )
                self._record(run_coroutine(self.attempt_async(flight)))
            else:
                self._record(self.attempt(flight))
        return self.done()

    async def run_async(self) -> Drained:
        for flight in self._flights():
            if flight.spec.is_async:
                self._record(await self.attempt_async(flight))
            else:
                self._record(self.attempt(flight))
        return self.done()

    def _flights(self) -> Iterator[Flight]:
        """Each claimed run in turn; each claim writes the decisions made since the last."""
        if not self.handlers:
            return
        after: ClaimedRun | None = None
        while True:
            decisions, self._decisions = self._decisions, []
            kept = store.runs_finalize_many(self.conn, decisions, worker=self.worker, now=self.now)
            self._finalized(decisions, kept)
            # Once runs were claimed, the idle tick's question before the next claim: after
            # the run or two of most tests' drains nothing is due, and the claim costs
            # several times more than asking whether anything is.
            if after is not None and not store.tick_work_exists(
                self.conn, self.handlers, now=self.now
            ):
                return
            kept, runs = store.runs_finalize_and_claim_many(
                self.conn, [], limit=BATCH_SIZE, worker=self.worker, now=self.now,
                after=after, in_transaction=True, **self._claim_args,
            )  # fmt: skip
            if not runs:
                return
            after = runs[-1]
            self._claimed = list(runs)
            while self._claimed:
                run = self._claimed.pop(0)
                yield self.flight(run, self.handlers[run.job_type])

    def _give_back(self, flight: Flight) -> None:
        """Stopping before `flight`: what is decided is written, and the runs of the claim
        not run yet, `flight`'s first, are handed back as a stopping tick hands them back."""
        runs, self._claimed = [flight.run, *self._claimed], []
        decisions, self._decisions = self._decisions, []
        self._finalized(decisions, store.runs_finalize_many(
            self.conn, decisions, worker=self.worker, now=self.now
        ))  # fmt: skip
        store.runs_hand_back_many(self.conn, runs, now=self.now)
        flight.ctx.close()

    def flight(self, run: ClaimedRun, spec: HandlerSpec) -> Flight:
        """A claimed run, ready for its attempt: its `ctx` on the test's transaction."""
        from cronjob.context import AsyncJobContext, JobContext

        self.database.attempt()
        context = AsyncJobContext if spec.is_async else JobContext
        return Flight(run, spec, context(run, self.database))

    def attempt(self, flight: Flight) -> Result:
        """As a worker thread runs a flight (cronjob.tick.workers)."""
        started = time.monotonic()
        outcome = execute(flight, self.observers)
        result = Result(flight, outcome, time.monotonic() - started)
        try:
            if flight.ctx.used_db and isinstance(outcome, Succeeded):
                try:
                    result.kept = commit_success(
                        flight.run, flight.ctx, result.duration, worker=self.worker,
                        now=self.now, logs=flight.logs,
                    )  # fmt: skip
                    result.finalized = True
                except Exception as exc:
                    result.outcome = errored(exc)
        finally:
            flight.ctx.close()
        return result

    async def attempt_async(self, flight: Flight) -> Result:
        """As the tick's event loop runs an `async def` handler's flight (cronjob.tick.aio)."""
        ctx: Any = flight.ctx
        started = time.monotonic()
        outcome = await execute_async(flight, self.observers)
        result = Result(flight, outcome, time.monotonic() - started)
        try:
            if ctx.used_db and isinstance(outcome, Succeeded):
                try:
                    result.kept = await commit_success_async(
                        flight.run, ctx, result.duration, worker=self.worker,
                        now=self.now, logs=flight.logs,
                    )  # fmt: skip
                    result.finalized = True
                except Exception as exc:
                    result.outcome = errored(exc)
        finally:
            await ctx.aclose()
        return result

    def _record(self, result: Result) -> None:
        flight = result.flight
        if result.finalized:
            self.tell(flight.run, "succeeded" if result.kept else "lost", None)
            return
        self._decisions.append(
            transitions.decide(
                flight.run, result.outcome, flight.spec.backoff, result.duration, flight.logs
            )
        )

    def _finalized(self, decisions: list[Decision], kept: set[int]) -> None:
        for decision in decisions:
            status = decision.status.value if decision.run.id in kept else "lost"
            self.tell(decision.run, status, decision.error)

    def tell(self, run: ClaimedRun, status: str, error: Errored | None) -> None:
        """What became of an attempt: counted, and told to the observers."""
        self._attempts.append(Attempted(run.id, run.job_type, run.attempt, status, error))
        if self.observers is not None:
            self.observers.finished(run, status, error)

    def done(self) -> Drained:
        """The drain is over: the observers are closed; returns what it did."""
        if self.observers is not None:
            self.observers.close(0)
        counts = {status: 0 for status in ("succeeded", "failed", "dead", "lost")}
        for attempt in self._attempts:
            counts[attempt.status] += 1
        return Drained(**counts, attempts=tuple(self._attempts))


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """An `async def` handler's attempt, from a test that is not async: on a loop of its own."""
    if _loop_running():
        coroutine.close()
        raise RuntimeError(
            "an async def handler cannot be run from sync code inside a running event loop:"
            " use `await jobrunner.adrain()` (or `arun_handler`) in an async test"
        )
    return asyncio.run(coroutine)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
