"""One function per statement of cronjob.queries.testing, for the pytest plugin
(cronjob.testing): on the test's connection, in its transaction."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from cronjob.queries import testing as queries


def clock_pin(conn: Any, now: datetime | None) -> datetime:
    """Pin the clock of every statement `conn` runs in this transaction to `now` (None: to
    the clock as it reads now); returns it."""
    return conn.execute(queries.CLOCK_PIN, {"now": now}).fetchone()[0]


def attempt_savepoint(conn: Any) -> None:
    conn.execute(queries.ATTEMPT_SAVEPOINT)


def attempt_savepoint_release(conn: Any) -> None:
    conn.execute(queries.ATTEMPT_SAVEPOINT_RELEASE)


def attempt_savepoint_rollback(conn: Any) -> None:
    conn.execute(queries.ATTEMPT_SAVEPOINT_ROLLBACK)


def run_take(
    conn: Any,
    run_id: int,
    *,
    attempt: int,
    max_attempts: int,
    lease: float,
    token: UUID,
    worker: str,
    now: datetime | None = None,
) -> tuple[Any, str | None, UUID | None]:
    """Take the run `run_id` as a claim would, on its `attempt`; returns its payload (decoded
    as a claim decodes it), tenant and result id."""
    params = {
        "id": run_id,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "lease": lease,
        "token": token,
        "worker": worker,
        "now": now,
    }
    payload, tenant_id, result_id = conn.execute(queries.RUN_TAKE, params).fetchone()
    return json.loads(payload), tenant_id, result_id


def run_delete(conn: Any, run_id: int) -> None:
    conn.execute(queries.RUN_DELETE, {"id": run_id})


def server_database_exists(conn: Any, name: str) -> bool:
    return bool(conn.execute(queries.SERVER_DATABASE_EXISTS, {"name": name}).fetchone()[0])


def server_database_create(conn: Any, name: str) -> None:
    """Create the database `name`, unless another session just did; on an autocommit
    connection."""
    import contextlib

    import psycopg
    from psycopg import sql

    with contextlib.suppress(psycopg.errors.DuplicateDatabase):
        conn.execute(sql.SQL(queries.SERVER_DATABASE_CREATE).format(name=sql.Identifier(name)))
