"""What runs before any work: migrating, checking the schema, asking whether there is work.

Plain values in and out, and no import beyond the statements (queries.preflight): an
idle tick runs two of these and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from cronjob.queries import preflight as queries


def tick_work_exists(
    conn: Any, job_types: Iterable[str], *, now: datetime | None = None
) -> tuple[bool, bool]:
    """Whether a run of `job_types` is due, a lease expired, or a schedule is due; and,
    when none is, whether a run of another type is due."""
    params = {"job_types": list(job_types), "now": now}
    work, others_due = conn.execute(queries.TICK_WORK_EXISTS, params).fetchone()
    return bool(work), bool(others_due)


def tick_enter(
    conn: Any,
    job_types: Iterable[str],
    *,
    host: str,
    pid: int,
    listen: bool,
    kept: float,
    ends_within: float,
    now: datetime | None = None,
) -> tuple[bool, bool, int]:
    """tick_work_exists, and the tick's row in job_ticks in the same statement (ended at
    once when there is nothing to do and it does not `listen`; else, not listening, bound to
    end within `ends_within` seconds); the row's id third. Ended rows older than `kept`
    seconds go, a few at a time."""
    params = {
        "job_types": list(job_types),
        "now": now,
        "host": host,
        "pid": pid,
        "listen": listen,
        "kept": kept,
        "ends_within": ends_within,
    }
    work, others_due, tick_id = conn.execute(queries.TICK_ENTER, params).fetchone()
    return bool(work), bool(others_due), int(tick_id)


def handlers_seen_record(
    conn: Any, job_types: Iterable[str], host: str, *, now: datetime | None = None
) -> None:
    """Record that a tick on `host` has handlers for `job_types` (rows a few minutes
    old or newer are left as they are)."""
    params = {"job_types": sorted(job_types), "host": host, "now": now}
    conn.execute(queries.HANDLERS_SEEN_RECORD, params)


def handlers_seen_missing_due(
    conn: Any, job_types: Iterable[str], *, most: int = 10, now: datetime | None = None
) -> list[str]:
    """Job types of due runs that neither `job_types` nor a tick seen recently handles."""
    params = {"job_types": list(job_types), "most": most, "now": now}
    return [row[0] for row in conn.execute(queries.HANDLERS_SEEN_MISSING_DUE, params)]


def migrations_get_latest_version(conn: Any) -> int:
    """The schema version applied last (0: none); raises UndefinedTable before any."""
    return int(conn.execute(queries.MIGRATIONS_GET_LATEST_VERSION).fetchone()[0])


def advisory_lock(conn: Any, take: str, try_take: str, *, wait: bool) -> bool:
    """Take a transaction's advisory lock with the statement `take`, queuing for whoever
    holds it (True), or without `wait` with `try_take`, once (False if it is held). For
    the store's lock functions, each naming its two statements."""
    if not wait:
        return bool(conn.execute(try_take).fetchone()[0])
    conn.execute(take)
    return True


def migrations_lock(conn: Any, *, wait: bool = True) -> bool:
    """Take the migration lock, held until this transaction ends; with `wait`, queue for
    any other host's migrating to finish, else return False at once if one holds it."""
    return advisory_lock(conn, queries.MIGRATIONS_LOCK, queries.MIGRATIONS_LOCK_TRY, wait=wait)


def migrations_lock_alone(conn: Any, *, wait: bool = True) -> bool:
    """Take the lock a migration outside a transaction is built under, held until this
    transaction ends, however long it then idles; with `wait`, queue for it, else return
    False at once if another host holds it."""
    if not advisory_lock(
        conn, queries.MIGRATIONS_LOCK_ALONE, queries.MIGRATIONS_LOCK_ALONE_TRY, wait=wait
    ):
        return False
    conn.execute(queries.MIGRATIONS_LOCK_ALONE_HOLD)
    return True


def lock_wait_limits(conn: Any, seconds: float | None) -> None:
    """Let this transaction wait `seconds` for a lock (None: back to the runner's limits)."""
    if seconds is None:
        conn.execute(queries.LOCK_WAIT_LIMITS_RESTORE)
    else:
        conn.execute(queries.LOCK_WAIT_LIMITS_SET, {"ms": str(max(1, round(seconds * 1000)))})


def migrations_create_table(conn: Any) -> None:
    conn.execute(queries.MIGRATIONS_CREATE_TABLE)


def migrations_list_applied(conn: Any) -> set[int]:
    return {row[0] for row in conn.execute(queries.MIGRATIONS_LIST_APPLIED).fetchall()}


def migration_apply(conn: Any, sql_text: str, version: int, name: str) -> None:
    """Run one migration file's statements and record its version, in the caller's transaction."""
    conn.execute(sql_text)
    conn.execute(queries.MIGRATION_APPLY_RECORD, {"version": version, "name": name})


def migration_apply_alone(
    conn: Any, statements: Sequence[str], version: int, name: str, *, builds: Sequence[str]
) -> None:
    """Run a migration that cannot run in a transaction, a statement at a time, each
    committing on its own, then record its version. Indexes it `builds` that an unfinished
    build left INVALID are dropped first, to be built again.

    `conn` is in autocommit mode, and another connection holds the migration's lock.
    """
    from psycopg import sql

    names = {"names": list(builds)}
    for (index,) in conn.execute(queries.MIGRATION_APPLY_ALONE_INVALID_INDEXES, names).fetchall():
        drop = sql.SQL(queries.MIGRATION_APPLY_ALONE_DROP_INDEX)
        conn.execute(drop.format(index=sql.Identifier(index)))
    for statement in statements:
        conn.execute(statement)
    conn.execute(queries.MIGRATION_APPLY_RECORD, {"version": version, "name": name})


def migration_activity(conn: Any, pid: int) -> Any:
    """What the backend `pid`, applying a migration, does or waits for now (a
    MigrationActivity), or None once it is gone. Read on a connection of its own."""
    from psycopg.rows import class_row

    from cronjob.models import MigrationActivity

    cursor = conn.cursor(row_factory=class_row(MigrationActivity))
    return cursor.execute(queries.MIGRATION_ACTIVITY, {"pid": pid}).fetchone()
