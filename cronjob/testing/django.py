"""The `jobrunner` of a Django test: on Django's connection, in the test's transaction.

    from django.test import TestCase
    from cronjob.testing.django import JobrunnerMixin

    class OrderTests(JobrunnerMixin, TestCase):
        def test_an_order_sends_its_receipt(self):
            place_order(...)                       # enqueues send_receipt's task
            self.jobrunner.assert_enqueued("shop.tasks.send_receipt")
            assert self.jobrunner.drain().succeeded == 1

With pytest-django the `jobrunner` fixture is this same object (cronjob.testing.plugin).
Tasks enqueued through the Tasks backend are written on that connection, in the test's
transaction, so the test sees them; the drain runs the project's tasks as a Django tick
does (cronjob.django.runner), their ORM writes and an `atomic` task's transaction included,
as savepoints in the test's transaction, and sends Django's task signals.
"""

from __future__ import annotations

from cronjob.testing.jobrunner import Jobrunner


def django_jobrunner(alias: str | None = None) -> Jobrunner:
    """A test's jobrunner on Django's connection for `alias` (the Tasks backend's DATABASE
    when None), in whatever transaction it is in: a TestCase's, pytest-django's `db`'s."""
    from cronjob.django.connection import django_connection

    return Jobrunner.begin(django_connection(alias), django=True)


class JobrunnerMixin:
    """For `django.test.TestCase`: `self.jobrunner`, made in `setUp`, in the test's
    transaction (which the TestCase rolls back)."""

    jobrunner: Jobrunner

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.jobrunner = django_jobrunner()
