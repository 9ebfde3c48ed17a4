"""jobrunner's pytest plugin, registered by the package (entry point `pytest11`): the
`jobrunner` fixture.

It does nothing until a test asks for the fixture: no database is looked for, started or
migrated before, and nothing of jobrunner is imported. Then:

- `jobrunner_test_database` (session): the database, migrated once (cronjob.testing.database);
  override it in a conftest.py to hand the tests a database of your own.
- `jobrunner` (each test): a `cronjob.testing.Jobrunner` on one shared connection, in a
  transaction rolled back at the test's end. With pytest-django, in a project whose TASKS use
  jobrunner's backend, it is on Django's connection and in its test transaction instead (it
  asks for pytest-django's `db` fixture).

The `jobrunner_handlers` ini option names handler modules to import before the first test
uses the fixture, as `--handlers` does for a tick; the `jobrunner.handlers` entry points are
loaded then too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

HANDLERS_OPTION = "jobrunner_handlers"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        HANDLERS_OPTION,
        "handler modules the jobrunner fixture imports (as `jobrunner tick --handlers`), a line"
        " or a comma between them",
        type="linelist",
        default=[],
    )


_HANDLERS_LOADED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pytest-django, a test that uses the fixture is a test of Django's database: marked
    so, as pytest-django makes the test database only for the tests it sees need one."""
    if not items or not _django_project(config):
        return
    for item in items:
        if "jobrunner" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "django_db"
        ):
            item.add_marker(pytest.mark.django_db)


@pytest.fixture(scope="session")
def jobrunner_test_database() -> Iterator[Any]:
    """The session's jobrunner database, migrated: JOBRUNNER_TEST_DATABASE_URL, else the
    embedded server's `jobrunner_test`."""
    from cronjob.testing.database import TestDatabase

    database = TestDatabase.prepare()
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def jobrunner(request: pytest.FixtureRequest) -> Iterator[Any]:
    """jobrunner in this test's transaction: enqueue on `jobrunner.conn`, assert what is
    enqueued, `drain()` it in this process, `advance()` the clock (cronjob.testing)."""
    _load_handlers(request.config)
    if _on_django(request):
        from cronjob.testing.django import django_jobrunner

        request.getfixturevalue("db")
        yield django_jobrunner()
        return
    database = request.getfixturevalue("jobrunner_test_database")
    with database.jobrunner() as runner:
        yield runner


def _on_django(request: pytest.FixtureRequest) -> bool:
    return _django_project(request.config)


def _django_project(config: pytest.Config) -> bool:
    """pytest-django runs this session, in a project whose TASKS use jobrunner's backend."""
    if not config.pluginmanager.hasplugin("django"):
        return False
    from django.conf import settings

    if not settings.configured:
        return False
    from cronjob.django.connection import BACKEND_PATH

    tasks = getattr(settings, "TASKS", {}) or {}
    return any(params.get("BACKEND") == BACKEND_PATH for params in tasks.values())


def _load_handlers(config: pytest.Config) -> None:
    """The ini option's handler modules and the entry points', once a session."""
    if config.stash.get(_HANDLERS_LOADED, False):
        return
    from cronjob.handlers import load_handler_modules

    lines = config.getini(HANDLERS_OPTION)
    load_handler_modules([name for line in lines for name in line.split(",")])
    config.stash[_HANDLERS_LOADED] = True
