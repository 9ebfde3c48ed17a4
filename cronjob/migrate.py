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

A `Progress` hears how many migrations there are and of each as it commits, and may stop
the work between two transactions (cronjob.progress). When anyone watches it, a thread of
its own reads from a connection of its own, a few times a second, what the migrating
backend does or waits for (an index build's phase and counts, the session it waits out)
and tells it as a note.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from cronjob import locks, store
from cronjob.locks import DEFAULT_LOCK_WAIT
from cronjob.progress import QUIET, Progress
from cronjob.schema import MIGRATION_FILENAME, migrations_dir

NO_TRANSACTION = "-- jobrunner: no transaction"

# The indexes a migration outside a transaction builds: `CREATE [UNIQUE] INDEX CONCURRENTLY
# [IF NOT EXISTS] name`.
_CONCURRENT_BUILD = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)",
    re.IGNORECASE,
)
WATCH_INTERVAL = 0.25  # seconds between two looks at a migrating backend


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def title(self) -> str:
        return f"{self.version:04d}_{self.name}"

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


def apply(
    conn: Any, *, lock_wait: float = DEFAULT_LOCK_WAIT, progress: Progress = QUIET
) -> list[Migration]:
    """Apply pending migrations; returns what was applied.

    The migrations up to one that must run outside a transaction are applied in one
    transaction, under a transaction-scoped lock (works behind PgBouncer in transaction
    mode), and hosts that wait on it, up to `lock_wait` seconds, find the work done when
    they get it. One outside a transaction is applied on a second connection, made as
    `conn` was. `progress` may stop the work before each transaction.
    """
    applied: list[Migration] = []
    finished = 0  # by this host or another: what progress has counted
    while True:
        progress.checkpoint()
        with conn.transaction():
            locks.take(conn, store.migrations_lock, what="migration", wait=lock_wait)
            store.migrations_create_table(conn)
            done = store.migrations_list_applied(conn)
            pending = [m for m in shipped_migrations() if m.version not in done]
            progress.expect(finished + len(pending))
            alone = next((m for m in pending if not m.in_transaction), None)
            together = pending[: pending.index(alone)] if alone else pending
            for migration in together:
                with _watched(conn, conn, migration, progress):
                    store.migration_apply(
                        conn, migration.path.read_text(), migration.version, migration.name
                    )
        applied += together
        finished += len(together)
        progress.advance(len(together))
        if alone is None:
            return applied
        progress.checkpoint()
        if _apply_alone(conn, alone, lock_wait, progress):
            applied.append(alone)
        finished += 1
        progress.advance(1)


def _apply_alone(conn: Any, migration: Migration, lock_wait: float, progress: Progress) -> bool:
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
        with (
            db.connect_beside(conn, settings=limits) as builder,
            _watched(conn, builder, migration, progress),
        ):
            store.migration_apply_alone(
                builder,
                statements(text),
                migration.version,
                migration.name,
                builds=_CONCURRENT_BUILD.findall(text),
            )
        return True


@contextlib.contextmanager
def _watched(conn: Any, worker: Any, migration: Migration, progress: Progress) -> Iterator[None]:
    """While `worker` applies `migration`: what it does or waits for, told to `progress`
    from a thread and a connection (made as `conn` was) of their own, when anyone watches.

    Watching is a courtesy: a watcher that cannot connect, or loses its connection, stops
    and leaves the migration be.
    """
    from cronjob import db
    from cronjob.errors import DatabaseError

    progress.note(migration.title)
    if not progress.watched:
        yield
        return
    pid = worker.info.backend_pid
    try:
        watcher = db.connect_beside(conn, settings={})
    except DatabaseError:
        yield
        return
    finished = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(watcher, pid, migration, progress, finished), daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()
        watcher.close()


def _watch(
    watcher: Any, pid: int, migration: Migration, progress: Progress, finished: threading.Event
) -> None:
    from cronjob.db import database_errors
    from cronjob.errors import DatabaseError

    while not finished.wait(WATCH_INTERVAL):
        try:
            with database_errors():
                activity = store.migration_activity(watcher, pid)
        except DatabaseError:
            return
        if activity is not None and not finished.is_set():
            progress.note(f"{migration.version:04d}: {describe(activity)}")


def describe(activity: Any) -> str:
    """What a migrating backend does, in a few words: an index build's phase (PostgreSQL's
    own words) with its counts, or the lock it waits for; and the session it waits out."""
    from cronjob.health import seconds_text

    a = activity
    if a.phase is not None:
        text = a.phase
        if a.phase.startswith("waiting") and (a.lockers_total or 0) > 1:
            text += f" ({a.lockers_total - a.lockers_done:,} of {a.lockers_total:,} left)"
        elif a.blocks_total:
            text += f" {a.blocks_done * 100 // a.blocks_total}% of {a.blocks_total:,} blocks"
        elif a.tuples_total:
            text += f" {a.tuples_done:,}/{a.tuples_total:,} rows"
    elif a.wait_event_type == "Lock":
        text = f"waiting for a lock ({a.wait_event})"
    else:
        text = "running"
    if a.holder_pid is not None:
        text += f": pid {a.holder_pid}"
        if a.holder_state is not None and a.holder_seconds is not None:
            text += f" ({a.holder_state}, open {seconds_text(a.holder_seconds)})"
    return text


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
