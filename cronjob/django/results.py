"""A run as Django's TaskResult: status, times, arguments, errors, workers, return value."""

from __future__ import annotations

import builtins
import contextlib
import json
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils.dateparse import parse_datetime

# A run waiting for a retry is, to Django, ready to run again.
STATUSES = {
    "queued": TaskResultStatus.READY,
    "failed": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


# What jobrunner records for an attempt that did not raise in the task itself, as the
# exception classes TaskError.exception_class can import.
OWN_ERRORS = {
    "Retry": "cronjob.handlers.Retry",
    "Fail": "cronjob.handlers.Fail",
    "timeout": "builtins.TimeoutError",
    "lease_expired": "cronjob.context.LeaseLost",
    "UnreadablePayload": "builtins.ValueError",
}


def task_of(job_type: str) -> Task:
    """The task a run's job type names, among those the project defines (looked up, never
    imported: the job type is a row's text); TaskResultDoesNotExist if none."""
    from cronjob.django.discovery import UNKNOWN, known_tasks

    found = known_tasks().tasks.get(job_type)
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"the run's job type {job_type[:200]!r} is unknown: {UNKNOWN}")
    return found


def task_result(row: dict[str, Any], backend_alias: str, task: Task | None = None) -> TaskResult:
    """The run `row` (queries.tasks.TASK_RESULT_GET) as Django's TaskResult; `task`, the run's
    task when the caller has it, else the one its job type names (`task_of`)."""
    attempts = row["attempts"]
    if isinstance(attempts, str):
        attempts = json.loads(attempts)
    payload = json.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
    if not isinstance(payload, dict):
        payload = {}
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if task is None:
        task = task_of(row["job_type"])
    # Django runs larger priorities first; jobrunner claims smaller numbers first.
    priority = max(-100, min(100, -row["priority"]))
    run_after = _time(row.get("run_after"))
    queue = row["queue"] or task.queue_name
    if (priority, queue, run_after) != (task.priority, task.queue_name, task.run_after):
        # The task as it was enqueued (`task.using(...)`). A queue since dropped from
        # QUEUES, or a priority set by hand beyond Django's range, still reads: the task
        # as declared stands in.
        with contextlib.suppress(InvalidTask):
            task = task.using(priority=priority, queue_name=queue, run_after=run_after)
    starts = [_time(a["started_at"]) for a in attempts if a.get("started_at")]
    started = _time(row["started_at"])
    result = TaskResult(
        task=task,
        # None for a run enqueued before result ids were (migration 0015): it has none.
        id=str(row["result_id"]) if row["result_id"] is not None else None,
        status=STATUSES.get(row["status"], TaskResultStatus.FAILED),
        enqueued_at=_time(row["created_at"]),
        started_at=min([*starts, *([started] if started else [])], default=None),
        finished_at=_time(row["finished_at"]),
        last_attempted_at=started or max(starts, default=None),
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=backend_alias,
        errors=[task_error(a) for a in attempts],
        worker_ids=_workers(row, attempts),
    )
    if row["return_value"] is not None:
        object.__setattr__(result, "_return_value", json.loads(row["return_value"]))
    return result


def _workers(row: dict[str, Any], attempts: list[dict[str, Any]]) -> list[str]:
    """One worker per attempt: the failed ones' from the history, then the last one's."""
    workers = [a.get("worker") or "" for a in attempts]
    if row["status"] == "running" and row["locked_by"]:
        workers.append(row["locked_by"])
    elif row["status"] == "succeeded" and row["finished_by"]:
        workers.append(row["finished_by"])
    return workers


def task_error(attempt: dict[str, Any]) -> TaskError:
    """An attempt's error as Django's TaskError: the class path it can import, and the
    traceback (or, without one, the message)."""
    name = attempt.get("error_type") or "Exception"
    if "." in name:
        path = name
    elif name in OWN_ERRORS:
        path = OWN_ERRORS[name]
    elif isinstance(getattr(builtins, name, None), type):
        path = f"builtins.{name}"  # stored by bare name, as Python prints builtins
    else:
        path = "builtins.Exception"  # a name written by someone else's SQL
    return TaskError(
        exception_class_path=path,
        traceback=attempt.get("traceback") or attempt.get("message") or "",
    )


def _time(value: Any) -> Any:
    """A time of the row or (JSON text) of an attempt, as Django shows times: naive in
    TIME_ZONE when USE_TZ is off."""
    from django.conf import settings
    from django.utils import timezone

    moment = parse_datetime(value) if isinstance(value, str) else value
    if moment is not None and not settings.USE_TZ and timezone.is_aware(moment):
        moment = timezone.make_naive(moment, timezone.get_default_timezone())
    return moment
