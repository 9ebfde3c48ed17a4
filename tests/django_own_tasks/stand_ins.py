"""jobrunner's backend in the places of Django's own test backends, so that Django's
tests of Tasks run on it.

Django's tests/tasks test through its ImmediateBackend (a task runs as it is enqueued)
and its DummyBackend (results kept, nothing run). Each stand-in is JobrunnerBackend
with the capabilities of the backend it replaces: its run is written to job_runs,
committed at once on a connection of its own, as those backends keep their results
whatever transaction the caller is in (and as SimpleTestCase allows no query on
Django's connections); the immediate one then runs it in a tick in this thread.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from django.tasks import TaskResult
from django.tasks.backends.base import BaseTaskBackend

from cronjob.django.backend import JobrunnerBackend
from cronjob.store.binding import ServerBinding


class _OwnConnection:
    """A jobrunner connection of the stand-in's own, to Django's (test) database, in
    autocommit."""

    _conn: Any = None

    def _connection(self) -> Any:
        import psycopg

        from cronjob.django.connection import database_conninfo

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(database_conninfo(), autocommit=True)
        return ServerBinding(self._conn)


class ImmediateJobrunner(_OwnConnection, JobrunnerBackend):
    """JobrunnerBackend as Django's ImmediateBackend: each task runs once, in a tick in
    this thread, as it is enqueued; results are not read again, and there is no
    run_after."""

    supports_defer = False
    supports_get_result = False

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        enqueued = super().enqueue(task, args, kwargs)
        # Django's immediate backend runs the task enqueued, and no other: runs of the same
        # task that other tests' dummy backends left waiting go first.
        self._connection().execute(
            "DELETE FROM job_runs WHERE job_type = %s AND result_id <> %s::uuid"
            " AND status IN ('queued', 'failed')",
            (task.module_path, enqueued.id),
        )
        _tick_once(task)
        return self._result(_row(self._connection(), enqueued.id), enqueued.id, task=task)

    def get_result(self, result_id: Any) -> TaskResult:
        return BaseTaskBackend.get_result(self, result_id)


class DummyJobrunner(_OwnConnection, JobrunnerBackend):
    """JobrunnerBackend as Django's DummyBackend: runs written and never run; `results`
    what was enqueued, `clear()` forgets them, their runs included."""

    supports_defer = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.results: list[TaskResult] = []

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        result = super().enqueue(task, args, kwargs)
        self.results.append(result)
        return copy.deepcopy(result)  # as Django's: what it keeps is not what it gives

    def get_result(self, result_id: Any) -> TaskResult:
        """A result it keeps, as Django's DummyBackend gives them (the tests change one and
        refresh another from it); else its run, read."""
        from django.tasks.exceptions import TaskResultDoesNotExist

        from cronjob.django.backend import _result_id

        kept = [result for result in self.results if result.id == str(result_id)]
        if kept:
            return kept[0]
        try:
            key = _result_id(result_id)
        except TaskResultDoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        row = _row(self._connection(), key)
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(row, key)

    def clear(self) -> None:
        ids = [result.id for result in self.results]
        self.results.clear()
        if ids:
            self._connection().execute(
                "DELETE FROM job_runs WHERE result_id = ANY(%s::uuid[])", (ids,)
            )


def _row(conn: Any, result_id: Any) -> Any:
    from cronjob import store

    return store.task_result_get_by_result_id(conn, result_id)


def _tick_once(task: Any) -> None:
    """A tick running `task`'s runs, each attempted once (Django's immediate backend
    makes one attempt), with Django's signals."""
    from cronjob.db import Database, connect
    from cronjob.django.connection import database_conninfo
    from cronjob.django.runner import task_handler
    from cronjob.observe import observers
    from cronjob.tick import TickOptions, run_tick

    spec = dataclasses.replace(task_handler(task), max_attempts=1)
    options = TickOptions(
        owns_process=False,
        concurrency=1,
        observers=lambda handlers: observers(handlers, django=True),
    )
    conninfo = database_conninfo()
    conn = connect(conninfo)
    try:
        run_tick(conn, {task.module_path: spec}, database=Database(conninfo), options=options)
    finally:
        conn.close()


def install() -> None:
    """Put the stand-ins where Django's tests import its backends from, by the names they
    import (tests/tasks import the classes, and name them in TASKS by path)."""
    from django.tasks.backends import dummy, immediate

    immediate.ImmediateBackend = ImmediateJobrunner
    dummy.DummyBackend = DummyJobrunner
