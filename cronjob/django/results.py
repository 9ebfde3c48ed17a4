"""A run as Django's TaskResult: status, times, arguments, errors, workers, return value."""

from __future__ import annotations

import builtins
import json
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

# A run waiting for a retry is, to Django, ready to run again.
STATUSES = {
    "queued": TaskResultStatus.READY,
    "failed": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def task_of(job_type: str) -> Task:
    """The Task a run's job type names (its module path); TaskResultDoesNotExist if none."""
    try:
        found = import_string(job_type)
    except Exception:
        found = None
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"run's job type {job_type[:200]!r} is not a Django task")
    return found


def task_result(row: dict[str, Any], backend_alias: str) -> TaskResult:
    attempts = row["attempts"]
    if isinstance(attempts, str):
        attempts = json.loads(attempts)
    payload = json.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
    if not isinstance(payload, dict):
        payload = {}
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    task = task_of(row["job_type"])
    # Django runs larger priorities first; jobrunner claims smaller numbers first.
    priority = max(-100, min(100, -row["priority"]))
    if priority != task.priority or (row["queue"] and row["queue"] != task.queue_name):
        task = task.using(priority=priority, queue_name=row["queue"] or task.queue_name)
    starts = [_time(a["started_at"]) for a in attempts if a.get("started_at")]
    result = TaskResult(
        task=task,
        id=str(row["id"]),
        status=STATUSES.get(row["status"], TaskResultStatus.FAILED),
        enqueued_at=row["created_at"],
        started_at=min([*starts, row["started_at"]], default=None)
        if row["started_at"]
        else (min(starts) if starts else None),
        finished_at=row["finished_at"],
        last_attempted_at=row["started_at"] or (max(starts) if starts else None),
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=backend_alias,
        errors=[_error(a) for a in attempts],
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


def _error(attempt: dict[str, Any]) -> TaskError:
    name = attempt.get("error_type") or "Exception"
    # jobrunner stores builtins, and its own Retry and Fail, by bare name.
    if "." in name:
        path = name
    elif name in ("Retry", "Fail"):
        path = f"cronjob.handlers.{name}"
    elif isinstance(getattr(builtins, name, None), type):
        path = f"builtins.{name}"
    else:
        path = name
    return TaskError(
        exception_class_path=path,
        traceback=attempt.get("traceback") or attempt.get("message") or "",
    )


def _time(value: Any) -> Any:
    return parse_datetime(value) if isinstance(value, str) else value
