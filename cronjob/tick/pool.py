"""The worker pool: handler threads, and the in-flight state of every run the tick holds.

Each claimed run becomes a `Flight` (`cronjob.tick.flight`). Its state changes only
here, under one lock, so a worker finishing a handler and the main thread giving
the run up (handed back, timed out, lease lost) can never both decide its fate:

    state    | meaning                                 | moves to | by
    ---------+-----------------------------------------+----------+-----------------------------
    QUEUED   | claimed, waiting for a worker           | STARTED  | a worker taking it (`_start`)
             |                                         | SETTLED  | the main thread (`settle`)
    STARTED  | a worker is running its handler         | DONE     | its worker, the handler having
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

Hand-off. Queued runs wait on the main thread's side and are handed to the
workers a few at a time (`_dispatch`), never more than `HANDED_AHEAD` beyond
what they are running: a worker that empties its queue blocks, so the main
thread gets the interpreter back often enough to claim on time, instead of
finding the pool empty after a worker ran the whole batch in one stretch. A
single worker takes its runs in chunks of `CHUNK` (it would run them in that
order anyway); several take one run at a time, so a slow run never holds up
runs another worker could start. A chunk's runs stay QUEUED until their turn:
the main thread can still settle them, and when it retires a worker mid-chunk
(its handler overran) the rest of the chunk goes back to be handed out again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from cronjob.context import AsyncJobContext, JobContext
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun, Succeeded
from cronjob.settings import DEFAULT_ASYNC_CONCURRENCY
from cronjob.tick.execute import commit_success, errored, execute
from cronjob.tick.flight import Flight, FlightState, Result, Slot

if TYPE_CHECKING:
    from cronjob.db import Database
    from cronjob.tick.aio import AsyncExecutor

CHUNK = 32  # runs per hand-off to a single worker
HANDED_AHEAD = 64  # runs handed to the workers beyond those they are running


class Pool:
    """Up to `concurrency` worker threads running the handlers of the runs in flight."""

    def __init__(
        self,
        handlers: dict[str, HandlerSpec],
        *,
        concurrency: int,
        database: Database,
        worker: str,
        now: datetime | None = None,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
    ) -> None:
        self.handlers = handlers
        self.concurrency = concurrency
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
        self._pending: deque[Flight] = deque()  # QUEUED, not yet handed to a worker
        self._chunk = CHUNK if concurrency == 1 else 1
        self._work: queue.SimpleQueue[Sequence[Flight] | None] = queue.SimpleQueue()
        # None is a wake-up call (`wake`), for whoever waits in `collect`.
        self._done: queue.SimpleQueue[Result | None] = queue.SimpleQueue()
        self._slots: list[Slot] = []
        self._async_types = {t for t, s in handlers.items() if s.is_async}  # asked once per type

    # -- the main thread's side ---------------------------------------------

    def add(self, runs: Iterable[ClaimedRun]) -> list[Flight]:
        """Queue claimed runs for the workers, starting workers as needed.

        Returns the flights given up because their run was claimed again: this tick
        stalled past the lease, another rescued the run, and this one claimed it anew.
        """
        displaced = []
        for run in runs:
            earlier = self.flights.get(run.id)
            if earlier is not None and self.settle(earlier, await_return=True):
                displaced.append(earlier)
            spec = self.handlers[run.job_type]
            if run.job_type in self._async_types:
                ctx = AsyncJobContext(run, self._database)
                flight = self.flights[run.id] = Flight(run, spec, ctx)
                self._executor().submit(flight)
            else:
                flight = self.flights[run.id] = Flight(run, spec, JobContext(run, self._database))
                self._pending.append(flight)
        self._ensure_workers()
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
            self._retire(flight.slot)
            self._ensure_workers()
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
        self._pending.clear()  # settled by now: nothing is started any more
        for slot in self._slots:
            if not slot.retired:
                self._work.put(None)
        if self._async is not None:
            self._async.stop()

    def blocking(self, now: float) -> tuple[Flight, float] | None:
        """An async handler holding the event loop for over a second, and for how long."""
        return self._async.blocking(now) if self._async is not None else None

    def _executor(self) -> AsyncExecutor:
        if self._async is None:
            from cronjob.tick.aio import AsyncExecutor

            self._async = AsyncExecutor(
                self.async_concurrency, start=self._start, done_with=self._done_with,
                deliver=self._done.put, worker=self._worker, now=self._now,
            )  # fmt: skip
        return self._async

    def _release(self, flight: Flight) -> None:
        flight.ctx.cancelled.set()
        self._forget(flight)

    def _forget(self, flight: Flight) -> None:
        if self.flights.get(flight.run.id) is flight:  # not the same run claimed anew
            del self.flights[flight.run.id]

    def _dispatch(self) -> None:
        """Hand queued runs to the workers, up to HANDED_AHEAD beyond what they run."""
        pending, size, work = self._pending, self._chunk, self._work
        while pending and work.qsize() * size < HANDED_AHEAD:
            work.put([pending.popleft() for _ in range(min(size, len(pending)))])

    def _retire(self, slot: Slot) -> None:
        """A worker stays in an overrunning handler: the rest of its chunk goes to the others."""
        slot.retired = True
        rest = [f for f in slot.chunk if f.state is FlightState.QUEUED]
        self._pending.extendleft(reversed(rest))  # first in line again, in their order

    def _ensure_workers(self) -> None:
        """Start workers up to the concurrency the runs held need, and hand them work."""
        active = sum(not s.retired for s in self._slots)
        wanted = min(self.concurrency, len(self.flights))
        for _ in range(wanted - active):
            slot = Slot()
            # A daemon: a handler stuck past its timeout must not keep the process alive.
            thread = threading.Thread(target=self._work_loop, args=(slot,), daemon=True,
                                      name=f"jobrunner-worker-{len(self._slots)}")  # fmt: skip
            self._slots.append(slot)
            thread.start()
        self._dispatch()

    # -- the workers' side ---------------------------------------------------

    def _work_loop(self, slot: Slot) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            slot.chunk = chunk
            for flight in chunk:
                if not self._start(flight, slot):
                    continue  # handed back or lost before a worker got to it
                self._run(flight)
                if slot.retired:
                    return  # this handler overran its timeout; a replacement took our place

    def _run(self, flight: Flight) -> None:
        started = flight.started
        assert started is not None
        outcome = execute(flight.spec, flight.run, flight.ctx)
        result = Result(flight, outcome, time.monotonic() - started)
        try:
            if self._done_with(flight) and flight.ctx.used_db:
                _finish_in_handler_transaction(result, worker=self._worker, now=self._now)
        finally:
            # Before the result is handed over: a failure is recorded only
            # once the handler's transaction is gone.
            flight.ctx.close()
        self._done.put(result)

    def _start(self, flight: Flight, slot: Slot | None = None) -> bool:
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


def _finish_in_handler_transaction(result: Result, *, worker: str, now: datetime | None) -> None:
    """Record success in the handler's own transaction, or leave its writes to roll back.

    The run is DONE by now, so the main thread neither hands it back nor times
    it out while this commits.
    """
    if not isinstance(result.outcome, Succeeded):
        return  # closing the connection rolls the handler's writes back
    flight = result.flight
    try:
        kept = commit_success(flight.run, flight.ctx, result.duration, worker=worker, now=now)
        result.kept, result.finalized = kept, True
    except Exception as exc:
        # Recorded as a failed attempt by the main thread, fenced like any
        # other; if the COMMIT did go through after all, that write is a no-op.
        result.outcome = errored(exc)
