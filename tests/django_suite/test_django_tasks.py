"""jobrunner as a Django project's Tasks backend, against the real test project."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from tests.django_suite.conftest import PROJECT, project_env

HOUR = timedelta(hours=1)


def tick(db_url: str, *, now: datetime | None = None, queues: list[str] | None = None) -> Any:
    """One tick in this process, as `manage.py jobrunner tick` runs it, at `now`."""
    from cronjob.db import connect
    from cronjob.django.runner import task_handlers
    from cronjob.handlers import registry
    from cronjob.observe import observers
    from tests import factories

    conn = connect(db_url)
    try:
        tasks = task_handlers(conn, queues)
        return factories.tick(
            db_url,
            *registry(),
            handlers=tasks,
            conn=conn,
            now=now,
            concurrency=1,
            observers=lambda handlers: observers(handlers, django=True),
        )
    finally:
        conn.close()


def db_now(db_url: str) -> datetime:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def rows(db_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params).fetchall()


def manage(
    db_url: str, *args: str, env: dict[str, str] | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "jobrunner", *args],
        cwd=PROJECT,
        env={**project_env(db_url), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_enqueue_joins_the_callers_transaction(project: str) -> None:
    from shop.tasks import add

    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 2)
        raise RuntimeError("the view failed")
    assert rows(project, "SELECT count(*) FROM job_runs") == [(0,)]
    with transaction.atomic():
        result = add.enqueue(1, 2)
    assert rows(project, "SELECT result_id::text, job_type, queue FROM job_runs") == [
        (result.id, "shop.tasks.add", "default")
    ]
    assert result.status == TaskResultStatus.READY
    assert result.args == [1, 2] and result.enqueued_at is not None


def test_a_task_runs_in_a_tick_and_its_return_value_reads_back(project: str) -> None:
    from shop.tasks import add, add_async, attempt_number

    result = add.enqueue(2, 3)
    other = add_async.enqueue(4, 5)
    counted = attempt_number.enqueue()
    tick(project)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.started_at is not None and result.finished_at >= result.started_at
    assert len(result.worker_ids) == 1 and result.worker_ids[0]
    assert add_async.get_result(other.id).return_value == 9
    assert attempt_number.get_result(counted.id).return_value == 1


def test_manage_py_jobrunner_tick_runs_tasks_without_handlers(project: str) -> None:
    from shop.tasks import add

    result = add.enqueue(20, 22)
    done = manage(project, "tick", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["succeeded"] == 1
    assert add.get_result(result.id).return_value == 42


def test_a_listening_tick_runs_a_task_enqueued_after_it_started_at_once(project: str) -> None:
    from shop.tasks import add

    listening = subprocess.Popen(
        [sys.executable, "manage.py", "jobrunner", "tick", "--listen", "--max-runtime", "60s"],
        cwd=PROJECT,
        env=project_env(project),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Asleep: it holds the sleeping tick's advisory lock (migration 0027). No run of any
        # task waited when it started: it runs every task of the project all the same.
        asleep = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = 29958816149106292"
        )
        until = time.monotonic() + 30
        while rows(project, asleep) != [(1,)] and time.monotonic() < until:
            assert listening.poll() is None, listening.communicate()
            time.sleep(0.02)
        result = add.enqueue(40, 2)
        enqueued = time.monotonic()
        while time.monotonic() < enqueued + 20:
            result.refresh()
            if result.status == TaskResultStatus.SUCCESSFUL:
                break
            time.sleep(0.02)
        assert result.return_value == 42
        assert (result.started_at - result.enqueued_at).total_seconds() < 2
    finally:
        listening.send_signal(signal.SIGTERM)
        listening.communicate(timeout=60)


def test_plain_jobrunner_tick_sets_django_up_from_its_settings_module(project: str) -> None:
    from shop.tasks import add

    result = add.enqueue(1, 1)
    jobrunner = Path(sys.executable).parent / "jobrunner"
    done = subprocess.run(
        [str(jobrunner), "tick"],
        env=project_env(project),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert add.get_result(result.id).return_value == 2


def test_a_failing_tasks_errors_come_from_its_attempts(project: str) -> None:
    from shop.tasks import explode

    result = explode.enqueue("boom")
    # At a fixed now: its retry, due up to a second later (backoff with full jitter), waits
    # for the next tick however long this one takes to end.
    now = db_now(project)
    tick(project, now=now)
    result.refresh()
    assert result.status == TaskResultStatus.READY  # waiting for its retry
    tick(project, now=now + HOUR)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    assert result.errors[0].exception_class is ValueError
    assert "boom" in result.errors[-1].traceback
    assert len(result.worker_ids) == 2
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_a_deferred_task_waits_for_its_time(project: str) -> None:
    from shop.tasks import add

    later = db_now(project) + HOUR
    result = add.using(run_after=later).enqueue(1, 2)
    tick(project)
    assert add.get_result(result.id).status == TaskResultStatus.READY
    tick(project, now=later + timedelta(seconds=1))
    assert add.get_result(result.id).return_value == 3


def test_larger_django_priorities_run_first(project: str) -> None:
    from shop.models import Entry
    from shop.tasks import record

    record.using(priority=-10).enqueue("low")
    record.enqueue("middle")
    record.using(priority=50).enqueue("high")
    tick(project)
    assert list(Entry.objects.order_by("id").values_list("label", flat=True)) == [
        "high",
        "middle",
        "low",
    ]


def test_queues_select_what_a_tick_runs(project: str) -> None:
    from shop.tasks import add, attempt_number

    elsewhere = attempt_number.enqueue()
    report = add.using(queue_name="reports").enqueue(2, 2)
    with pytest.raises(InvalidTask):
        add.using(queue_name="nowhere").enqueue(3, 3)
    done = manage(project, "tick", "--queues", "reports")
    assert done.returncode == 0, done.stderr
    assert add.get_result(report.id).status == TaskResultStatus.SUCCESSFUL
    # A task with runs only in another queue is left for a tick of that queue.
    assert attempt_number.get_result(elsewhere.id).status == TaskResultStatus.READY
    assert manage(project, "tick", "--queues", "default").returncode == 0
    assert attempt_number.get_result(elsewhere.id).status == TaskResultStatus.SUCCESSFUL


def test_orm_writes_commit_with_success_and_roll_back_with_failure(project: str) -> None:
    from shop.models import Order
    from shop.tasks import place_order

    good = place_order.enqueue("A-1")
    bad = place_order.enqueue("B-1", fail=True)
    tick(project)
    assert list(Order.objects.values_list("ref", flat=True)) == ["A-1"]
    assert place_order.get_result(good.id).return_value == "A-1"
    failed = place_order.get_result(bad.id)
    assert failed.status == TaskResultStatus.READY
    assert failed.errors[0].exception_class_path == "builtins.RuntimeError"


def test_an_atomic_handler_commits_its_orm_writes_with_its_success(project: str) -> None:
    from shop.models import Order

    from cronjob.api import enqueue

    with psycopg.connect(project, autocommit=True) as conn:
        enqueue(conn, "shop.import_order", {"ref": "ok"})
        failing = enqueue(conn, "shop.import_order", {"ref": "bad", "fail": True})
    tick(project)
    assert list(Order.objects.values_list("ref", flat=True)) == ["ok"]
    assert rows(project, "SELECT status FROM job_runs WHERE id = %s", failing) == [("failed",)]
    assert rows(project, "SELECT key FROM job_effects") == [("import:ok",)]


def test_kill_9_between_the_orm_write_and_commit_leaves_neither(
    project: str, tmp_path: Path
) -> None:
    from shop.models import Order
    from shop.tasks import place_order_slowly

    marker = tmp_path / "written"
    result = place_order_slowly.enqueue("K-1", str(marker))
    process = subprocess.Popen(
        [sys.executable, "manage.py", "jobrunner", "tick"],
        cwd=PROJECT,
        env=project_env(project),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert Order.objects.count() == 0
    assert place_order_slowly.get_result(result.id).status == TaskResultStatus.RUNNING
    # Past the lease, the run is rescued and its second attempt commits both, once.
    tick(project, now=db_now(project) + timedelta(minutes=1))
    tick(project, now=db_now(project) + HOUR)
    assert list(Order.objects.values_list("ref", flat=True)) == ["K-1"]
    final = place_order_slowly.get_result(result.id)
    assert final.status == TaskResultStatus.SUCCESSFUL and final.return_value == "K-1"


def test_a_schedule_from_settings_materializes_once_under_concurrent_ticks(
    project: str,
) -> None:
    from shop.models import Entry

    synced = manage(project, "sync")
    assert synced.returncode == 0, synced.stderr
    assert "add       new-year-tally" in synced.stdout
    # As if synced two years ago: two new years are due.
    with psycopg.connect(project, autocommit=True) as conn:
        conn.execute(
            "UPDATE job_definitions SET materialized_through = now() - interval '2 years',"
            " next_fire_at = date_trunc('year', now() - interval '1 year')"
        )
    command = [sys.executable, "manage.py", "jobrunner", "tick"]
    ticks = [
        subprocess.Popen(
            command,
            cwd=PROJECT,
            env=project_env(project),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for process in ticks:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    occurrences = rows(
        project, "SELECT scheduled_for, count(*) FROM job_runs GROUP BY 1 ORDER BY 1"
    )
    assert len(occurrences) == 2 and all(n == 1 for _, n in occurrences)
    assert list(Entry.objects.values_list("label", flat=True)) == ["new year", "new year"]
    again = manage(project, "sync")
    assert "unchanged new-year-tally" in again.stdout


def test_bad_inputs_are_refused(project: str) -> None:
    from shop.tasks import add, add_async, huge

    from cronjob.django import task as jobrunner_task

    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("12abc")
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("9" * 400)
    with pytest.raises(InvalidTask, match="max_attempts"):
        jobrunner_task(max_attempts=0)(add.func)
    with pytest.raises(InvalidTask, match="atomic"):
        jobrunner_task(atomic=True)(add_async.func)
    too_big = huge.enqueue()
    tick(project)
    result = huge.get_result(too_big.id)
    assert result.status == TaskResultStatus.FAILED  # dead at once: retrying cannot help
    assert "too large" in result.errors[0].traceback


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "invalid max_attempts 0: expected an integer from 1 to 1000"),
        ({"max_attempts": 1001}, "invalid max_attempts 1001: expected an integer from 1 to 1000"),
        ({"lease": "500ms"}, "invalid lease '500ms': must be at least 1s"),
        ({"timeout": "soon"}, "invalid timeout 'soon': expected a number with an optional unit"),
    ],
)
def test_a_task_and_a_handler_refuse_the_same_options_alike(
    options: dict[str, Any], message: str, fresh_registry: dict[str, Any]
) -> None:
    from shop.tasks import add

    from cronjob import handler
    from cronjob.django import task as jobrunner_task
    from cronjob.errors import BadInput

    with pytest.raises(InvalidTask) as task_refused:
        jobrunner_task(**options)(add.func)
    with pytest.raises(BadInput) as handler_refused:
        handler("shop.refused", **options)
    assert str(task_refused.value).startswith(f"shop.tasks.add: {message}")
    assert str(handler_refused.value).startswith(f"handler 'shop.refused': {message}")


def test_a_task_and_a_handler_take_the_same_most_attempts(
    project: str, fresh_registry: dict[str, Any]
) -> None:
    from shop.tasks import add

    from cronjob import handler
    from cronjob.django import task as jobrunner_task

    handler("shop.patient", max_attempts=1000)(add.func)
    result = jobrunner_task(max_attempts=1000)(add.func).enqueue(1, 2)
    assert fresh_registry["shop.patient"].max_attempts == 1000
    assert rows(project, "SELECT max_attempts FROM job_runs WHERE result_id = %s", result.id) == [
        (1000,)
    ]


def test_the_database_comes_from_django_settings_and_its_password_stays_hidden(
    project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connections

    from cronjob.location import resolve_url
    from cronjob.text import redact

    url, source = resolve_url(None)
    assert source == "Django settings"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('job_runs') IS NOT NULL").fetchone() == (True,)
    # A password libpq spells escaped in a connection string is still known as written.
    password = "it's\\a secret"
    monkeypatch.setitem(connections["default"].settings_dict, "PASSWORD", password)
    assert "password=" in resolve_url(None)[0]
    assert redact(f"FATAL: bad login {password}") == "FATAL: bad login ***"


def test_system_checks_name_a_database_jobrunner_cannot_use(project: str) -> None:
    from django.core.management import call_command
    from django.tasks import default_task_backend
    from django.test import override_settings

    call_command("check")  # the project as configured passes
    tasks = {
        "default": {"BACKEND": "cronjob.django.JobrunnerBackend", "OPTIONS": {"DATABASE": "x"}}
    }
    with override_settings(TASKS=tasks):
        problems = default_task_backend.check()
    assert [p.id for p in problems] == ["jobrunner.E001"]
    assert "'x' is not in settings.DATABASES" in problems[0].msg


def test_a_tick_outside_a_django_project_imports_nothing_of_django(project: str) -> None:
    from cronjob.api import enqueue

    with psycopg.connect(project, autocommit=True) as conn:
        enqueue(conn, "test.ok")
    report = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] == 'django' or m.startswith('cronjob.django'))))\n"
        "from cronjob.cli import main\n"
        "main(['tick', '--handlers', 'tests.handlers.basic', '--json'])\n"
    )
    env = {k: v for k, v in project_env(project).items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(JOBRUNNER_DATABASE_URL=project, PYTHONPATH=str(PROJECT.parent.parent))
    done = subprocess.run(
        [sys.executable, "-c", report], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    summary, imported = done.stdout.splitlines()[-2:]
    assert json.loads(summary)["succeeded"] == 1
    assert imported == "[]"


def test_manage_py_migrate_and_test_make_jobrunners_tables(
    project: str, empty_database_url: str
) -> None:
    migrated = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=PROJECT,
        env=project_env(empty_database_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert rows(empty_database_url, "SELECT to_regclass('job_runs') IS NOT NULL") == [(True,)]
    tested = subprocess.run(
        [sys.executable, "manage.py", "test", "shop", "--noinput", "-v", "1"],
        cwd=PROJECT,
        env=project_env(empty_database_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tested.returncode == 0, tested.stderr[-3000:]
    assert "Ran 4 tests" in tested.stderr  # shop/tests.py, jobrunner's JobrunnerMixin among them


def test_call_command_runs_jobrunner_commands(project: str) -> None:
    from django.core.management import CommandError, call_command
    from shop.tasks import add

    add.enqueue(1, 2)
    call_command("jobrunner", "tick", "--json")
    assert rows(project, "SELECT status FROM job_runs") == [("succeeded",)]
    with pytest.raises(CommandError, match="exited 2"):
        call_command("jobrunner", "show", "not-an-id")


def test_a_django_projects_help_lists_its_sync_beside_schedule(project: str) -> None:
    def listed(help_text: str) -> list[str]:
        section = help_text.split("\nCommands:\n", 1)[1]
        return [line.split()[0] for line in section.splitlines() if line.startswith("  ")]

    from_manage_py = manage(project, "--help")
    assert from_manage_py.returncode == 0, from_manage_py.stderr
    assert {"schedule", "sync"} <= set(listed(from_manage_py.stdout))
    plain = subprocess.run(
        [sys.executable, "-m", "cronjob", "--help"],
        cwd=PROJECT,
        env=project_env(project),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 0, plain.stderr
    assert {"schedule", "sync"} <= set(listed(plain.stdout))


def test_settings_that_do_not_import_are_one_line(project: str, tmp_path: Path) -> None:
    env = project_env(project)
    env.update(DJANGO_SETTINGS_MODULE="nowhere.settings")
    jobrunner = Path(sys.executable).parent / "jobrunner"
    done = subprocess.run(
        [str(jobrunner), "tick"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "cannot import Django settings 'nowhere.settings'" in done.stderr
    assert "PYTHONPATH" in done.stderr


def test_atomic_above_handler_is_refused() -> None:
    from cronjob import handler
    from cronjob.django import atomic
    from cronjob.handlers import registry

    def misordered(ctx: Any, payload: Any) -> None: ...

    try:
        with pytest.raises(TypeError, match="below @handler"):
            atomic(handler("test.misordered")(misordered))
    finally:
        registry().pop("test.misordered", None)


def test_sync_refuses_a_schedule_whose_task_does_not_import(project: str, tmp_path: Path) -> None:
    from cronjob.django.schedules import specs_from_settings
    from cronjob.errors import BadInput

    with pytest.raises(BadInput, match=r"task 'reports\.tasks\.nightly'.*cannot import"):
        specs_from_settings({"nightly": {"task": "reports.tasks.nightly", "cron": "0 3 * * *"}})
    with pytest.raises(BadInput, match="not a Django task"):
        specs_from_settings({"nightly": {"task": "shop.models.Order", "cron": "0 3 * * *"}})


def test_sync_refuses_a_cron_step_of_thousands_of_digits_in_one_line_writing_nothing(
    project: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from django.conf import settings
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    tasks = json.loads(json.dumps(settings.TASKS))
    schedules = tasks["default"]["OPTIONS"]["SCHEDULES"]
    schedules["every-hour"] = {"task": "shop.tasks.add", "cron": "*/" + "1" * 5000 + " * * * *"}
    with override_settings(TASKS=tasks), pytest.raises(CommandError, match="exited 2"):
        call_command("jobrunner", "sync")
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "settings schedule 'every-hour'" in line and "minute step '11111" in line
    assert "too large" in line and len(line) < 400
    assert rows(project, "SELECT count(*) FROM job_definitions") == [(0,)]


def test_a_task_that_breaks_its_connection_costs_only_its_own_run(project: str) -> None:
    from shop.models import Entry
    from shop.tasks import lose_connection, record

    broken = lose_connection.enqueue()
    after = record.enqueue("after")
    tick(project)  # one worker thread: the second run uses the same thread's connection
    assert lose_connection.get_result(broken.id).status == TaskResultStatus.READY  # a retry
    assert record.get_result(after.id).status == TaskResultStatus.SUCCESSFUL
    assert list(Entry.objects.values_list("label", flat=True)) == ["after"]


def test_a_connection_lost_behind_djangos_back_costs_only_the_next_run(project: str) -> None:
    from shop.models import Entry, Order
    from shop.tasks import lose_connection_quietly, place_order, record

    lose_connection_quietly.enqueue()
    atomic_run = place_order.enqueue("after-the-loss")
    plain = record.enqueue("after")
    again = place_order.enqueue("later")
    tick(project)  # one worker thread, and persistent connections (the project's settings)
    assert place_order.get_result(atomic_run.id).status in (
        TaskResultStatus.READY,
        TaskResultStatus.SUCCESSFUL,
    )
    assert record.get_result(plain.id).status == TaskResultStatus.SUCCESSFUL
    assert place_order.get_result(again.id).status == TaskResultStatus.SUCCESSFUL
    assert "later" in Order.objects.values_list("ref", flat=True)
    assert list(Entry.objects.values_list("label", flat=True)) == ["after"]


def test_with_djangos_connection_pool_worker_threads_give_their_connections_back(
    project: str,
) -> None:
    from shop.tasks import place_order, record

    for n in range(12):
        record.enqueue(f"r{n}")
        place_order.enqueue(f"o{n}")
    env = {**project_env(project), "JOBRUNNER_DJANGO_TEST_POOL": "1"}
    done = subprocess.run(
        [sys.executable, "manage.py", "jobrunner", "tick", "--concurrency", "4", "--json"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["succeeded"] == 24, done.stderr[-2000:]


def test_results_read_without_time_zones_when_use_tz_is_off(project: str) -> None:
    from django.test import override_settings
    from shop.tasks import explode

    result = explode.enqueue("boom")
    # At a fixed now: its retry, due up to a second later (backoff with full jitter), waits
    # for the next tick however long this one takes to end.
    tick(project, now=db_now(project))
    with override_settings(USE_TZ=False):
        read = explode.get_result(result.id)
        assert read.enqueued_at.tzinfo is None and read.last_attempted_at.tzinfo is None
        assert read.status == TaskResultStatus.READY and len(read.errors) == 1


def test_an_async_task_gets_its_context(project: str) -> None:
    from shop.tasks import attempt_number_async

    result = attempt_number_async.enqueue()
    tick(project)
    assert attempt_number_async.get_result(result.id).return_value == 1


def test_jobrunners_own_failures_name_exception_classes_that_import(project: str) -> None:
    from shop.tasks import add

    from cronjob.context import LeaseLost

    result = add.enqueue(1, 2)
    with psycopg.connect(project, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job_attempts (run_id, attempt, worker, error_type, message,"
            " started_at, finished_at) SELECT r.id, n, 'w', e, 'm', now(), now()"
            " FROM unnest(ARRAY['timeout', 'lease_expired', 'NoSuchThing']) WITH ORDINALITY"
            " AS t(e, n), job_runs r WHERE r.result_id = %s",
            [result.id],
        )
    errors = add.get_result(result.id).errors
    assert [e.exception_class for e in errors] == [TimeoutError, LeaseLost, Exception]


def test_an_on_commit_callback_that_raises_does_not_unmake_the_success(project: str) -> None:
    from shop.models import Order
    from shop.tasks import place_order_with_a_failing_hook

    result = place_order_with_a_failing_hook.enqueue("hooked")
    report = tick(project)
    assert report.summary()["succeeded"] == 1
    assert list(Order.objects.values_list("ref", flat=True)) == ["hooked"]
    assert place_order_with_a_failing_hook.get_result(result.id).status == (
        TaskResultStatus.SUCCESSFUL
    )


def test_arguments_that_are_not_json_are_a_type_error_naming_them(project: str) -> None:
    from shop.tasks import add

    with pytest.raises(TypeError, match="add: arguments must be JSON"):
        add.enqueue(object(), 1)
    assert rows(project, "SELECT count(*) FROM job_runs") == [(0,)]
    assert add.get_result(add.enqueue(b"1", "2").id).args == ["1", "2"]  # as Django reads bytes


def test_manage_py_settings_option_is_manage_pys_own(project: str) -> None:
    from shop.tasks import add

    add.enqueue(1, 2)
    done = manage(project, "--settings=project.settings", "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"]["queued"] == 1


def test_a_settings_schedule_naming_a_missing_task_does_not_stop_the_tick(
    project: str,
) -> None:
    from django.test import override_settings
    from shop.tasks import add

    from cronjob.django.runner import task_handlers

    tasks = {
        "default": {
            "BACKEND": "cronjob.django.JobrunnerBackend",
            "OPTIONS": {"SCHEDULES": {"gone": {"task": "shop.tasks.gone", "cron": "0 3 * * *"}}},
        }
    }
    result = add.enqueue(1, 2)
    with override_settings(TASKS=tasks), psycopg.connect(project, autocommit=True) as conn:
        assert list(task_handlers(conn, None)) == ["shop.tasks.add"]  # the missing one is logged
    tick(project)
    assert add.get_result(result.id).return_value == 3


def test_sync_applies_the_limits_in_settings(project: str) -> None:
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings

    tasks = json.loads(json.dumps(settings.TASKS))
    tasks["default"]["OPTIONS"]["LIMITS"] = {
        "shop.tasks.add": {"concurrency": 2, "per": "tenant", "rate": "10/1s"}
    }
    with override_settings(TASKS=tasks):
        call_command("jobrunner", "sync")
    assert rows(
        project, "SELECT job_type, concurrency, rate, rate_period, per FROM job_type_limits"
    ) == [("shop.tasks.add", 2, 10, 1.0, "tenant")]


def test_a_unique_key_gives_the_result_of_the_run_holding_it_until_that_run_finishes(
    project: str,
) -> None:
    from shop.tasks import total

    first = total.using(unique_key="month-end").enqueue(1, 1)
    again = total.using(unique_key="month-end").enqueue(2, 2)
    tick(project)
    later = total.using(unique_key="month-end").enqueue(3, 3)

    assert again.id == first.id
    assert total.get_result(first.id).return_value == 2
    assert later.id != first.id
    assert total.get_result(later.id).status == TaskResultStatus.READY


def test_replace_gives_the_waiting_run_holding_the_key_the_new_arguments(project: str) -> None:
    from shop.tasks import total

    first = total.using(unique_key="month-end").enqueue(1, 1)
    replaced = total.using(unique_key="month-end", replace=True).enqueue(20, 22)
    tick(project)

    assert replaced.id == first.id
    assert total.get_result(first.id).return_value == 42


def test_a_task_of_an_app_a_test_hides_from_the_registry_is_enqueued_and_run(project: str) -> None:
    """A TransactionTestCase's `available_apps` narrows the app registry for its speed; the
    apps INSTALLED_APPS lists still hold the project's tasks."""
    from django.apps import apps
    from shop.tasks import add

    apps.set_available_apps(["django.contrib.contenttypes"])
    try:
        result = add.enqueue(2, 3)
        tick(project)
    finally:
        apps.unset_available_apps()
    assert add.get_result(result.id).return_value == 5
