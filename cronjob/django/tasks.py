"""A jobrunner task: Django's Task with jobrunner's per-task options, and those options
checked.

The backend checks them when a task is enqueued, the runner when it makes the task a
handler; neither is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.tasks import Task

from cronjob.handlers import handler_options, is_coroutine_function


@dataclass(frozen=True, slots=True, kw_only=True)
class JobrunnerTask(Task):
    """A Django Task with jobrunner's per-task options, given to `@task(...)`.

    `max_attempts`, `backoff` (a duration, or a (base, cap) pair), `lease` and `timeout`
    default to jobrunner's; `atomic=True` runs the task inside a transaction on Django's
    connection in which the run's success is recorded too: its ORM writes and
    "succeeded" commit together or not at all; `capture_logs=False` keeps what the task
    logs out of its run's record (cronjob.runlog).

    Per enqueue, `using(unique_key=..., replace=True)` adds what `enqueue --unique-key`
    and `--replace` do: while a run of the task holding that key has not finished,
    enqueueing again gives that run's result (and with `replace`, its new arguments and
    run_after, if it has not started) instead of a new run.
    """

    max_attempts: int | None = None
    backoff: Any = None
    lease: Any = None
    timeout: Any = None
    atomic: bool = False
    capture_logs: bool | None = None
    unique_key: str | None = None
    replace: bool | None = None

    def using(
        self, *, unique_key: str | None = None, replace: bool | None = None, **changes: Any
    ) -> JobrunnerTask:
        """Django's `using`, and jobrunner's per-enqueue `unique_key` and `replace`."""
        # Task's own, named: a slots dataclass's methods have no zero-argument super().
        task = Task.using(self, **changes)
        keys = {"unique_key": unique_key, "replace": replace}
        return _replaced(task, {k: v for k, v in keys.items() if v is not None})


def _replaced(task: JobrunnerTask, changes: dict[str, Any]) -> JobrunnerTask:
    return replace(task, **changes) if changes else task


def task(
    function: Any = None,
    *,
    priority: int = 0,
    queue_name: str = "default",
    backend: str = "default",
    takes_context: bool = False,
    max_attempts: int | None = None,
    backoff: Any = None,
    lease: Any = None,
    timeout: Any = None,
    atomic: bool = False,
    capture_logs: bool | None = None,
) -> Any:
    """Django's `@task`, with jobrunner's per-task options (see JobrunnerTask).

    On Django 6.1 and later `django.tasks.task` takes the same options; this one works
    from 6.0 on.
    """

    def wrapper(func: Any) -> JobrunnerTask:
        return JobrunnerTask(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            max_attempts=max_attempts,
            backoff=backoff,
            lease=lease,
            timeout=timeout,
            atomic=atomic,
            capture_logs=capture_logs,
        )

    return wrapper(function) if function is not None else wrapper


def task_options(task: Any) -> dict[str, Any]:
    """The task's own retry options, checked as @handler checks them (unset ones left out)."""
    if getattr(task, "atomic", False) and is_coroutine_function(task.func):
        raise ValueError("atomic=True needs a plain def task: Django's ORM transactions are sync")
    return handler_options(
        max_attempts=getattr(task, "max_attempts", None),
        backoff=getattr(task, "backoff", None),
        lease=getattr(task, "lease", None),
        timeout=getattr(task, "timeout", None),
        capture_logs=getattr(task, "capture_logs", None),
    )
