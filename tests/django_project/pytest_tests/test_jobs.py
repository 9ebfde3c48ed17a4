"""The project's tests under pytest-django: the `jobrunner` fixture is on Django's connection,
in the test's transaction, and drains the project's tasks."""

from datetime import timedelta

from shop.models import Entry, Order
from shop.tasks import add, add_async, place_order

from cronjob.testing import Drained


def test_a_task_enqueued_in_a_test_is_drained(jobrunner):
    result = add.enqueue(2, 3)
    jobrunner.assert_enqueued("shop.tasks.add", payload={"args": [2, 3]})

    assert jobrunner.drain() == Drained(succeeded=1)

    assert add.get_result(result.id).return_value == 5


def test_an_atomic_tasks_orders_are_written_in_the_test(jobrunner):
    place_order.enqueue("P-1")

    assert jobrunner.drain() == Drained(succeeded=1)

    assert list(Order.objects.values_list("ref", flat=True)) == ["P-1"]


def test_each_test_starts_from_an_empty_queue(jobrunner):
    assert jobrunner.enqueued() == []
    assert not Order.objects.exists()


def test_a_deferred_task_waits_for_the_clock(jobrunner):
    add.using(run_after=jobrunner.now + timedelta(hours=1)).enqueue(1, 1)

    assert jobrunner.drain() == Drained()
    jobrunner.advance("1h")
    assert jobrunner.drain() == Drained(succeeded=1)


def test_the_settings_schedule_runs_on_new_years_day(jobrunner):
    jobrunner.sync_schedules()
    [definition] = jobrunner.conn.execute(
        "SELECT next_fire_at FROM job_definitions WHERE name = 'new-year-tally'"
    ).fetchall()
    jobrunner.advance(definition[0] - jobrunner.now)

    assert jobrunner.materialize() == 1
    assert jobrunner.drain() == Drained(succeeded=1)
    assert list(Entry.objects.values_list("label", flat=True)) == ["new year"]


def test_run_handler_gives_a_tasks_return_value(jobrunner):
    handled = jobrunner.run_handler("shop.tasks.add", {"args": [20, 22], "kwargs": {}})

    assert (handled.status, handled.value) == ("succeeded", 42)
    assert jobrunner.enqueued() == []


def test_an_async_task_is_drained_from_a_sync_test(jobrunner):
    add_async.enqueue(1, 2)

    assert jobrunner.drain() == Drained(succeeded=1)


def test_outside_the_tests_transaction_the_fixture_refuses(transactional_db, request):
    import pytest

    with pytest.raises(RuntimeError, match="jobrunner needs the test's open transaction"):
        request.getfixturevalue("jobrunner")
