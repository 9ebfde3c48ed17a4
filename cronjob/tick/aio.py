"""The async executor: one event loop on its own thread, running `async def` handlers.

It sits beside the worker threads inside the pool: the pool hands it flights and keeps
their in-flight state, changed only through the pool's own methods. Up to `limit`
coroutines run at once; the others wait for a place, still QUEUED, so a tick that
stops hands them back like runs no thread has started.

Hand-off. The pool hands over a claim's async runs in one call (`submit`), which
wakes the loop once for the lot: a wake-up is a write to the loop's socket, and one
per run cost more than a no-op handler. On the loop, each run that gets a place
becomes a task of its own (what a timeout cancels), and gives its place to the next
waiting run when it ends. Only the loop thread touches the waiting runs, the tasks
and the count of places taken; the main thread reaches them through the loop
(`submit`, `cancel`, `stop`).

A coroutine that blocks the loop (a `time.sleep`, CPU-bound work) stalls every other
coroutine with it. The loop marks the time every `BEAT` seconds; when the mark falls
more than `LAG_WARNING` behind, `blocking()` names the run whose handler holds the loop,
read from the loop thread's current stack.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cronjob.models import Outcome, Succeeded
from cronjob.tick.execute import commit_success_async, errored, execute_async
from cronjob.tick.flight import Result

if TYPE_CHECKING:
    from cronjob.tick.observers import Observers

BEAT = 0.25
LAG_WARNING = 1.0  # seconds the loop may fall behind before the run holding it is named


class AsyncExecutor:
    """An event loop thread that runs flights' coroutines, at most `limit` at a time."""

    def __init__(
        self,
        limit: int,
        *,
        start: Callable[[Any], bool],
        done_with: Callable[[Any], bool],
        deliver: Callable[[Any], None],
        worker: str,
        now: datetime | None,
        observers: Observers | None = None,
    ) -> None:
        self._observers = observers  # told around each handler, in its task
        # The pool's own state changes (QUEUED → STARTED, STARTED → DONE) and its
        # results queue: the executor runs handlers, the pool keeps their state.
        self._start = start
        self._done_with = done_with
        self._deliver = deliver
        self._worker = worker
        self._now = now
        self._loop = asyncio.new_event_loop()
        self._limit = limit
        self._taken = 0  # places taken by running tasks
        self._waiting: deque[Any] = deque()  # handed over, QUEUED, waiting for a place
        # By the flight's identity: a run given up can be claimed again, under the
        # same id, in the same tick.
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.beat = time.monotonic()
        self._thread = threading.Thread(
            target=self._serve,
            name="jobrunner-async",
            daemon=True,  # as the worker threads
        )
        self._thread.start()

    def submit(self, flights: Sequence[Any]) -> None:
        """Hand runs to the loop, in one wake-up for the lot."""
        self._loop.call_soon_threadsafe(self._admit, flights)

    def cancel(self, flight: Any) -> None:
        """Cancel the flight's task: its handler sees CancelledError at its next await."""
        self._loop.call_soon_threadsafe(self._cancel, flight)

    def blocking(self, now: float) -> tuple[Any, float] | None:
        """The flight whose handler holds the loop, and for how long, past LAG_WARNING."""
        lag = now - self.beat
        if lag < LAG_WARNING or self._thread.ident is None:
            return None
        frame = sys._current_frames().get(self._thread.ident)
        while frame is not None:
            if frame.f_code is _EXECUTE_CODE:
                return frame.f_locals.get("flight"), lag
            frame = frame.f_back
        return None

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._mark)
        self._loop.run_forever()

    def _mark(self) -> None:
        self.beat = time.monotonic()
        self._loop.call_later(BEAT, self._mark)

    # -- the loop thread's side ------------------------------------------------

    def _admit(self, flights: Sequence[Any]) -> None:
        self._waiting.extend(flights)
        self._fill()

    def _fill(self) -> None:
        """Give places to waiting runs, first come first served."""
        waiting, tasks = self._waiting, self._tasks
        while waiting and self._taken < self._limit:
            flight = waiting.popleft()
            self._taken += 1
            tasks[id(flight)] = self._loop.create_task(self._execute(flight))

    def _cancel(self, flight: Any) -> None:
        task = self._tasks.get(id(flight))
        if task is not None:
            task.cancel()

    async def _execute(self, flight: Any) -> None:
        try:
            # STARTED only once its task runs: a run the main thread can time out
            # (and so cancel) is one whose task is inside this `try`.
            if not self._start(flight):
                return  # handed back or lost before it got a place
            started = flight.started
            outcome = await execute_async(flight, self._observers)
            await self._finish(flight, outcome, time.monotonic() - started)
        finally:
            del self._tasks[id(flight)]
            self._taken -= 1
            self._fill()

    async def _finish(self, flight: Any, outcome: Outcome, duration: float) -> None:
        """What a worker thread does after `execute`, on the loop: commit, close, deliver."""
        result, ctx = Result(flight, outcome, duration), flight.ctx
        try:
            if self._done_with(flight) and ctx.used_db and isinstance(outcome, Succeeded):
                commit = commit_success_async(
                    flight.run, ctx, duration, worker=self._worker, now=self._now, logs=flight.logs
                )
                try:
                    result.kept, result.finalized = await commit, True
                except Exception as exc:
                    # A failed attempt, fenced like any other (as in the pool's threads).
                    result.outcome = errored(exc)
        finally:
            await ctx.aclose()
        self._deliver(result)


_EXECUTE_CODE = AsyncExecutor._execute.__code__
