"""A Django test of the project's own, run by `manage.py test`: its test database gets
jobrunner's tables from `migrate`, like any installed app's."""

from django.db import transaction
from django.tasks import TaskResultStatus
from django.test import TestCase

from shop.tasks import add


class EnqueueTests(TestCase):
    def test_enqueue_in_a_test_case(self) -> None:
        with transaction.atomic():
            result = add.enqueue(1, 2)
        self.assertEqual(add.get_result(result.id).status, TaskResultStatus.READY)
