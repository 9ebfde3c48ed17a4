"""Connections: how to reach the database, and what its driver's errors mean.

A `Database` is a resolved database: one object that opens every further connection
a tick makes (handlers' `ctx.db`, the writer's, a reconnect). Driver errors are
translated here, once, into the project's own errors, with any password removed from
the message. Where the database is comes from `cronjob.location`, whether its schema
is ready from `cronjob.schema`.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cronjob.errors import (
    DatabaseError,
    DatabaseInterrupted,
    DatabaseUnavailable,
)
from cronjob.text import one_line, redact, remember_password

# The runner's own statements must never hang a tick behind a stuck lock.
RUNNER_OPTIONS = (
    "-c statement_timeout=30000 -c lock_timeout=5000 -c idle_in_transaction_session_timeout=600000"
)


class Database:
    """A resolved database: where it is, where that came from, and how to open connections
    to it.

    `source` names where the URL came from (a flag, a variable, Django's settings, the
    embedded server). A test counts or refuses connections by overriding `connect`.
    """

    # The connections it opens are savepoints in a caller's transaction (a test's:
    # cronjob.testing.transaction.InTransaction), where a framework's transaction opened for
    # a handler nests (cronjob.django.runner).
    in_caller_transaction = False

    # Not a dataclass: its repr would show the URL, password and all.
    def __init__(self, url: str, source: str = "given") -> None:
        self.url = url
        self.source = source

    def connect(self, *, autocommit: bool = True) -> Any:
        return connect(self.url, autocommit=autocommit)

    async def connect_async(self, *, autocommit: bool = True) -> Any:
        return await connect_async(self.url, autocommit=autocommit)


def connect(
    url: str,
    *,
    autocommit: bool = True,
    attempts: int = 3,
    retry_delay: float = 0.5,
    application_name: str = "jobrunner",
    settings: dict[str, str] | None = None,
) -> Any:
    """Open a connection, retrying briefly: a restarting server gets a few seconds.

    `settings` (server parameters) go with the runner's own at the connection's start.
    """
    remember_password(url)
    last: DatabaseInterrupted | None = None
    for attempt in range(attempts):
        try:
            with database_errors():
                return _open(
                    url,
                    autocommit=autocommit,
                    application_name=application_name,
                    settings=settings or {},
                )
        except DatabaseInterrupted as exc:
            last = exc
            if attempt + 1 < attempts:
                time.sleep(retry_delay * (attempt + 1))
        except DatabaseError as exc:
            raise _invalid_url(exc) from None
    assert last is not None
    raise DatabaseUnavailable(f"cannot connect to the database: {last.description}") from None


def connect_beside(conn: Any, *, settings: dict[str, str]) -> Any:
    """Another autocommit connection to the database `conn` is connected to, as its user,
    with server `settings` given at its start rather than SET (no SET outlives a statement
    behind a pooler in transaction mode): a pooler that refuses them gets none, and the
    login's own apply."""
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(conn.info.dsn)
    if conn.info.password:
        params["password"] = conn.info.password
    return connect(conninfo.make_conninfo(**params), settings=settings)


# URLs whose server refused the `options` startup parameter: connection poolers
# such as PgBouncer do, unless told to ignore it. Remembered so that the
# connections a tick opens for handlers do not each pay for a refused attempt.
_REFUSES_STARTUP_OPTIONS: set[str] = set()


def _open(url: str, *, autocommit: bool, application_name: str, settings: dict[str, str]) -> Any:
    import psycopg

    common = _connection_params(url, autocommit, application_name)
    if url not in _REFUSES_STARTUP_OPTIONS:
        given = "".join(f" -c {name}={value}" for name, value in settings.items())
        try:
            return psycopg.connect(url, options=startup_options(url) + given, **common)
        except psycopg.OperationalError as exc:
            if "unsupported startup parameter" not in str(exc):
                raise
            # The timeouts cannot travel with the connection here, and a SET
            # would stay on a pooled server connection that other clients get
            # next; they belong on the login role instead (docs/guides/pgbouncer.md).
            _REFUSES_STARTUP_OPTIONS.add(url)
    return psycopg.connect(url, **common)


async def connect_async(
    url: str, *, autocommit: bool = True, application_name: str = "jobrunner"
) -> Any:
    """An AsyncConnection with the same settings and limits as `connect` gives."""
    import psycopg

    common = _connection_params(url, autocommit, application_name)
    try:
        with database_errors():
            if url not in _REFUSES_STARTUP_OPTIONS:
                try:
                    return await psycopg.AsyncConnection.connect(
                        url, options=startup_options(url), **common
                    )
                except psycopg.OperationalError as exc:
                    if "unsupported startup parameter" not in str(exc):
                        raise
                    _REFUSES_STARTUP_OPTIONS.add(url)
            return await psycopg.AsyncConnection.connect(url, **common)
    except DatabaseInterrupted as exc:
        raise DatabaseUnavailable(f"cannot connect to the database: {exc.description}") from None
    except DatabaseError as exc:
        raise _invalid_url(exc) from None


def _invalid_url(exc: DatabaseError) -> DatabaseUnavailable:
    # Not the server's doing: libpq could not make sense of the URL. It quotes the
    # part it choked on, which may be a piece of a password: left out.
    problem = re.sub(r'"[^"]*"', '"…"', exc.description)
    return DatabaseUnavailable(f"invalid database URL: {problem}")


