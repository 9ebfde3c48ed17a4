"""Applies the numbered sql/NNNN_name.sql files in order, under an advisory lock."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cronjob.db import MIGRATION_FILENAME, migrations_dir

# Any constant works; this one spells "jobrunr" and only has to be unique per database.
MIGRATION_LOCK_KEY = 0x6A6F6272756E72


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


def apply(conn: Any) -> list[Migration]:
    """Apply pending migrations in one transaction; returns what was applied.

    The lock is transaction-scoped (works behind PgBouncer in transaction mode),
    and hosts that wait on it find the work done when they get it.
    """
    applied: list[Migration] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS jobrunner_migrations ("
            " version integer PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM jobrunner_migrations")}
        for migration in shipped_migrations():
            if migration.version in done:
                continue
            conn.execute(migration.path.read_text())
            conn.execute(
                "INSERT INTO jobrunner_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied
