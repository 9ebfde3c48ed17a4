"""A test's connections as a handler sees them: each attempt's transaction a savepoint in the
test's own, and an async view of the test's connection for `async def` code.

In production a handler's `ctx.db` is a connection of its own, in a transaction that commits
with the run's success, and `ctx.at_most_once` writes on a second, autocommit one. A test's
runs exist only in the test's transaction, which no other connection sees, so here both are
the test's connection: `ctx.db` a savepoint (`store.savepoints.AttemptTransaction`), released
where production commits and rolled back where it rolls back; the side connection the test's
connection itself (`AttemptSide`), whose writes a rolled-back savepoint would take with it,
so they are written again after it, as production's had committed before.

`InTransaction` is the `Database` that opens them: the one a test's `JobContext` is given.
"""

from __future__ import annotations

from typing import Any

from cronjob.db import Database
from cronjob.store.savepoints import AsyncConnection, AttemptSide, AttemptTransaction

__all__ = ["AsyncConnection", "InTransaction"]


class InTransaction(Database):
    """The database of a test's attempts: every connection it opens is the test's own,
    `ctx.db` as the attempt's savepoint (`AttemptTransaction`). Attempts run one at a time:
    `attempt()` starts the next one's."""

    # Read by integrations that open a transaction of their own for a handler (Django's
    # atomic tasks): here it is a savepoint inside the caller's.
    in_caller_transaction = True

    def __init__(self, conn: Any) -> None:
        super().__init__("", source="the test's transaction")
        self.conn = conn
        self._side = AttemptSide(conn)

    def attempt(self) -> None:
        self._side = AttemptSide(self.conn)

    def connect(self, *, autocommit: bool = True) -> Any:
        if autocommit:
            return self._side
        return AttemptTransaction(self.conn, self._side)

    async def connect_async(self, *, autocommit: bool = True) -> Any:
        return AsyncConnection(self.connect(autocommit=autocommit))
