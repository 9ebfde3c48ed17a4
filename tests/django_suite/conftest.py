"""The Django suite: run by tests/test_django.py in a venv with Django >= 6 (Python >= 3.12),
or directly there with JOBRUNNER_DJANGO_SUITE=1. The test project is tests/django_project."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

PROJECT = Path(__file__).resolve().parent.parent / "django_project"


@pytest.fixture(scope="session")
def django_database(database_url: str) -> str:
    """The session's migrated jobrunner database, with the test project's tables in it."""
    os.environ["JOBRUNNER_DJANGO_TEST_DB"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    sys.path.insert(0, str(PROJECT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return database_url


@pytest.fixture
def project(django_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The project's database with runs, schedules and the shop's rows emptied."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "project.settings")
    with psycopg.connect(django_database, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE job_runs, job_attempts, job_definitions, job_effects, job_run_tally,"
            " shop_order, shop_entry RESTART IDENTITY CASCADE"
        )
    import shop.tasks  # noqa: F401 - its @handler registers before the snapshot

    from cronjob.handlers import registry

    before = dict(registry())
    yield django_database
    registry().clear()
    registry().update(before)
    from django.db import connections

    connections.close_all()


def project_env(database_url: str) -> dict[str, Any]:
    """The environment of a `manage.py jobrunner ...` process of the test project."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBRUNNER_")}
    env.update(
        JOBRUNNER_DJANGO_TEST_DB=database_url,
        DJANGO_SETTINGS_MODULE="project.settings",
        PYTHONPATH=str(PROJECT),
    )
    return env
