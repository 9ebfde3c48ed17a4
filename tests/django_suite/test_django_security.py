"""What a login that may only enqueue, or a caller who looks results up by id, cannot make
the Django backend do: import a module a row names, stop a tick, or read other results."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.tasks import default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test import override_settings

from tests.django_suite.test_django_tasks import manage, rows, tick
from tests.factories import insert_run

TASK_PAYLOAD = {"args": [], "kwargs": {}}


def _insert(db_url: str, job_type: str, **columns: Any) -> int:
    """A row as a login that may only enqueue can write one, by SQL."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        return insert_run(conn, job_type, payload=TASK_PAYLOAD, **columns)


def test_a_waiting_run_cannot_make_a_tick_import_a_module_it_names(
    project: str, tmp_path: Path
) -> None:
    from shop.tasks import add

    marker = tmp_path / "wiped"
    real = add.enqueue(1, 2)
    _insert(project, "wipe_cache.x", queue="default")
    done = manage(project, "tick", env={"JOBRUNNER_TEST_WIPE_MARKER": str(marker)})
    assert done.returncode == 0, done.stderr
    assert not marker.exists()  # wipe_cache.py, in the project's directory, never ran
    assert add.get_result(real.id).return_value == 3
    assert "task not run" in done.stderr and "wipe_cache.x" in done.stderr
    assert rows(project, "SELECT status FROM job_runs WHERE job_type = 'wipe_cache.x'") == [
        ("queued",)
    ]


def test_a_schedule_cannot_make_a_tick_import_a_module_it_names(
    project: str, tmp_path: Path
) -> None:
    from shop.tasks import add

    marker = tmp_path / "wiped"
    real = add.enqueue(1, 2)
    with psycopg.connect(project, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job_definitions (name, job_type, schedule, enabled)"
            " VALUES ('wipe', 'wipe_cache.x', '0 3 * * *', false)"
        )
    done = manage(project, "tick", env={"JOBRUNNER_TEST_WIPE_MARKER": str(marker)})
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert add.get_result(real.id).return_value == 3


def test_a_run_whose_type_would_exit_at_import_does_not_stop_the_tick(project: str) -> None:
    from shop.tasks import add

    real = add.enqueue(1, 2)
    _insert(project, "unittest.__main__.x", queue="default")
    done = manage(project, "tick", "--json")
    assert done.returncode == 0, done.stderr
    assert add.get_result(real.id).return_value == 3
    assert "unittest.__main__.x" in done.stderr  # logged: task not run, and why


def test_get_result_of_a_run_whose_type_is_no_known_task_does_not_exist(project: str) -> None:
    result_id = uuid.uuid4()
    _insert(project, "unittest.__main__.x", queue="default", result_id=result_id)
    with pytest.raises(TaskResultDoesNotExist, match=r"'unittest\.__main__\.x' is unknown"):
        default_task_backend.get_result(str(result_id))


def test_an_installed_apps_tasks_module_that_exits_at_import_does_not_stop_the_tick(
    project: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.conf import settings
    from shop.tasks import add

    real = add.enqueue(1, 2)
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "broken"]):
        report = tick(project)
    assert report.summary()["succeeded"] == 1
    assert add.get_result(real.id).return_value == 3
    logged = capsys.readouterr().err
    assert "tasks module not imported" in logged and "broken.tasks" in logged


def test_a_task_outside_the_tasks_modules_and_the_schedules_is_refused_at_enqueue(
    project: str,
) -> None:
    from shop.reports import weekly  # not in shop/tasks.py, and no schedule of the settings

    with pytest.raises(InvalidTask, match="a tick cannot run it"):
        weekly.enqueue("monday")
    assert rows(project, "SELECT count(*) FROM job_runs") == [(0,)]


def test_a_task_the_settings_schedules_name_runs_wherever_it_is_defined(project: str) -> None:
    from django.conf import settings
    from shop.models import Entry
    from shop.reports import weekly

    tasks = {
        "default": {
            **settings.TASKS["default"],
            "OPTIONS": {
                "SCHEDULES": {
                    "weekly": {"task": "shop.reports.weekly", "cron": "0 3 * * mon"},
                }
            },
        }
    }
    with override_settings(TASKS=tasks):
        result = weekly.enqueue("monday")
        tick(project)
        assert weekly.get_result(result.id).return_value is None
    assert list(Entry.objects.values_list("label", flat=True)) == ["monday"]


def test_a_result_id_is_a_random_uuid_and_the_run_id_finds_nothing(project: str) -> None:
    from shop.tasks import add

    first, second = add.enqueue(1, 2), add.enqueue(3, 4)
    ids = [uuid.UUID(first.id), uuid.UUID(second.id)]
    assert [i.version for i in ids] == [4, 4] and ids[0] != ids[1]
    assert abs(ids[0].int - ids[1].int) > 2**64  # not one after the other
    [(run_id,)] = rows(project, "SELECT id FROM job_runs WHERE result_id = %s", first.id)
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(str(run_id))
    assert add.get_result(first.id).args == [1, 2]
    assert add.get_result(first.id.upper()).id == first.id  # any spelling of the UUID


def test_a_running_task_sees_its_own_result_id(project: str) -> None:
    from shop.tasks import own_result_id, own_result_id_async

    plain, asynchronous = own_result_id.enqueue(), own_result_id_async.enqueue()
    tick(project)
    assert own_result_id.get_result(plain.id).return_value == plain.id
    assert own_result_id_async.get_result(asynchronous.id).return_value == asynchronous.id


def test_a_task_run_without_a_result_id_still_runs(project: str) -> None:
    """As a run enqueued before result ids were: no id reaches its result."""
    _insert(project, "shop.tasks.own_result_id", queue="default")
    tick(project)
    assert rows(project, "SELECT status, return_value FROM job_runs") == [("succeeded", None)]
