"""Applies the numbered sql/NNNN_name.sql files in order, under an advisory lock.

Pending migrations run in one transaction, but for a migration whose first line is
`NO_TRANSACTION` (`-- jobrunner: no transaction`): what PostgreSQL refuses to run in a
transaction, such as `CREATE INDEX CONCURRENTLY`, which builds an index on a large table
without blocking its writes. The migrations before it commit first; it then runs a statement
at a time on a connection of its own, under a lock another transaction holds, and records
itself once all of them succeeded; the migrations after it follow in a transaction of their
own. Such a migration must be safe to run again from its start (`IF NOT EXISTS`, `IF
EXISTS`): a crash or a cancel can stop it anywhere, and the next `migrate` runs it again,
dropping first the indexes it builds that the interrupted build left INVALID. Its
statements end with a semicolon at the end of a line, and hold none in between (no
function bodies: those belong in a transaction).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cronjob import locks, store
from cronjob.locks import DEFAULT_LOCK_WAIT
from cronjob.schema import MIGRATION_FILENAME, migrations_dir

NO_TRANSACTION = "-- jobrunner: no transaction"

# The indexes a migration outside a transaction builds: `CREATE [UNIQUE] INDEX CONCURRENTLY
# [IF NOT EXISTS] name`.
_CONCURRENT_BUILD = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def in_transaction(self) -> bool:
        with self.path.open(encoding="utf-8") as text:
            return text.readline().strip() != NO_TRANSACTION


@lru_cache(maxsize=1)
def shipped_migrations() -> tuple[Migration, ...]:
    found = []
    for path in sorted(migrations_dir().glob("*.sql")):
        match = MIGRATION_FILENAME.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path))
    return tuple(found)


def apply(conn: Any, *, lock_wait: float = DEFAULT_LOCK_WAIT) -> list[Migration]:
    """Apply pending migrations; returns what was applied.

    The migrations up to one that must run outside a transaction are applied in one
    transaction, under a transaction-scoped lock (works behind PgBouncer in transaction
    mode), and hosts that wait on it, up to `lock_wait` seconds, find the work done when
    they get it. One outside a transaction is applied on a second connection, made as
    `conn` was.
    """
    applied: list[Migration] = []
    while True:
        with conn.transaction():
            locks.take(conn, store.migrations_lock, what="migration", wait=lock_wait)
            store.migrations_create_table(conn)
            done = store.migrations_list_applied(conn)
            alone = None
            for migration in shipped_migrations():
                if migration.version in done:
                    continue
                if not migration.in_transaction:
                    alone = migration
                    break
                store.migration_apply(
                    conn, migration.path.read_text(), migration.version, migration.name
                )
                applied.append(migration)
        if alone is None:
            return applied
        if _apply_alone(conn, alone, lock_wait):
            applied.append(alone)


def _apply_alone(conn: Any, migration: Migration, lock_wait: float) -> bool:
    """Apply a migration outside a transaction, unless another host did meanwhile; True if
    this one did.

    A transaction of `conn` holds the lock while a connection of its own builds: no session
    state is needed, so this works behind PgBouncer in transaction mode too. The build may
    outlast the runner's statement_timeout on a large table, and waits for every older
    transaction to end for as long as the host allows any lock wait (`lock_wait`).
    """
    from cronjob import db

    with locks.holding(conn, store.migrations_lock_alone, what="migration", wait=lock_wait):
        if migration.version in store.migrations_list_applied(conn):
            return False
        text = migration.path.read_text()
        limits = {"statement_timeout": "0", "lock_timeout": f"{max(1, round(lock_wait * 1000))}"}
        with db.connect_beside(conn, settings=limits) as builder:
            store.migration_apply_alone(
                builder,
                statements(text),
                migration.version,
                migration.name,
                builds=_CONCURRENT_BUILD.findall(text),
            )
        return True


def statements(text: str) -> list[str]:
    """The statements of a migration outside a transaction: each ends with a semicolon at
    the end of a line. Comments stay with the statement they precede."""
    found, current = [], []
    for line in text.splitlines():
        current.append(line)
        if line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            found.append("\n".join(current).strip())
            current = []
    rest = "\n".join(line for line in current if not line.lstrip().startswith("--")).strip()
    if rest:
        found.append(rest)
    return found
