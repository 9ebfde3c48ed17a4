"""The Django Tasks backend: `Task.enqueue()` writes a run in the caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from cronjob.django.tasks import JobrunnerTask, task_options
from cronjob.errors import BadInput


class JobrunnerBackend(BaseTaskBackend):
    """Django Tasks on jobrunner: the run is a row in job_runs, run by `jobrunner tick`.

    OPTIONS: "DATABASE" (the alias whose connection enqueue writes through, default
    "default"; jobrunner's tables must be in that database) and "SCHEDULES" (periodic
    tasks, applied by `manage.py jobrunner sync`).
    """

    task_class = JobrunnerTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database = str(self.options.get("DATABASE", "default"))

    def check(self, **kwargs: Any) -> list[Any]:
        """System checks: the DATABASE alias exists and is PostgreSQL on psycopg 3."""
        from django.core.checks import Error
        from django.db import connections

        problems = list(super().check(**kwargs))
        where = f"TASKS[{self.alias!r}]"
        if self.database not in connections:
            hint = "Name an alias of settings.DATABASES in OPTIONS['DATABASE']."
            message = f"{where}: DATABASE {self.database!r} is not in settings.DATABASES"
            return [*problems, Error(message, hint=hint, id="jobrunner.E001")]
        connection = connections[self.database]
        if connection.vendor != "postgresql":
            message = f"{where}: jobrunner needs PostgreSQL, not {connection.vendor}"
            return [*problems, Error(message, id="jobrunner.E002")]
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            message = f"{where}: jobrunner needs psycopg 3, and Django is using psycopg2"
            hint = "pip uninstall psycopg2 (pg-jobrunner installs psycopg 3)."
            return [*problems, Error(message, hint=hint, id="jobrunner.E003")]
        return problems

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        try:
            task_options(task)
        except (BadInput, ValueError) as exc:
            raise InvalidTask(f"{task.module_path}: {exc}") from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the run through Django's connection, in whatever transaction it is in."""
        from cronjob.django.discovery import UNKNOWN, known_tasks
        from cronjob.store import runs_insert_many

        self.validate_task(task)
        if task.module_path not in known_tasks().tasks:
            # A tick would never run it: say so now, not by a run that waits for ever.
            raise InvalidTask(f"{task.module_path}: a tick cannot run it: {UNKNOWN}")
        try:
            run = _new_run(task, args, kwargs)
        except BadInput as exc:  # too large, too deep: the arguments, not the task
            raise ValueError(f"{task.name}: {exc}") from None
        conn = self._connection()
        [enqueued] = runs_insert_many(conn, [run])
        row = _enqueued_row(enqueued.id, run, enqueued)
        result = self._result(row, enqueued.id, task=task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _connection(self) -> Any:
        """The connection enqueue writes through: Django's, in whatever transaction it is in."""
        from cronjob.django.connection import django_connection

        return django_connection(self.database)

    def get_result(self, result_id: Any) -> TaskResult:
        """The result whose id is `result_id`: the unguessable id enqueue gave the run, never
        its run id (which anyone can count through)."""
        from cronjob import store
        from cronjob.django.connection import django_connection

        key = _result_id(result_id)
        row = store.task_result_get_by_result_id(django_connection(self.database), key)
        return self._result(row, key)

    def _result(self, row: Any, looked_up_by: Any, task: Task | None = None) -> TaskResult:
        """The run `row` as a TaskResult, of `task` if given; TaskResultDoesNotExist naming the
        id it was `looked_up_by` if there is no row."""
        from cronjob.django.results import task_result

        if row is None:
            raise TaskResultDoesNotExist(f"no task result {str(looked_up_by)!r}")
        return task_result(row, self.alias, task=task)


def importable_task(path: str) -> Any:
    """The task at import path `path`, if it is a task of this backend; else ValueError
    saying why not. Imports it: only for paths the project's own settings name."""
    from django.utils.module_loading import import_string

    try:
        found = import_string(path)
    except Exception as exc:
        raise ValueError(f"cannot import it: {type(exc).__name__}: {str(exc)[:300]}") from None
    return _jobrunner_task(found)


def known_task(job_type: str, tasks: Mapping[str, Any]) -> Any:
    """The task of `tasks` (discovery.known_tasks) a run's job type names, if it is a task
    of this backend; else ValueError saying why not. Looks it up, never imports it."""
    from cronjob.django.discovery import UNKNOWN

    if job_type not in tasks:
        raise ValueError(UNKNOWN)
    return _jobrunner_task(tasks[job_type])


def _jobrunner_task(found: Any) -> Any:
    if not isinstance(found, Task):
        raise ValueError("it is not a Django task (a function decorated with @task)")
    if not isinstance(found.get_backend(), JobrunnerBackend):
        raise ValueError(f"its backend {found.backend!r} is not jobrunner's")
    return found


def _new_run(task: Task, args: Any, kwargs: Any) -> Any:
    """The run of `task`: Django's own fields as jobrunner's options, and each option of a
    run (cronjob.run_options) that the task itself sets by that name (JobrunnerTask's)."""
    from django.conf import settings
    from django.utils import timezone
    from django.utils.json import normalize_json

    from cronjob import tracecontext
    from cronjob.run_options import RUN_OPTIONS, checked_run

    run_after = task.run_after
    if run_after is not None and not settings.USE_TZ and timezone.is_naive(run_after):
        run_after = timezone.make_aware(run_after, timezone.get_default_timezone())
    try:
        payload = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
    except TypeError as exc:
        raise TypeError(f"{task.name}: arguments must be JSON: {exc}") from None
    options = {name: getattr(task, name, None) for name in RUN_OPTIONS}
    options.update(tracecontext.current())
    options.update(
        run_at=run_after,
        run_after=run_after,
        # Django runs larger priorities first; jobrunner claims smaller numbers first.
        priority=-task.priority,
        queue=task.queue_name,
        # Unguessable, unlike the run id: whoever may look a result up by its id learns
        # nothing of other tasks' results.
        result_id=uuid.uuid4(),
    )
    return checked_run(task.module_path, payload, options)


def _enqueued_row(run_id: int, run: Any, enqueued: Any) -> dict[str, Any]:
    """The run that `run` was just enqueued as, as get_result reads it, from what the enqueue
    wrote and what it learnt (`enqueued`, store.Enqueued): the run's enqueue time, and when a
    run holding the task's unique key was found instead, that run's result id. Nothing of the
    row is read, which a login that may enqueue and no more (deploy/roles.sql) may not. Such
    a run is shown waiting, with the arguments given: `get_result` reads what it is now."""
    return {
        "id": run_id,
        "result_id": enqueued.result_id,
        "job_type": run.job_type,
        "payload": run.payload_json,
        "status": "queued",
        "priority": run.options.get("priority", 0),
        "queue": run.options.get("queue"),
        "created_at": enqueued.enqueued_at,
        "started_at": None,
        "finished_at": None,
        "locked_by": None,
        "finished_by": None,
        "return_value": None,
        "attempts": [],
    }


def _result_id(result_id: Any) -> uuid.UUID:
    text = str(result_id)
    try:
        return uuid.UUID(text)
    except ValueError:
        message = f"no task result {text[:40]!r}: result ids are UUIDs"
        raise TaskResultDoesNotExist(message) from None
