"""A test's connection as jobrunner's code uses it (cronjob.testing): an attempt's transaction as a
savepoint in the test's, and psycopg connections seen as AsyncConnections.

Like `binding.ServerBinding`, connections someone else opened, made fit for the statements
jobrunner and the code under test run on them; here, for the pytest plugin's drain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cronjob.store import testing as store


class AttemptTransaction:
    """`ctx.db` in a test: the attempt's savepoint in the test's transaction, used as a
    psycopg connection is.

    It begins with its first use; `commit()` releases it, as a COMMIT ends a transaction
    (what it wrote stays), and `rollback()` and `close()` roll it back. Like a connection's
    next transaction, the next use after either begins a new one. Anything else is the test
    connection's own (`transaction()` makes a savepoint inside this one).
    """

    def __init__(self, conn: Any, side: AttemptSide) -> None:
        self._conn = conn
        self._side = side
        self._open = False
        self.closed = False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self._begin()
        return self._conn.execute(query, params, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        self._begin()
        return self._conn.cursor(*args, **kwargs)

    def commit(self) -> None:
        if self._open:
            self._open = False
            self._side.written()
            store.attempt_savepoint_release(self._conn)

    def rollback(self) -> None:
        if self._open:
            self._open = False
            store.attempt_savepoint_rollback(self._conn)
            self._side.write_again()

    def close(self) -> None:
        if not self.closed:
            self.rollback()
            self.closed = True

    def __enter__(self) -> AttemptTransaction:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        # As `with connection:` ends: committed unless it raised, and closed.
        if kind is None:
            self.commit()
        else:
            self.rollback()
        self.close()

    def __getattr__(self, name: str) -> Any:
        self._begin()
        return getattr(self._conn, name)

    def _begin(self) -> None:
        if self.closed:
            import psycopg

            raise psycopg.OperationalError("the connection is closed")
        if not self._open:
            store.attempt_savepoint(self._conn)
            self._open = True
            self._side.pending = []


class AttemptSide:
    """The side connection of `ctx.at_most_once` in a test: the test's connection, whose
    statements are written again if the attempt's savepoint they went into rolls back."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.pending: list[tuple[Any, Any, dict[str, Any]]] | None = None  # while one is open
        self.closed = False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        cursor = self._conn.execute(query, params, **kwargs)
        if self.pending is not None:
            self.pending.append((query, params, kwargs))
        return cursor

    def written(self) -> None:
        self.pending = None

    def write_again(self) -> None:
        pending, self.pending = self.pending or [], None
        for query, params, kwargs in pending:
            self._conn.execute(query, params, **kwargs)

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class AsyncConnection:
    """A psycopg connection (or one of the above) seen as a psycopg AsyncConnection: what
    `await ctx.db` is for an `async def` handler in a test, and `jobrunner.aconn`. Each call
    runs at once, on the test's thread."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> AsyncCursor:
        return AsyncCursor(self._conn.execute(query, params, **kwargs))

    def cursor(self, *args: Any, **kwargs: Any) -> AsyncCursor:
        return AsyncCursor(self._conn.cursor(*args, **kwargs))

    def transaction(self, *args: Any, **kwargs: Any) -> _AsyncBlock:
        return _AsyncBlock(self._conn.transaction(*args, **kwargs))

    async def commit(self) -> None:
        self._conn.commit()

    async def rollback(self) -> None:
        self._conn.rollback()

    async def close(self) -> None:
        self._conn.close()

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self._conn.__exit__(kind, value, traceback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class AsyncCursor:
    """A psycopg cursor seen as an AsyncCursor."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> AsyncCursor:
        self._cursor.execute(query, params, **kwargs)
        return self

    async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        self._cursor.executemany(query, params_seq, **kwargs)

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int = 0) -> list[Any]:
        return self._cursor.fetchmany(size)

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def close(self) -> None:
        self._cursor.close()

    def __aiter__(self) -> Any:
        return _rows(iter(self._cursor))

    async def __aenter__(self) -> AsyncCursor:
        return self

    async def __aexit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self._cursor.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


async def _rows(rows: Iterator[Any]) -> Any:
    for row in rows:
        yield row


class _AsyncBlock:
    """A psycopg `transaction()` block, entered with `async with`."""

    def __init__(self, block: Any) -> None:
        self._block = block

    async def __aenter__(self) -> Any:
        return self._block.__enter__()

    async def __aexit__(self, kind: Any, value: Any, traceback: Any) -> Any:
        return self._block.__exit__(kind, value, traceback)
