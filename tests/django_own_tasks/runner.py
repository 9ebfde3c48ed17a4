"""Django's test runner for its tests/tasks on jobrunner (settings.TEST_RUNNER)."""

from __future__ import annotations

import unittest
from typing import Any

from django.test import SimpleTestCase, TransactionTestCase
from django.test.runner import DiscoverRunner

# Tests of Django's ImmediateBackend's own choices that jobrunner makes otherwise, and
# why; each must still fail (an expected failure that passes fails the run).
DIVERGENT = {
    "test_throws_keyboard_interrupt": (
        "a task's KeyboardInterrupt is its attempt's error, recorded and logged: it is raised"
        " in a worker thread, never by a user stopping the tick"
    ),
}


class Runner(DiscoverRunner):
    """DiscoverRunner, with the SimpleTestCase classes of tests/tasks allowed to query the
    default database (jobrunner's backend is one: a takes_context task reads its result
    there), and the DIVERGENT tests expected to fail."""

    def build_suite(self, *args: Any, **kwargs: Any) -> Any:
        suite = super().build_suite(*args, **kwargs)
        for test in _tests(suite):
            cls = type(test)
            if issubclass(cls, SimpleTestCase) and not issubclass(cls, TransactionTestCase):
                cls.databases = {"default"}
            name = test._testMethodName
            if name in DIVERGENT:
                method = getattr(cls, name)
                setattr(cls, name, unittest.expectedFailure(method))
        return suite

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        """Django drops its test database only when no one else is connected: the
        stand-ins' connections and those of the ticks' worker threads, which ended
        without closing theirs, are ended first."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        super().teardown_databases(old_config, **kwargs)


def _tests(suite: Any) -> list[Any]:
    if isinstance(suite, unittest.TestSuite):
        return [test for part in suite for test in _tests(part)]
    return [suite]
