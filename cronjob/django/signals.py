"""Django's `task_started` and `task_finished`, sent for each attempt a tick makes at a task.

Sender the backend's class, as Django's own backends send them; Django's own receivers
log them (`django.tasks`: RUNNING at the start, then SUCCESSFUL, FAILED or READY), and
the tick writes those lines as JSON on its stderr like its own.

- `task_started`, by the task's handler (cronjob.django.runner) on the thread that runs
  it (for an `async def` task, awaited in its task on the event loop), just before the
  task's function is called, and for an `atomic` task before its transaction opens. Its
  `task_result` is RUNNING, built from the run as the claim handed it over, with no read
  of its own: its errors and worker ids are this attempt's (`get_result()` reads the
  whole history), but for a `takes_context` task, whose run is read for its context
  anyway: the signal gets that same TaskResult.
- `task_finished`, once the attempt's outcome is written, from outside the attempt: the
  tick's tally tells `TaskSignals.finished` (an observer, tick/observers.py) on the main
  thread, which hands the attempt to a thread of its own that builds the TaskResult and
  sends the signal. By then the run's row says what the signal says, an `atomic` task's
  transaction has committed or rolled back, and the receivers' time counts toward
  neither the task's timeout nor its lease, nor holds up the tick's loop. Its status is
  the one the tick recorded: SUCCESSFUL with the return value; READY when a retry is
  due, and when the run was handed back (a stopping tick gave it up unfinished, its
  attempt not counted); FAILED with the attempt's error when the run is dead (a timeout
  on the last attempt among them), and when the run was taken from the attempt (it was
  cancelled, or its lease lost).

Receivers are called robustly (`send_robust`): one that raises is logged and changes
nothing, neither the run's outcome nor the other receivers' calls.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any

from django.tasks import TaskResult, TaskResultStatus

from cronjob.context import JobContext
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun, Errored
from cronjob.tick.observers import Observer, attempt_key

# task_finished's status for each outcome the tally tells (tick/observers.OUTCOMES).
FINISHED = {
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.READY,  # a retry is due
    "handed back": TaskResultStatus.READY,
    "dead": TaskResultStatus.FAILED,
    "lost": TaskResultStatus.FAILED,
}
TAKEN = (
    "the run was taken from this attempt: it was cancelled, or its lease was lost to another tick"
)


@dataclasses.dataclass
class TaskAttempt:
    """An attempt that sent task_started: what task_finished is to be made of."""

    task: Any
    result: TaskResult  # RUNNING, as task_started was sent with it
    value: Any = None  # what the task returned, as stored


# The attempts that started and have not finished, by attempt_key: put by the task's
# handler (its thread), taken by TaskSignals.finished (the main thread).
_started: dict[Any, TaskAttempt] = {}


def started(task: Any, ctx: JobContext, result: TaskResult | None = None) -> TaskResult:
    """Send task_started for this attempt at `task`; returns its RUNNING TaskResult."""
    attempt = _attempt(task, ctx, result)
    _tell("task_started", _signal("task_started").send_robust(_sender(task), task_result=attempt))
    return attempt


async def started_async(task: Any, ctx: JobContext, result: TaskResult | None = None) -> Any:
    """As `started`, from an `async def` task: sync receivers run off the event loop."""
    attempt = _attempt(task, ctx, result)
    responses = await _signal("task_started").asend_robust(_sender(task), task_result=attempt)
    _tell("task_started", responses)
    return attempt


def returned(ctx: JobContext, value: Any) -> None:
    """What the task returned, as stored: task_finished carries it."""
    attempt = _started.get(attempt_key(ctx.run))
    if attempt is not None:
        attempt.value = value


def _attempt(task: Any, ctx: JobContext, result: TaskResult | None) -> TaskResult:
    if result is None:
        result = _running(task, ctx)
    _started[attempt_key(ctx.run)] = TaskAttempt(task, result)
    return result


def _running(task: Any, ctx: JobContext) -> TaskResult:
    """The run as it starts, from the claim: no read."""
    from django.utils import timezone

    from cronjob.tick.steps import worker_name

    run, now = ctx.run, timezone.now()
    payload = run.payload if isinstance(run.payload, dict) else {}
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    return TaskResult(
        task=task,
        id=str(run.result_id) if run.result_id is not None else None,  # type: ignore[arg-type]
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=task.backend,
        errors=[],
        worker_ids=[worker_name()],
    )


def finished_result(attempt: TaskAttempt, outcome: str, error: Errored | None) -> TaskResult:
    """The attempt's TaskResult once `outcome` (as the tally tells it) is written."""
    from django.utils import timezone

    from cronjob.django.results import task_error

    status = FINISHED[outcome]
    errors = list(attempt.result.errors)
    if error is not None:
        recorded = {"error_type": error.error_type, "message": error.message}
        errors.append(task_error({**recorded, "traceback": error.traceback}))
    elif outcome == "lost":
        errors.append(task_error({"error_type": "lease_expired", "message": TAKEN}))
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    result = dataclasses.replace(
        attempt.result,
        status=status,
        finished_at=timezone.now() if finished else None,
        errors=errors,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", attempt.value)
    return result


class TaskSignals(Observer):
    """Sends task_finished for each attempt that sent task_started, once its outcome is
    written, from a thread of its own."""

    @staticmethod
    def wanted(handlers: dict[str, HandlerSpec]) -> bool:
        """Whether some of the tick's handlers run Django tasks."""
        return any(
            getattr(spec.func, "django_task", None) is not None for spec in handlers.values()
        )

    def __init__(self, *, inline: bool = False) -> None:
        """`inline`: task_finished is sent at once, on the thread that tells the outcome (the
        test's drain, cronjob.testing, whose receivers see the test's transaction), and the
        process's logging is left as it is."""
        self._inline = inline
        if not inline:
            from cronjob.log import capture_library_logs

            capture_library_logs(("django.tasks",))  # Django's own receivers' lines, as JSON
        self._queue: queue.SimpleQueue[tuple[TaskAttempt, str, Errored | None] | None]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def finished(self, run: ClaimedRun, outcome: str, error: Errored | None) -> None:
        attempt = _started.pop(attempt_key(run), None)
        if attempt is None or outcome not in FINISHED:
            return  # not a task's, or no task_started was sent for it
        if self._inline:
            _send(attempt, outcome, error)
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._send, name="jobrunner-task-signals", daemon=True
            )
            self._thread.start()
        self._queue.put((attempt, outcome, error))

    def close(self, timeout: float) -> None:
        """Send what is due, waiting at most `timeout`; attempts whose outcome was never
        written get no task_finished."""
        _started.clear()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    def _send(self) -> None:
        from django.db import close_old_connections

        while (item := self._queue.get()) is not None:
            try:
                _send(*item)
            finally:
                close_old_connections()  # as at the end of a request, receivers' included


