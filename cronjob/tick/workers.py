"""The worker threads: plain handlers' runs, handed to them a few at a time.

They sit beside the async executor inside the pool: the pool hands them flights
and keeps their in-flight state, changed only through the pool's own methods
(QUEUED → STARTED as a thread takes a run, STARTED → DONE as its handler returns).

Hand-off. Queued runs wait on the main thread's side (`pending`) and are handed
to the threads a few at a time (`dispatch`), never more than `HANDED_AHEAD`
beyond what they are running: a thread that empties its queue blocks, so the
main thread gets the interpreter back often enough to claim on time, instead of
finding the pool empty after a thread ran the whole batch in one stretch. A
single thread takes its runs in chunks of `CHUNK` (it would run them in that
order anyway); several take one run at a time, so a slow run never holds up
runs another thread could start. A chunk's runs stay QUEUED until their turn:
the main thread can still settle them, and when it retires a thread mid-chunk
(its handler overran) the rest of the chunk goes back to be handed out again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from cronjob.models import Succeeded
from cronjob.tick.execute import commit_success, errored, execute
from cronjob.tick.flight import Flight, FlightState, Result, Slot

if TYPE_CHECKING:
    from cronjob.tick.observers import Observers

CHUNK = 32  # runs per hand-off to a single thread
HANDED_AHEAD = 64  # runs handed to the threads beyond those they are running


class Workers:
    """Up to `concurrency` threads running the handlers of the plain runs in flight."""

    def __init__(
        self,
        concurrency: int,
        *,
        start: Callable[[Flight, Slot], bool],
        done_with: Callable[[Flight], bool],
        deliver: Callable[[Result], None],
        worker: str,
        now: datetime | None,
        observers: Observers | None = None,
    ) -> None:
        self.concurrency = concurrency
        self._observers = observers  # told around each handler, on its thread
        self.pending: deque[Flight] = deque()  # QUEUED, not yet handed to a thread
        # The pool's own state changes and its results queue: the threads run
        # handlers, the pool keeps their state.
        self._start = start
        self._done_with = done_with
        self._deliver = deliver
        self._worker = worker
        self._now = now
        self._chunk = CHUNK if concurrency == 1 else 1
        self._work: queue.SimpleQueue[Sequence[Flight] | None] = queue.SimpleQueue()
        self._slots: list[Slot] = []

    # -- the main thread's side ---------------------------------------------

    def dispatch(self) -> None:
        """Hand pending runs to the threads, up to HANDED_AHEAD beyond what they run."""
        pending, size, work = self.pending, self._chunk, self._work
        while pending and work.qsize() * size < HANDED_AHEAD:
            work.put([pending.popleft() for _ in range(min(size, len(pending)))])

    def retire(self, slot: Slot) -> None:
        """A thread stays in an overrunning handler: the rest of its chunk goes to the others."""
        slot.retired = True
        rest = [f for f in slot.chunk if f.state is FlightState.QUEUED]
        self.pending.extendleft(reversed(rest))  # first in line again, in their order

    def ensure(self, held: int) -> None:
        """Start threads up to the concurrency that `held` runs need, and hand them work."""
        active = sum(not s.retired for s in self._slots)
        for _ in range(min(self.concurrency, held) - active):
            slot = Slot()
            # A daemon: a handler stuck past its timeout must not keep the process alive.
            name = f"jobrunner-worker-{len(self._slots)}"
            thread = threading.Thread(target=self._work_loop, args=(slot,), daemon=True, name=name)
            self._slots.append(slot)
            thread.start()
        self.dispatch()

    def stop(self) -> None:
        """Let idle threads exit; a thread still in a handler exits when it returns."""
        self.pending.clear()  # settled by now: nothing is started any more
        for slot in self._slots:
            if not slot.retired:
                self._work.put(None)

    # -- the threads' side ---------------------------------------------------

    def _work_loop(self, slot: Slot) -> None:
        while True:
            chunk = self._work.get()
            if chunk is None:
                return
            slot.chunk = chunk
            for flight in chunk:
                if not self._start(flight, slot):
                    continue  # handed back or lost before a thread got to it
                self._run(flight)
                if slot.retired:
                    return  # this handler overran its timeout; a replacement took our place

    def _run(self, flight: Flight) -> None:
        started = flight.started
        assert started is not None
        outcome = execute(flight, self._observers)
        result = Result(flight, outcome, time.monotonic() - started)
        try:
            if self._done_with(flight) and flight.ctx.used_db:
                _finish_in_handler_transaction(result, worker=self._worker, now=self._now)
        finally:
            # Before the result is handed over: a failure is recorded only
            # once the handler's transaction is gone.
            flight.ctx.close()
        self._deliver(result)


def _finish_in_handler_transaction(result: Result, *, worker: str, now: datetime | None) -> None:
    """Record success in the handler's own transaction, or leave its writes to roll back.

    The run is DONE by now, so the main thread neither hands it back nor times
    it out while this commits.
    """
    if not isinstance(result.outcome, Succeeded):
        return  # closing the connection rolls the handler's writes back
    flight = result.flight
    try:
        kept = commit_success(
            flight.run, flight.ctx, result.duration, worker=worker, now=now, logs=flight.logs
        )
        result.kept, result.finalized = kept, True
    except Exception as exc:
        # Recorded as a failed attempt by the main thread, fenced like any
        # other; if the COMMIT did go through after all, that write is a no-op.
        result.outcome = errored(exc)
