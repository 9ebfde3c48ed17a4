"""The pool: the in-flight state of every run the tick holds, and the executors that run
their handlers.

Each claimed run becomes a `Flight` (`cronjob.tick.flight`). Its state changes only
here, under one lock, so a worker finishing a handler and the main thread giving
the run up (handed back, timed out, lease lost) can never both decide its fate:

    state    | meaning                                 | moves to | by
    ---------+-----------------------------------------+----------+-----------------------------
    QUEUED   | claimed, waiting for a worker           | STARTED  | a worker taking it (`_start`)
             |                                         | SETTLED  | the main thread (`settle`)
    STARTED  | its handler is running                  | DONE     | its worker, the handler having
             |                                         |          | returned (`_done_with`)
             |                                         | SETTLED  | the main thread (`settle`,
             |                                         |          | `overdue`)
    DONE     | the handler returned; its result is on  | SETTLED  | the main thread taking the
             | its way to the main thread              |          | result (`collect`)
    SETTLED  | the main thread decided its fate; a     | —        |
             | late result is discarded                |          |

A DONE run is never settled by anyone but `collect`: its worker may be committing
the handler's own transaction (`ctx.db`) at that moment, and what that commit says
is the run's outcome.

A run settled while STARTED still has its handler running, told through
`ctx.cancelled` to stop: its thread is replaced at once, and when the run was
given up for a lost lease it is kept in `stopping` until the handler returns, so
the tick can wait for it before exiting.

Handlers run beside the pool, which hands them flights: plain ones on the worker
threads (`cronjob.tick.workers`, which also tells how runs are handed to them), async
ones on the event loop (`cronjob.tick.aio`). Both change a run's state only through
the pool's `_start` and `_done_with`, under its lock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from cronjob.context import AsyncJobContext, JobContext
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun
from cronjob.settings import DEFAULT_ASYNC_CONCURRENCY
from cronjob.tick.flight import Flight, FlightState, Result, Slot
from cronjob.tick.workers import Workers

if TYPE_CHECKING:
    from cronjob.db import Database
    from cronjob.tick.aio import AsyncExecutor
    from cronjob.tick.observers import Observers


class Pool:
    """The runs in flight, their states, and the threads and event loop running their handlers."""

    def __init__(
        self,
        handlers: dict[str, HandlerSpec],
        *,
        concurrency: int,
        database: Database,
        worker: str,
        now: datetime | None = None,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
        observers: Observers | None = None,
    ) -> None:
        self.handlers = handlers
        self._observers = observers
        self.async_concurrency = async_concurrency
        self._async: AsyncExecutor | None = None  # started with the first async handler's run
        self.flights: dict[int, Flight] = {}  # every run not SETTLED, by id
        # Runs given up while their handlers ran, told through ctx.cancelled to stop:
        # the main thread may wait for those handlers to return. By object: a run given
        # up can be claimed again, under the same id, in the same tick.
        self.stopping: dict[int, Flight] = {}
        self._database = database
        self._worker = worker
        self._now = now
        self._lock = threading.Lock()  # guards every Flight.state change
        # None is a wake-up call (`wake`), for whoever waits in `collect`.
        self._done: queue.SimpleQueue[Result | None] = queue.SimpleQueue()
        self._threads = Workers(
            concurrency,
            start=self._start,
            done_with=self._done_with,
            deliver=self._done.put,
            worker=worker,
            now=now,
            observers=observers,
        )
        self._dispatch = self._threads.dispatch  # bound once: `collect` calls it every pass
        self._async_types = {t for t, s in handlers.items() if s.is_async}  # asked once per type

    # -- the main thread's side ---------------------------------------------

    def add(self, runs: Iterable[ClaimedRun]) -> list[Flight]:
        """Queue claimed runs for the workers, starting workers as needed.

        Returns the flights given up because their run was claimed again: this tick
        stalled past the lease, another rescued the run, and this one claimed it anew.
        """
        displaced, pending, handed = [], self._threads.pending, []
        for run in runs:
            earlier = self.flights.get(run.id)
            if earlier is not None and self.settle(earlier, await_return=True):
                displaced.append(earlier)
            spec = self.handlers[run.job_type]
            if run.job_type in self._async_types:
                ctx = AsyncJobContext(run, self._database)
                flight = self.flights[run.id] = Flight(run, spec, ctx)
                handed.append(flight)
            else:
                flight = self.flights[run.id] = Flight(run, spec, JobContext(run, self._database))
                pending.append(flight)
        if handed:
            self._executor().submit(handed)  # the claim's async runs, in one hand-off
        self._threads.ensure(len(self.flights))
        return displaced

    def running(self) -> int:
        return sum(f.state is FlightState.STARTED for f in self.flights.values())

    def wake(self) -> None:
        """Make a `collect` waiting on another thread return now. Safe from any thread."""
        self._done.put(None)

    def collect(self, wait: float) -> list[Result]:
        """Results of handlers that returned, waiting up to `wait` seconds for the first.

        Each is SETTLED here; a result whose run was settled first is dropped.
        """
        self._dispatch()
        done, items = self._done, []
        try:
            items.append(done.get(timeout=wait) if wait > 0 else done.get_nowait())
            while True:
                items.append(done.get_nowait())
        except queue.Empty:
            pass
        results, dropped = [], []
        with self._lock:  # once for the lot
            for item in items:
                if item is None:
                    continue
                if item.flight.state is FlightState.DONE:
                    item.flight.state = FlightState.SETTLED
                    results.append(item)
                else:  # settled first (handed back, timed out, lease lost)
                    dropped.append(item.flight)
        for result in results:
            self._forget(result.flight)
        for flight in dropped:
            self.stopping.pop(id(flight), None)
        return results

    def settle(self, flight: Flight, *, await_return: bool = False) -> bool:
        """Give up a QUEUED or STARTED run (tell its handler); False if its handler returned.

        `await_return`: the handler, if running, stays in `stopping` until it returns.
        """
        with self._lock:
            if flight.state not in (FlightState.QUEUED, FlightState.STARTED):
                return False
            running = flight.state is FlightState.STARTED
            flight.state = FlightState.SETTLED
        self._release(flight)
        if running and flight.slot is not None:
            # Its thread stays in the handler until it returns: another takes its place.
            self._threads.retire(flight.slot)
            self._threads.ensure(len(self.flights))
        if await_return and running:
            self.stopping[id(flight)] = flight
        return True

    def settle_all(self, states: set[FlightState]) -> list[Flight]:
        """Settle every run in `states`, in one step so no worker slips in between."""
        with self._lock:
            chosen = [f for f in self.flights.values() if f.state in states]
            for flight in chosen:
                flight.state = FlightState.SETTLED
        for flight in chosen:
            self._release(flight)
        return chosen

    def overdue(self, now: float) -> list[Flight]:
        """Settle the runs whose handlers have run past their timeout, and replace their threads.

        The threads stay stuck in the handlers; others take their places (`settle` sees
        to that) so the tick keeps its concurrency. What such a handler returns later is
        discarded.
        """
        late = [
            f
            for f in list(self.flights.values())
            if f.spec.timeout is not None
            and f.started is not None
            and now - f.started >= f.spec.timeout
            and self.settle(f)
        ]
        for flight in late:
            if flight.slot is None and self._async is not None and flight.spec.is_async:
                self._async.cancel(flight)  # the handler sees CancelledError
        return late

    def stop(self) -> None:
        """Let idle workers exit; a worker still in a handler exits when it returns."""
        self._threads.stop()
        if self._async is not None:
            self._async.stop()

    def blocking(self, now: float) -> tuple[Flight, float] | None:
        """An async handler holding the event loop for over a second, and for how long."""
        return self._async.blocking(now) if self._async is not None else None

    def _executor(self) -> AsyncExecutor:
        if self._async is None:
            from cronjob.tick.aio import AsyncExecutor

            self._async = AsyncExecutor(
                self.async_concurrency,
                start=self._start,
                done_with=self._done_with,
                deliver=self._done.put,
                worker=self._worker,
                now=self._now,
                observers=self._observers,
            )
        return self._async

    def _release(self, flight: Flight) -> None:
        if flight.logs is not None:
            flight.logs.close()  # before its handler is told: what it logs after is not kept
        flight.ctx.cancelled.set()
        self._forget(flight)

    def _forget(self, flight: Flight) -> None:
        if self.flights.get(flight.run.id) is flight:  # not the same run claimed anew
            del self.flights[flight.run.id]

    # -- the executors' side: the state changes they make --------------------

    def _start(self, flight: Flight, slot: Slot | None = None) -> bool:
        """QUEUED → STARTED, as a thread or the event loop takes the run; False if settled."""
        with self._lock:
            if flight.state is not FlightState.QUEUED:
                return False
            flight.state = FlightState.STARTED
            flight.started = time.monotonic()
            flight.slot = slot
            return True

    def _done_with(self, flight: Flight) -> bool:
        """STARTED → DONE: the right to report this run's outcome; False if settled already."""
        with self._lock:
            if flight.state is not FlightState.STARTED:
                return False
            flight.state = FlightState.DONE
            return True
