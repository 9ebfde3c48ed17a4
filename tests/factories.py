"""Rows and ticks for the tests, built with defaults and overridden by name.

A test says only what matters to it: `insert_run(conn, status="dead", attempts=3)` is a
dead run on its third attempt, with everything else a run in that state has (a finish
time, or a lease while it runs) filled in. A column jobrunner adds later touches these
helpers, not every test that makes a row.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from cronjob.db import Database, connect
from cronjob.handlers import registry
from cronjob.report import TickReport
from cronjob.tick import TickOptions, run_tick

# -- runs --

TERMINAL = ("succeeded", "dead", "cancelled")


def now(offset: str | None = None) -> sql.Composable:
    """The database clock, as a value for a column: `now("1 hour")`, `now("-5 minutes")`."""
    if offset is None:
        return sql.SQL("now()")
    return sql.SQL("now() + {}::interval").format(sql.Literal(offset))


def _run_columns(job_type: str, columns: dict[str, Any]) -> dict[str, Any]:
    """The columns of a run of `job_type` as a test asks for them, made whole for its status:
    a finished run has a finish time, a running one a lease (the schema's constraints)."""
    row: dict[str, Any] = {"job_type": job_type, **columns}
    if isinstance(row.get("payload"), dict | list):
        row["payload"] = Jsonb(row["payload"])
    status = row.get("status", "queued")
    if status in TERMINAL:
        row.setdefault("finished_at", now())
    if status == "running":
        row.setdefault("locked_by", "tests:1")
        row.setdefault("locked_until", now("1 hour"))
        row.setdefault("lease_token", sql.SQL("gen_random_uuid()"))
        row.setdefault("attempts", 1)
        row.setdefault("started_at", now())
    return row


def _value(value: Any) -> sql.Composable:
    return value if isinstance(value, sql.Composable) else sql.Literal(value)


def insert_run(conn: Any, job_type: str = "test.ok", **columns: Any) -> int:
    """One run of `job_type`, every column of job_runs settable by name (a value, or SQL such
    as `now("1 hour")`); returns its id."""
    return insert_runs(conn, 1, job_type, **columns)[0]


def insert_runs(conn: Any, count: int, job_type: str = "test.ok", **columns: Any) -> list[int]:
    """`count` runs alike, as `insert_run` makes one; returns their ids in order.

    A value given as SQL may use `i`, the row's number from 1:
    `payload=sql.SQL("jsonb_build_object('i', i)")`.
    """
    row = _run_columns(job_type, columns)
    statement = sql.SQL(
        "INSERT INTO job_runs ({columns})"
        " SELECT {values} FROM generate_series(1, {count}) AS i RETURNING id"
    ).format(
        columns=sql.SQL(", ").join(map(sql.Identifier, row)),
        values=sql.SQL(", ").join(_value(value) for value in row.values()),
        count=sql.Literal(count),
    )
    return sorted(r[0] for r in conn.execute(statement).fetchall())


# -- ticks --


def tick(
    db_url: str,
    *types: str,
    database: Database | None = None,
    conn: Any = None,
    **options: Any,
) -> TickReport:
    """One tick in this process for the registered handlers of `types` (none: it claims
    nothing) and those given as `handlers=` (by job type), with TickOptions by name
    (`now=` pins its clock); returns its report.

    It runs on `conn` when given (the caller's, left open), else on a connection of its
    own; `database` opens every other connection (by default `db_url`'s), for a test that
    counts or refuses them. The test process keeps its signals.
    """
    handlers = {job_type: registry()[job_type] for job_type in types}
    handlers.update(options.pop("handlers", None) or {})
    tick_options = TickOptions(**{"owns_process": False, **options})
    own = conn is None
    conn = connect(db_url) if own else conn
    try:
        database = database or Database(db_url)
        return run_tick(conn, handlers, database=database, options=tick_options)
    finally:
        if own:
            conn.close()