def _connection_params(url: str, autocommit: bool, application_name: str) -> dict[str, Any]:
    common: dict[str, Any] = {
        "autocommit": autocommit,
        "connect_timeout": 5,
        "application_name": application_name,
        # Prepared statements are off: they break behind PgBouncer in
        # transaction mode, and our statements are cheap to plan.
        "prepare_threshold": None,
    }
    ignored = _ignored_password_file(url)
    if ignored is not None:
        # libpq would say so itself, in plain text on stderr between our JSON lines,
        # and then not read the file; pointing it at a path that cannot exist skips
        # the file just the same, silently.
        common["passfile"] = os.path.join(ignored, "not-read")
    return common


_warned_password_files: set[str] = set()


def _ignored_password_file(url: str) -> str | None:
    """The password file libpq would refuse to read, since others may read it; warned once."""
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(url)
    except Exception:
        return None  # connecting reports what is wrong with the URL
    if params.get("password") or os.environ.get("PGPASSWORD"):
        return None
    path = params.get("passfile") or os.environ.get("PGPASSFILE")
    path = path or os.path.join(os.path.expanduser("~"), ".pgpass")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not stat.S_ISREG(mode):
        why = "it is not a plain file"
    elif mode & (stat.S_IRWXG | stat.S_IRWXO):
        why = "group or others can read it (make it mode 0600)"
    else:
        return None
    if path not in _warned_password_files:
        from cronjob import log

        _warned_password_files.add(path)
        log.log_event("warning", f"password file ignored: {why}", path=path)
    return path


def startup_options(url: str) -> str:
    """The runner's timeouts, followed by any options the URL (or PGOPTIONS) gives,
    which win where both set the same parameter."""
    from psycopg import conninfo

    theirs = conninfo.conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS")
    return f"{RUNNER_OPTIONS} {theirs}" if theirs else RUNNER_OPTIONS


def read_times_beyond_the_calendar(conn: Any) -> None:
    """Read a stored time outside Python's years 1 to 9999 as the nearest end of it.

    PostgreSQL holds times from 4713 BC to 294276 AD and `infinity`; psycopg refuses to load
    any of them beyond Python's calendar. jobrunner refuses such times at every door, but a
    row written by other means must not take down every command that reads it: `list`,
    `status`, `metrics` and `check` show it at the end of the calendar instead.
    """
    from datetime import UTC, datetime

    import psycopg

    earliest, latest = datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)
    oid = psycopg.adapters.types["timestamptz"].oid
    for wire_format in (psycopg.pq.Format.TEXT, psycopg.pq.Format.BINARY):
        inner_class = conn.adapters.get_loader(oid, wire_format)
        if inner_class is None:
            continue

        # Wrapped rather than subclassed: the C implementation's loaders cannot be subclassed.
        class Clamped(psycopg.adapt.Loader):
            format = wire_format
            _inner_class = inner_class

            def __init__(self, oid: int, context: Any = None) -> None:
                super().__init__(oid, context)
                self._inner = self._inner_class(oid, context)

            def load(self, data: Any) -> Any:
                try:
                    return self._inner.load(data)
                except psycopg.DataError as exc:
                    return earliest if "too small" in str(exc) else latest

        conn.adapters.register_loader(oid, Clamped)


def describe(exc: BaseException) -> str:
    """One line, no password."""
    return redact(one_line(str(exc)) or type(exc).__name__)


@contextmanager
def database_errors(*, passing: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn driver errors raised inside into the project's own, once, here.

    `psycopg.OperationalError` (a lost connection, a timeout, a deadlock) becomes
    `DatabaseInterrupted`; any other `psycopg.Error` becomes `DatabaseError`. Either says
    `database: <description>`, and keeps the driver's error as its `__cause__`. Errors that
    are instances of `passing` propagate untranslated, for callers that handle them
    themselves. Usable as a decorator too.
    """
    try:
        yield
    except passing:
        raise
    except Exception as exc:
        # Looked up, not imported: without psycopg loaded no driver error can be in flight,
        # and commands that never reach the database should not pay for the import.
        psycopg = sys.modules.get("psycopg")
        if psycopg is None or not isinstance(exc, psycopg.Error):
            raise
        kind = DatabaseInterrupted if isinstance(exc, psycopg.OperationalError) else DatabaseError
        description = describe(exc)
        primary = exc.diag.message_primary  # None when the client raised it
        raise kind(
            f"database: {description}{_whose_privileges(exc)}",
            description=description,
            sqlstate=exc.sqlstate,
            primary=redact(one_line(primary)) if primary else None,
        ) from exc


def _whose_privileges(exc: Any) -> str:
    """For a permission denied: the role that lacks it, and where the roles are told."""
    if exc.sqlstate != INSUFFICIENT_PRIVILEGE or getattr(exc, "pgconn", None) is None:
        return ""
    user = exc.pgconn.user.decode(errors="replace")
    return f" (as role {user}; deploy/roles.sql says what each role may do)"


# PostgreSQL error codes (SQLSTATE) that callers of database_errors tell apart.
UNDEFINED_TABLE = "42P01"
INSUFFICIENT_PRIVILEGE = "42501"
READ_ONLY_SQL_TRANSACTION = "25006"
# The classes of error (a code's first two characters) of a statement whose own rows were
# at fault: a value the server cannot take (data exception), a constraint they broke
# (integrity constraint violation). The server takes other statements all the same.
ROWS_REJECTED_CLASSES = ("22", "23")
