"""A tick sends Django's task signals as Django's own backends do, and its results read as
Django's: task_started, then task_finished with the status the tick committed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.tasks import TaskResultStatus

from tests.django_suite.test_django_tasks import db_now, manage, tick


@pytest.fixture
def signalled() -> Iterator[list[tuple[str, Any, Any, Any]]]:
    """What task_started and task_finished were sent, in order, each with the status
    get_result() read for that result at that moment (the committed one)."""
    from django.tasks.signals import task_finished, task_started

    sent: list[tuple[str, Any, Any, Any]] = []

    def read(task_result: Any) -> Any:
        return task_result.task.get_backend().get_result(task_result.id).status

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("started", sender, task_result, read(task_result)))

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("finished", sender, task_result, read(task_result)))

    task_started.connect(started, weak=False)
    task_finished.connect(finished, weak=False)
    yield sent
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def test_receivers_see_started_then_finished_with_the_committed_status(project, signalled):
    from shop.tasks import add

    from cronjob.django import JobrunnerBackend

    result = add.enqueue(2, 3)
    tick(project)
    assert [(name, sender, r.id, r.status, read) for name, sender, r, read in signalled] == [
        ("started", JobrunnerBackend, result.id, "RUNNING", "RUNNING"),
        ("finished", JobrunnerBackend, result.id, "SUCCESSFUL", "SUCCESSFUL"),
    ]
    started, finished = signalled[0][2], signalled[1][2]
    assert started.args == [2, 3] and started.worker_ids and started.finished_at is None
    assert finished.return_value == 5 and finished.finished_at is not None


def test_a_failed_attempt_finishes_ready_for_its_retry_and_the_last_one_failed(project, signalled):
    from shop.tasks import explode

    result = explode.enqueue("boom")
    tick(project)
    tick(project, now=db_now(project) + timedelta(hours=1))
    assert [(name, r.status, read) for name, _, r, read in signalled] == [
        ("started", "RUNNING", "RUNNING"),
        ("finished", "READY", "READY"),  # a retry is due
        ("started", "RUNNING", "RUNNING"),
        ("finished", "FAILED", "FAILED"),
    ]
    last = signalled[-1][2]
    assert last.id == result.id
    assert [e.exception_class for e in last.errors] == [ValueError]
    assert "boom" in last.errors[0].traceback


def test_an_async_task_sends_both_signals_too(project, signalled):
    from shop.tasks import add_async

    add_async.enqueue(4, 5)
    tick(project)
    assert [(name, r.status) for name, _, r, _ in signalled] == [
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]
    assert signalled[1][2].return_value == 9


def test_a_task_given_up_at_its_timeout_finishes_failed_as_the_tick_records_it(project, signalled):
    from shop.tasks import too_slow

    result = too_slow.enqueue()
    tick(project)
    assert [(name, r.status, read) for name, _, r, read in signalled] == [
        ("started", "RUNNING", "RUNNING"),
        ("finished", "FAILED", "FAILED"),
    ]
    assert signalled[1][2].errors[0].exception_class is TimeoutError
    assert too_slow.get_result(result.id).status == TaskResultStatus.FAILED


def test_a_takes_context_task_is_started_with_the_result_its_context_holds(project, signalled):
    from shop.tasks import own_result_id

    result = own_result_id.enqueue()
    tick(project)
    assert signalled[0][2].id == result.id
    assert own_result_id.get_result(result.id).return_value == result.id


def test_djangos_task_log_lines_are_json_on_the_ticks_stderr(project):
    from shop.tasks import add, give_up

    ok, failed = add.enqueue(1, 1), give_up.enqueue("no")
    done = manage(project, "tick")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    tasks = [line for line in lines if line.get("logger") == "django.tasks"]
    states = sorted((line["event"].split()[1], line["event"].split()[-1]) for line in tasks)
    assert states == sorted(
        [
            (f"id={ok.id}", "state=RUNNING"),
            (f"id={ok.id}", "state=SUCCESSFUL"),
            (f"id={failed.id}", "state=RUNNING"),
            (f"id={failed.id}", "state=FAILED"),
        ]
    )
    levels = {line["event"].split()[-1]: line["level"] for line in tasks}
    assert levels == {"state=RUNNING": "info", "state=SUCCESSFUL": "info", "state=FAILED": "error"}


def test_a_return_value_that_cannot_be_stored_fails_with_its_real_exception(project):
    from shop.tasks import unstorable

    result = unstorable.enqueue()
    tick(project)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED  # at once: the same value comes back
    assert result.attempts == 1
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback


def test_a_results_task_carries_what_it_was_enqueued_with(project):
    from shop.tasks import add

    later = db_now(project) + timedelta(hours=1)
    result = add.using(run_after=later, priority=7, queue_name="reports").enqueue(1, 2)
    read = add.get_result(result.id)
    assert read.task == result.task
    assert (read.task.run_after, read.task.priority, read.task.queue_name) == (
        later,
        7,
        "reports",
    )
    assert read == result


def test_queues_hold_across_two_ticks_in_one_process(project):
    from django.core.management import call_command
    from shop.tasks import add, weekly_report

    first, report = add.enqueue(1, 2), weekly_report.enqueue(1)
    call_command("jobrunner", "tick", "--queues", "default")
    second = add.enqueue(3, 4)
    call_command("jobrunner", "tick", "--queues", "reports")
    assert add.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    assert weekly_report.get_result(report.id).status == TaskResultStatus.SUCCESSFUL
    assert add.get_result(second.id).status == TaskResultStatus.READY  # not in "reports"


def test_djangos_line_for_a_failed_task_carries_its_error(project):
    from shop.tasks import give_up

    failed = give_up.enqueue("out of stock")
    done = manage(project, "tick")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    [line] = [
        line
        for line in lines
        if line.get("logger") == "django.tasks" and line["event"].endswith("state=FAILED")
    ]
    assert f"id={failed.id}" in line["event"]
    # As Django's own backends log it: with the task's traceback, from the run's record.
    assert "ValueError: out of stock" in json.dumps(line)
