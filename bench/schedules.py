"""Benchmark: how long one materialize pass takes for many due schedules.

    python bench/schedules.py

Creates a scratch database on the server of $JOBRUNNER_DATABASE_URL (or the embedded server),
runs every case once, prints a table and drops the database. The cases time one
`Materializer.run()`, the first step of a tick, from the database clock read to the last
commit: locking due definitions in batches, computing their occurrences, inserting the runs
and moving the high-water marks.

`run_schedule_benchmarks(database_url)` runs the same cases on an existing (migrated or
empty) database and returns seconds per case, for a harness to call.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DUE_DEFINITIONS = 10_000
TENANTS = 100_000
TARGET_SECONDS = 2.0
BATCH_SIZE = 1000  # what a tick with the default --batch-size (100) materializes at once

# 10 expressions x 5 timezones: what ten thousand definitions due in the same minute look like
# in practice (they fire together because they share a handful of schedules).
SHARED_EXPRESSIONS = (
    "* * * * *",
    "*/2 * * * *",
    "*/5 * * * *",
    "*/10 * * * *",
    "*/15 * * * *",
    "*/30 * * * *",
    "0 * * * *",
    "0,30 * * * *",
    "0 */2 * * *",
    "0-59/20 * * * *",
)
TIMEZONES = (
    "UTC",
    "Europe/Amsterdam",
    "America/New_York",
    "Asia/Tokyo",
    "Australia/Sydney",
    "America/Santiago",
    "Asia/Kolkata",
)


@dataclass(frozen=True)
class Case:
    name: str
    prepare: Callable[[Any], int]  # fills the database; returns the runs one pass must create
    tenants_sql: str | None = None


def _shared_schedules(conn: Any) -> int:
    """10,000 due definitions over 50 (schedule, timezone) pairs, each with its own mark."""
    combos = [(e, tz) for e in SHARED_EXPRESSIONS for tz in TIMEZONES[:5]]
    _insert_definitions(conn, [combos[i % len(combos)] for i in range(DUE_DEFINITIONS)], "2 hours")
    return DUE_DEFINITIONS


def _distinct_schedules(conn: Any) -> int:
    """10,000 due definitions, no two alike: daily at every minute of the day, in 7 zones.

    The worst case for occurrence maths (nothing can be shared), as after a day of downtime.
    """
    combos = [(f"{m} {h} * * *", tz) for tz in TIMEZONES for h in range(24) for m in range(60)]
    _insert_definitions(conn, combos[:DUE_DEFINITIONS], "1 day")
    return DUE_DEFINITIONS


def _insert_definitions(conn: Any, combos: list[tuple[str, str]], behind: str) -> None:
    # Marks `behind` in the past (each a millisecond apart, so none is shared by accident),
    # next_fire_at already passed: every definition is due and has one occurrence to make.
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, timezone, materialized_through,"
        " next_fire_at)"
        " SELECT 'bench-' || i, 'bench.noop', c.schedule, c.timezone,"
        f"  now() - interval '{behind}' - i * interval '1 millisecond', now() - interval '1 second'"
        " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS c(schedule, timezone, i)",
        [[c[0] for c in combos], [c[1] for c in combos]],
    )


def _tenant_fanout(conn: Any) -> int:
    """One tenant-scoped definition due once, over TENANTS tenants."""
    conn.execute("CREATE TABLE bench_tenants (id text PRIMARY KEY)")
    conn.execute(
        "INSERT INTO bench_tenants SELECT 'tenant-' || i FROM generate_series(1, %s) i", [TENANTS]
    )
    conn.execute("ANALYZE bench_tenants")
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, scope, materialized_through,"
        " next_fire_at) VALUES ('bench-tenants', 'bench.noop', '*/5 * * * *', 'tenant',"
        " now() - interval '10 minutes', now() - interval '1 second')"
    )
    return TENANTS


CASES = (
    Case(f"{DUE_DEFINITIONS:,} due definitions, 50 shared schedules", _shared_schedules),
    Case(f"{DUE_DEFINITIONS:,} due definitions, all schedules distinct", _distinct_schedules),
    Case(
        f"1 tenant-scoped definition x {TENANTS:,} tenants",
        _tenant_fanout,
        tenants_sql="SELECT id FROM bench_tenants",
    ),
)


def _reset(conn: Any) -> None:
    conn.execute("DROP TABLE IF EXISTS bench_tenants")
    conn.execute("DELETE FROM job_runs WHERE job_type = 'bench.noop'")
    conn.execute("DELETE FROM job_definitions WHERE name LIKE 'bench-%'")


def run_schedule_benchmarks(database_url: str) -> dict[str, float]:
    """Seconds of one materialize pass per case, on `database_url` (migrated if needed).

    Only rows the benchmark creates are touched, and they are removed afterwards.
    """
    from cronjob import migrate
    from cronjob.db import connect
    from cronjob.materialize import Materializer

    results: dict[str, float] = {}
    conn = connect(database_url)
    try:
        migrate.apply(conn)
        for case in CASES:
            _reset(conn)
            expected = case.prepare(conn)
            conn.execute("ANALYZE job_definitions")
            conn.execute("VACUUM ANALYZE job_runs")
            materializer = Materializer(
                tenants_sql=case.tenants_sql, batch_size=BATCH_SIZE, log=_Quiet()
            )
            started = time.perf_counter()
            created = materializer.run(conn)
            results[case.name] = time.perf_counter() - started
            if created != expected or materializer.problems:
                raise RuntimeError(
                    f"{case.name}: created {created} runs, expected {expected}"
                    f" ({materializer.problems[:1]})"
                )
        _reset(conn)
        started = time.perf_counter()
        Materializer(log=_Quiet()).run(conn)
        results["idle pass (nothing due)"] = time.perf_counter() - started
    finally:
        _reset(conn)
        conn.close()
    return results


class _Quiet:
    def info(self, *args: Any, **kwargs: Any) -> None:
        pass

    error = info


def main() -> int:
    import psycopg
    from psycopg import conninfo

    from cronjob import embedded

    server = os.environ.get("JOBRUNNER_DATABASE_URL") or embedded.url()
    name = f"jobrunner_bench_schedules_{os.getpid()}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = conninfo.make_conninfo(server, dbname=name)
        results = run_schedule_benchmarks(url)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    width = max(len(case) for case in results)
    print(f"{'case':<{width}}  seconds  target")
    for case, seconds in results.items():
        verdict = (
            ""
            if case.startswith("idle")
            else ("ok" if seconds < TARGET_SECONDS else f"over {TARGET_SECONDS:g} s")
        )
        print(f"{case:<{width}}  {seconds:7.3f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
