"""Django tests of the project's own, run by `manage.py test`: its test database gets
jobrunner's tables from `migrate`, like any installed app's, and jobrunner's test helper
works inside each TestCase's transaction."""

from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished
from django.test import TestCase

from cronjob.testing import Drained
from cronjob.testing.django import JobrunnerMixin
from shop.models import Order
from shop.tasks import add, place_order


class EnqueueTests(TestCase):
    def test_enqueue_in_a_test_case(self) -> None:
        with transaction.atomic():
            result = add.enqueue(1, 2)
        self.assertEqual(add.get_result(result.id).status, TaskResultStatus.READY)


class DrainTests(JobrunnerMixin, TestCase):
    def test_an_enqueued_task_is_seen_and_drained(self) -> None:
        result = add.enqueue(1, 2)
        self.jobrunner.assert_enqueued("shop.tasks.add", payload={"args": [1, 2]})

        self.assertEqual(self.jobrunner.drain(), Drained(succeeded=1))

        done = add.get_result(result.id)
        self.assertEqual((done.status, done.return_value), (TaskResultStatus.SUCCESSFUL, 3))
        self.assertEqual(self.jobrunner.enqueued(), [])

    def test_an_atomic_tasks_orm_writes_are_the_tests(self) -> None:
        finished = []

        def receiver(sender, task_result, **kwargs):
            finished.append(task_result)

        task_finished.connect(receiver)
        self.addCleanup(task_finished.disconnect, receiver)
        place_order.enqueue("A-1")

        self.assertEqual(self.jobrunner.drain(), Drained(succeeded=1))

        self.assertEqual(list(Order.objects.values_list("ref", flat=True)), ["A-1"])
        self.assertEqual([r.status for r in finished], [TaskResultStatus.SUCCESSFUL])

    def test_a_failing_atomic_task_writes_nothing_and_waits_for_its_retry(self) -> None:
        place_order.enqueue("A-2", fail=True)

        self.assertEqual(self.jobrunner.drain(), Drained(failed=1))

        self.assertFalse(Order.objects.exists())
        self.jobrunner.assert_enqueued("shop.tasks.place_order", status="failed", attempts=1)
