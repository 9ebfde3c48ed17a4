"""Fixtures: a real PostgreSQL server, a migrated database per test session,
tables emptied between tests, and helpers to run the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

ROOT = Path(__file__).resolve().parent.parent

# The pytest plugin's sample project has tests of its own, which tests/test_testing_plugin.py
# runs as its users would. The Django suite needs Django >= 6 (Python >= 3.12):
# tests/test_django.py runs it in a venv of its own, which sets JOBRUNNER_DJANGO_SUITE.
collect_ignore = ["plugin_project"]
if not os.environ.get("JOBRUNNER_DJANGO_SUITE"):
    collect_ignore += ["django_project", "django_suite"]


@contextmanager
def _test_server() -> Iterator[str]:
    """The server the tests use: JOBRUNNER_TEST_DATABASE_URL's, else the embedded one, else
    (as root, where jobrunner refuses the embedded server) a throwaway server of the tests'
    own, run from the same binaries as an unprivileged account."""
    explicit = os.environ.get("JOBRUNNER_TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    if os.geteuid() != 0:
        from cronjob import embedded

        yield embedded.url()
        return
    from tests import pgserver

    bindir = pgserver.server_binaries()
    if bindir is None:
        pytest.exit("no PostgreSQL server binaries: install the embedded extra", returncode=1)
    user = pgserver.account()
    server = pgserver.ThrowawayServer(pgserver.runnable_binaries(bindir, user), user)
    try:
        yield server.start()
    finally:
        server.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The tests' own account, made as root (tests/pgserver.py), goes with the last session
    that used it."""
    pgserver = sys.modules.get("tests.pgserver")
    if pgserver is not None:
        pgserver.leave_accounts()


def _with_dbname(url: str, dbname: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return conninfo.make_conninfo(**params)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    with _test_server() as url:
        yield url


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """A freshly migrated database of this test session's own."""
    from cronjob import migrate

    name = f"jobrunner_test_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_dbname(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_database_url(server_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with no jobrunner schema, of this test's own."""
    name = f"jobrunner_empty_{os.getpid()}_{abs(hash(request.node.nodeid)) % 10**8}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _with_dbname(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def effect_table(url: str) -> None:
    """A table for handlers' effects in the database at `url`, empty."""
    with psycopg.connect(url, autocommit=True) as c:
        # No unique constraint on purpose: a duplicate effect must be visible.
        c.execute(
            "CREATE TABLE IF NOT EXISTS effect_rows ("
            " key text NOT NULL, run_id bigint NOT NULL, attempt int NOT NULL)"
        )
        c.execute("TRUNCATE effect_rows")


@pytest.fixture
def effects_db(db_url: str) -> str:
    """The test database with a table for handlers' effects, emptied."""
    effect_table(db_url)
    return db_url


@pytest.fixture
def db_url(database_url: str) -> str:
    """The session database with every jobrunner table emptied."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'jobrunner_migrations'"
            )
        ]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
    return database_url


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "JOBRUNNER_DATABASE_URL",
        "JOBRUNNER_DATABASE_URL_FILE",
        "DATABASE_URL",
        "JOBRUNNER_HANDLERS",
        "JOBRUNNER_TENANTS_SQL",
        "DJANGO_SETTINGS_MODULE",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fresh_registry() -> Iterator[dict[str, Any]]:
    """The handler registry, restored after the test."""
    from cronjob.handlers import registry

    saved = dict(registry())
    registry().clear()
    yield registry()
    registry().clear()
    registry().update(saved)


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    """Run the command line in this process, as `jobrunner ARGS` would."""
    from click.testing import CliRunner

    from cronjob.cli import main

    runner = CliRunner()
    with runner.isolation(input=input, env=env) as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return Result(code, out.getvalue().decode(), err.getvalue().decode())


def jobrunner_process(
    *args: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    """Start `jobrunner ARGS` as a real process, with the tests' handler modules importable."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "cronjob", *args],
        env=full_env,
        cwd=ROOT,
        text=True,
        stdout=popen.pop("stdout", subprocess.PIPE),
        stderr=popen.pop("stderr", subprocess.PIPE),
        **popen,
    )


def count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    return conn.execute(sql, params or None).fetchone()[0]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll until `predicate()` is truthy, and return what it returned; the timeout only
    bounds a hung test."""
    until = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
