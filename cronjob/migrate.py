"""Applies the numbered sql/NNNN_name.sql files in order, under an advisory lock."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cronjob import locks, store
from cronjob.locks import DEFAULT_LOCK_WAIT
from cronjob.schema import MIGRATION_FILENAME, migrations_dir


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


@lru_cache(maxsize=1)
def shipped_migrations() -> tuple[Migration, ...]:
    found = []
    for path in sorted(migrations_dir().glob("*.sql")):
        match = MIGRATION_FILENAME.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path))
    return tuple(found)


def apply(conn: Any, *, lock_wait: float = DEFAULT_LOCK_WAIT) -> list[Migration]:
    """Apply pending migrations in one transaction; returns what was applied.

    The lock is transaction-scoped (works behind PgBouncer in transaction mode),
    and hosts that wait on it, up to `lock_wait` seconds, find the work done when
    they get it.
    """
    applied: list[Migration] = []
    with conn.transaction():
        locks.take(conn, store.migrations_lock, what="migration", wait=lock_wait)
        store.migrations_create_table(conn)
        done = store.migrations_list_applied(conn)
        for migration in shipped_migrations():
            if migration.version in done:
                continue
            store.migration_apply(
                conn, migration.path.read_text(), migration.version, migration.name
            )
            applied.append(migration)
    return applied
