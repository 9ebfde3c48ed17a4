"""jobrunner's pytest plugin in a Django project under pytest-django: the test project's own
pytest tests (tests/django_project/pytest_tests), run by a pytest of their own as the
project's developers run them."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.django_suite.conftest import PROJECT, project_env


def test_the_projects_pytest_django_tests_pass(empty_database_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"],
        cwd=PROJECT,
        env=project_env(empty_database_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.fullmatch(r"=* ?8 passed in .*", done.stdout.strip().splitlines()[-1])
    for shown in [
        "test_a_task_enqueued_in_a_test_is_drained",
        "test_an_atomic_tasks_orders_are_written_in_the_test",
        "test_the_settings_schedule_runs_on_new_years_day",
    ]:
        assert f"PASSED pytest_tests/test_jobs.py::{shown}" in done.stdout
