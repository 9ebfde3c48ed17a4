"""Django's `task_started` and `task_finished`, sent around each attempt a tick makes at a task.

As Django's own backends send them: from the thread that runs the task (for an `async def`
task, awaited on the tick's event loop), sender the backend's class; `task_started` just
before the task's function is called, `task_finished` once the attempt is over, once per
attempt. `task_result` is the run as get_result() reads it at that moment: RUNNING at the
start (and the same TaskResult is a `takes_context` task's `context.task_result`); at the
end, as the tick records the attempt: SUCCESSFUL with the return value, FAILED with the
attempt's error appended when the run gives up, READY with it when a retry is due (Django's
own READY, "ready to be executed again": one failed attempt of several is not told, nor
logged by Django at ERROR, as the task's failure).

When `task_finished` is sent: as soon as the task returned or raised, but for an `atomic`
task once its transaction has ended, committed with the run's success or rolled back. A
receiver run inside it would have its queries in the task's transaction, committed or
rolled back with the task's writes, and one query of it that failed would abort the
transaction and turn the run's success into a failure; after the commit, a receiver that
reads the task's rows sees them, and get_result() reads what the signal told. Other tasks'
outcomes are written moments later by the tick's main thread, a batch of runs at a time,
and the signal does not wait for that: that thread renews leases and claims, and never
runs receivers.

Receivers are called robustly (`send_robust`): one that raises is logged, and changes
neither the run's outcome nor the tick. (Django's ImmediateBackend uses `send`, where the
error reaches the code that enqueued; in a tick there is no such caller, and a receiver's
bug must not fail tasks that succeeded.)
"""

from __future__ import annotations

from typing import Any

from cronjob.context import JobContext, LeaseLost
from cronjob.models import Errored, Outcome, Succeeded


class TaskAttempt:
    """One attempt at a Django task, told to the signals' receivers: started, then finished once.

    `start` reads the run and sends `task_started`; the task's return value or exception
    is recorded with `returned` / `raised`; `finish` sends `task_finished`, once, and
    `ended` does for a task whose transaction ends the attempt.
    """

    def __init__(self, task: Any, ctx: JobContext, row: dict[str, Any]) -> None:
        from cronjob.django.results import task_result

        self.task = task
        self.result = task_result(row, task.backend)  # RUNNING: the run as it starts
        self._ctx = ctx
        self._outcome: Outcome = Succeeded()
        self._value: Any = None
        self._finished = False

    @classmethod
    def start(cls, task: Any, ctx: JobContext) -> TaskAttempt:
        """The run read on this thread's Django connection, and task_started sent."""
        from cronjob.django.connection import django_connection
        from cronjob.store import task_result_get

        attempt = cls(task, ctx, task_result_get(django_connection(), ctx.run_id))
        attempt._send("task_started", attempt.result)
        return attempt

    @classmethod
    async def start_async(cls, task: Any, ctx: Any) -> TaskAttempt:
        """As `start`, the run read on a connection of the tick's own: Django's are sync only."""
        from cronjob.store import task_result_get_async

        conn = await ctx._connect_async(autocommit=True)
        try:
            row = await task_result_get_async(conn, ctx.run_id)
        finally:
            await conn.close()
        attempt = cls(task, ctx, row)
        await attempt._send_async("task_started", attempt.result)
        return attempt

    def returned(self, value: Any) -> None:
        self._outcome, self._value = Succeeded(), value

    def raised(self, exc: BaseException) -> None:
        from cronjob.tick.execute import outcome_of

        self._outcome = outcome_of(exc)  # the error the tick records for this attempt

    def ended(self, error: BaseException | None) -> None:
        """The task's transaction ended: committed (`error` None), or rolled back by `error`."""
        if error is not None and isinstance(self._outcome, Succeeded):
            from cronjob.tick.execute import errored

            self._outcome = errored(error)  # the task returned; its success was not kept
        self.finish()

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._send("task_finished", self._finished_result())

    async def finish_async(self) -> None:
        if not self._finished:
            self._finished = True
            await self._send_async("task_finished", self._finished_result())

    @property
    def _sender(self) -> type:
        return type(self.task.get_backend())

    def _finished_result(self) -> Any:
        from cronjob import transitions
        from cronjob.django.results import attempt_ended
        from cronjob.handlers import Backoff
        from cronjob.tick.execute import errored

        outcome = self._outcome
        if self._ctx.cancelled.is_set():
            # The tick gave the run up while the task ran (timed out, cancelled, its lease
            # lost): what the task then did is not what the run records.
            taken = LeaseLost(
                f"run {self._ctx.run_id} was taken from this attempt (timed out, cancelled,"
                " or its lease lost)"
            )
            outcome = errored(taken)
        # Failed or dead as the tick decides it (only the status is read, not the delay).
        status = transitions.decide(self._ctx._run, outcome, Backoff()).status
        error = outcome if isinstance(outcome, Errored) else None
        return attempt_ended(self.result, status.value, error, self._value)

    def _send(self, name: str, result: Any) -> None:
        from django.tasks import signals

        self._tell(name, getattr(signals, name).send_robust(self._sender, task_result=result))

    async def _send_async(self, name: str, result: Any) -> None:
        from django.tasks import signals

        signal = getattr(signals, name)
        self._tell(name, await signal.asend_robust(self._sender, task_result=result))

    def _tell(self, signal: str, responses: list[tuple[Any, Any]]) -> None:
        """Log the receivers that raised: robust sending handed their errors back."""
        for receiver, response in responses:
            if isinstance(response, Exception):
                from cronjob import log

                log.get_logger().warning(
                    "task signal receiver failed; the run's outcome stands",
                    signal=signal, receiver=_name(receiver), run_id=self._ctx.run_id,
                    job_type=self._ctx.job_type[:200], error=_describe(response),
                )  # fmt: skip


def _name(receiver: Any) -> str:
    module = getattr(receiver, "__module__", None) or "?"
    return f"{module}.{getattr(receiver, '__qualname__', type(receiver).__qualname__)}"


def _describe(exc: Exception) -> str:
    # A receiver's exception is arbitrary code: its __str__ may itself raise.
    try:
        return f"{type(exc).__name__}: {str(exc)[:500]}"
    except Exception:
        return f"{type(exc).__name__} (its message could not be read)"