def _send(attempt: TaskAttempt, outcome: str, error: Errored | None) -> None:
    try:
        result = finished_result(attempt, outcome, error)
        _tell("task_finished", _send_finished(attempt.task, result, outcome, error))
    except Exception as exc:
        _log_failure("task_finished", "building it", exc)


class TaskFailed(Exception):
    """An attempt's error as the tick recorded it (its traceback's text, redacted and
    clipped as stored), being handled while task_finished is sent."""


def _send_finished(
    task: Any, result: TaskResult, outcome: str, error: Errored | None
) -> list[tuple[Any, Any]]:
    """Send task_finished; for an attempt that failed, while its error is being handled:
    Django's backends send it from inside the task's `except`, and Django's receiver logs
    what is handled then (sys.exc_info()) with its `django.tasks` line. The error is the
    recorded text, never an exception rebuilt from a row's names."""
    signal = _signal("task_finished")
    if error is not None:
        recorded = error.traceback or f"{error.error_type}: {error.message}"
    elif outcome == "lost":
        recorded = TAKEN
    else:
        return signal.send_robust(_sender(task), task_result=result)
    try:
        raise TaskFailed(recorded.rstrip("\n"))
    except TaskFailed:
        return signal.send_robust(_sender(task), task_result=result)


def _signal(name: str) -> Any:
    from django.tasks import signals

    return getattr(signals, name)


def _sender(task: Any) -> type:
    return type(task.get_backend())


def _tell(signal: str, responses: list[tuple[Any, Any]]) -> None:
    """Log the receivers that raised: robust sending handed their errors back."""
    for receiver, response in responses:
        if isinstance(response, Exception):
            _log_failure(signal, _name(receiver), response)


def _log_failure(signal: str, receiver: str, exc: BaseException) -> None:
    from cronjob.log import get_logger

    try:
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
    except Exception:  # a receiver's exception is arbitrary code: its __str__ may raise
        error = f"{type(exc).__name__} (its message could not be read)"
    get_logger().warning(
        "task signal receiver failed; the run's outcome stands",
        signal=signal,
        receiver=receiver,
        error=error,
    )


def _name(receiver: Any) -> str:
    module = getattr(receiver, "__module__", None) or "?"
    return f"{module}.{getattr(receiver, '__qualname__', type(receiver).__qualname__)}"
