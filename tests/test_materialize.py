"""Materializing schedules through a real tick: exactly once, catch-up policies, the high-water
mark, tenant fan-out, daylight-saving days.

Time is driven through the database: each tick is given a `now`, nothing sleeps.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import definitions
from cronjob.cron import apply_catch_up, next_after, occurrences
from cronjob.db import connect
from cronjob.handlers import handler
from cronjob.materialize import plan
from cronjob.models import DueDefinition
from cronjob.report import TickReport
from tests import factories
from tests.conftest import ROOT, count

T0 = datetime(2026, 5, 12, 10, 0, tzinfo=UTC)
TENANTS_SQL = "SELECT id FROM tenants ORDER BY id"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def tick(
    db_url: str,
    now: datetime,
    *,
    types: tuple[str, ...] = (),
    tenants_sql: str | None = None,
    batch_size: int = 100,
    conn: Any = None,
) -> TickReport:
    """One tick at `now`. With no `types` nothing is claimed, so created runs stay queued."""
    return factories.tick(
        db_url, *types, now=now, tenants_sql=tenants_sql, materialize_batch=batch_size, conn=conn
    )


def define(conn: Any, name: str, cron: str, *, at: datetime | None = T0, **fields: Any) -> Any:
    """Add a definition as if at `at` (None: the database clock)."""
    spec = definitions.definition_spec(
        name, cron=cron, job_type=fields.pop("type", "test.ok"), **fields
    )
    return definitions.add(conn, spec, now=at)


def scheduled(conn: Any, name: str | None = None) -> list[datetime]:
    rows = conn.execute(
        "SELECT r.scheduled_for FROM job_runs r JOIN job_definitions d ON d.id = r.definition_id"
        " WHERE %(name)s::text IS NULL OR d.name = %(name)s ORDER BY r.scheduled_for, r.id",
        {"name": name},
    ).fetchall()
    return [r[0] for r in rows]


def mark(conn: Any, name: str) -> tuple[datetime, datetime]:
    return conn.execute(
        "SELECT materialized_through, next_fire_at FROM job_definitions WHERE name = %s", [name]
    ).fetchone()


@pytest.fixture
def tenants(conn: Any) -> Iterator[Any]:
    conn.execute("DROP TABLE IF EXISTS tenants")
    conn.execute("CREATE TABLE tenants (id integer PRIMARY KEY)")
    conn.execute("INSERT INTO tenants SELECT generate_series(1, 3)")
    yield conn
    conn.execute("DROP TABLE IF EXISTS tenants")


# -- when runs appear ---------------------------------------------------------


def test_a_new_definition_starts_from_its_creation_time(db_url, conn):
    define(conn, "every5", "*/5 * * * *", at=T0 + timedelta(minutes=2))
    assert tick(db_url, T0 + timedelta(minutes=4)).materialized == 0
    report = tick(db_url, T0 + timedelta(minutes=5, seconds=3))
    assert report.materialized == 1
    assert scheduled(conn) == [T0 + timedelta(minutes=5)]


def test_a_run_carries_the_definitions_fields_and_is_due_at_its_occurrence(db_url, conn):
    define(
        conn,
        "report",
        "*/5 * * * *",
        type="test.fail",
        payload={"to": "ops"},
        max_attempts=7,
        priority=-2,
    )
    tick(db_url, T0 + timedelta(minutes=6))
    row = conn.execute(
        "SELECT r.definition_id = d.id, r.job_type, r.payload, r.tenant_id, r.scheduled_for,"
        " r.run_at, r.max_attempts, r.priority, r.idempotency_key, r.status"
        " FROM job_runs r, job_definitions d"
    ).fetchone()
    occurrence = T0 + timedelta(minutes=5)
    assert row == (
        True,
        "test.fail",
        {"to": "ops"},
        None,
        occurrence,
        occurrence,
        7,
        -2,
        None,
        "queued",
    )


def test_a_materialized_run_is_claimed_and_run_in_the_same_tick(db_url, conn):
    define(conn, "every5", "*/5 * * * *")
    report = tick(db_url, T0 + timedelta(minutes=5, seconds=1), types=("test.ok",))
    assert (report.materialized, report.claimed, report.succeeded) == (1, 1, 1)


def test_a_second_tick_at_the_same_moment_creates_nothing(db_url, conn):
    define(conn, "every5", "*/5 * * * *")
    now = T0 + timedelta(minutes=5, seconds=1)
    assert tick(db_url, now).materialized == 1
    assert tick(db_url, now).materialized == 0
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def test_consecutive_ticks_create_each_occurrence_once(db_url, conn):
    define(conn, "every5", "*/5 * * * *")
    for minute in range(1, 31):
        tick(db_url, T0 + timedelta(minutes=minute, seconds=20))
    assert scheduled(conn) == [T0 + timedelta(minutes=m) for m in range(5, 31, 5)]


# -- missed occurrences -----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "tick_after", "expected_minutes"),
    [
        ("latest", timedelta(minutes=17), [15]),
        ("all", timedelta(minutes=17), [5, 10, 15]),
        # the 10:15 occurrence is 2.5 minutes old: missed, skipped
        ("none", timedelta(minutes=17, seconds=30), []),
        # within the grace period it is the current occurrence, and runs
        ("none", timedelta(minutes=16), [15]),
    ],
)
def test_missed_occurrences_follow_the_catch_up_policy(
    db_url, conn, policy, tick_after, expected_minutes
):
    define(conn, "every5", "*/5 * * * *", catch_up=policy)
    tick(db_url, T0 + tick_after)
    assert scheduled(conn) == [T0 + timedelta(minutes=m) for m in expected_minutes]


def test_catch_up_all_is_bounded_to_the_newest_occurrences(db_url, conn):
    define(conn, "every5", "*/5 * * * *", catch_up="all", catch_up_limit=2)
    tick(db_url, T0 + timedelta(hours=2, seconds=10))
    assert scheduled(conn) == [T0 + timedelta(minutes=115), T0 + timedelta(minutes=120)]


def test_occurrences_a_policy_dropped_are_never_considered_again(db_url, conn):
    define(conn, "every5", "*/5 * * * *", catch_up="none")
    tick(db_url, T0 + timedelta(minutes=17, seconds=30))
    assert mark(conn, "every5") == (T0 + timedelta(minutes=15), T0 + timedelta(minutes=20))
    tick(db_url, T0 + timedelta(minutes=20, seconds=5))
    assert scheduled(conn) == [T0 + timedelta(minutes=20)]


def test_a_month_of_downtime_with_latest_makes_one_run(db_url, conn):
    define(conn, "minutely", "* * * * *")
    report = tick(db_url, T0 + timedelta(days=30, seconds=5))
    assert report.materialized == 1
    assert scheduled(conn) == [T0 + timedelta(days=30)]


# -- the high-water mark --------------------------------------------------------


def test_the_mark_and_next_fire_time_advance_with_the_runs(db_url, conn):
    define(conn, "every5", "*/5 * * * *")
    assert mark(conn, "every5") == (T0, T0 + timedelta(minutes=5))
    tick(db_url, T0 + timedelta(minutes=7))
    assert mark(conn, "every5") == (T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))


def test_pruned_runs_are_never_created_again(db_url, conn):
    define(conn, "every5", "*/5 * * * *", catch_up="all")
    tick(db_url, T0 + timedelta(minutes=17))
    conn.execute("DELETE FROM job_runs")
    assert tick(db_url, T0 + timedelta(minutes=17)).materialized == 0
    assert tick(db_url, T0 + timedelta(minutes=19)).materialized == 0
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_a_clock_earlier_than_a_previous_tick_creates_nothing(db_url, conn):
    define(conn, "every5", "*/5 * * * *", catch_up="all")
    tick(db_url, T0 + timedelta(minutes=17))
    before = mark(conn, "every5")
    conn.execute("DELETE FROM job_runs")
    for minutes in (16, 7, 1):
        assert tick(db_url, T0 + timedelta(minutes=minutes)).materialized == 0
    assert mark(conn, "every5") == before


def test_definitions_created_at_different_times_each_get_their_own_occurrences(db_url, conn):
    # They share a schedule, so the materializer evaluates it once for all of them.
    for minute in (0, 4, 6, 11):
        define(
            conn, f"from-{minute}", "*/5 * * * *", at=T0 + timedelta(minutes=minute), catch_up="all"
        )
    tick(db_url, T0 + timedelta(minutes=12))
    minutes = {
        name: [round((t - T0).total_seconds() / 60) for t in scheduled(conn, name)]
        for name in ("from-0", "from-4", "from-6", "from-11")
    }
    assert minutes == {"from-0": [5, 10], "from-4": [5, 10], "from-6": [10], "from-11": []}


def test_more_due_definitions_than_a_batch_are_all_materialized(db_url, conn):
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, materialized_through,"
        " next_fire_at) SELECT 'd' || i, 'test.ok', '*/5 * * * *', %s, %s"
        " FROM generate_series(1, 250) AS i",
        [T0, T0 + timedelta(minutes=5)],
    )
    report = tick(db_url, T0 + timedelta(minutes=5, seconds=1), batch_size=100)
    assert report.materialized == 250
    assert count(conn, "SELECT count(DISTINCT definition_id) FROM job_runs") == 250


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("schedule", "0 " + "1" * 5000 + " * * *", "out of range"),
        ("timezone", "Mars/Olympus_Mons", "unknown timezone"),
    ],
)
def test_a_definition_written_badly_by_sql_fails_only_itself(db_url, conn, column, value, reason):
    define(conn, "fine", "*/5 * * * *")
    define(conn, "poison", "*/5 * * * *")
    conn.execute(f"UPDATE job_definitions SET {column} = %s WHERE name = 'poison'", [value])
    report = tick(db_url, T0 + timedelta(minutes=5, seconds=1), types=("test.ok",))
    assert (report.materialized, report.succeeded) == (1, 1)
    [problem] = report.problems
    assert problem.definition == "poison" and reason in problem.reason
    assert len(problem.reason) < 400
    assert mark(conn, "poison") == (T0, T0 + timedelta(minutes=5))


def test_a_schedule_that_stopped_parsing_is_reported_and_does_not_spin(db_url, conn):
    define(conn, "fine", "*/5 * * * *")
    define(conn, "broken", "*/5 * * * *")
    conn.execute("UPDATE job_definitions SET schedule = '0 0 31 2 *' WHERE name = 'broken'")
    report = tick(db_url, T0 + timedelta(minutes=5, seconds=1))
    assert report.materialized == 1
    assert [p.definition for p in report.problems] == ["broken"]
    assert "never fires" in report.problems[0].reason
    assert mark(conn, "broken") == (T0, T0 + timedelta(minutes=5))


def test_a_shared_evaluation_gives_each_definition_what_it_would_get_alone():
    # Definitions sharing a schedule share one evaluation, across batches too; whatever their
    # marks and policies, each must get exactly what evaluating it on its own gives.
    generator = random.Random(20261025)
    now = utc("2026-10-25T01:40")  # inside Amsterdam's repeated hour
    batch = [
        DueDefinition(
            id=i,
            name=f"d{i}",
            scope="global",
            schedule=generator.choice(["*/20 * * * *", "30 2 * * *", "0 * * * *", "* * * * *"]),
            timezone=generator.choice(["Europe/Amsterdam", "UTC", "America/New_York"]),
            catch_up=generator.choice(["latest", "all", "none"]),
            catch_up_limit=generator.choice([1, 3, 100]),
            materialized_through=now - timedelta(minutes=generator.randrange(1, 3000)),
        )
        for i in range(300)
    ]
    evaluations: dict[Any, Any] = {}
    advances = []
    for start in range(0, len(batch), 37):
        planned, failed = plan(batch[start : start + 37], now, evaluations)
        assert failed == []
        advances += planned
    assert len(advances) == len(batch)
    for advance in advances:
        d = advance.definition
        due = occurrences(d.schedule, d.timezone, d.materialized_through, now)
        alone = apply_catch_up(due, d.catch_up, now, bound=d.catch_up_limit)
        assert list(advance.scheduled_fors) == alone, d
        assert advance.materialized_through == (due[-1] if due else d.materialized_through)
        assert advance.next_fire_at == next_after(d.schedule, d.timezone, now)[0]


# -- pause, resume, change ---------------------------------------------------------


def test_a_paused_definition_makes_no_runs_and_resuming_does_not_make_up_for_it(db_url, conn):
    define(conn, "every5", "*/5 * * * *", catch_up="all")
    definitions.pause(conn, "every5", now=T0 + timedelta(minutes=1))
    assert tick(db_url, T0 + timedelta(minutes=20)).materialized == 0
    definitions.resume(conn, "every5", now=T0 + timedelta(minutes=31))
    assert mark(conn, "every5") == (T0 + timedelta(minutes=31), T0 + timedelta(minutes=35))
    assert tick(db_url, T0 + timedelta(minutes=34)).materialized == 0
    tick(db_url, T0 + timedelta(minutes=35, seconds=1))
    assert scheduled(conn) == [T0 + timedelta(minutes=35)]


def test_a_changed_schedule_starts_afresh_from_the_change(db_url, conn):
    define(conn, "report", "*/5 * * * *", catch_up="all")
    tick(db_url, T0 + timedelta(minutes=5, seconds=1))
    spec = definitions.definition_spec(
        "report", cron="15 10 * * *", job_type="test.ok", catch_up="all"
    )
    definitions.sync(conn, [spec], now=T0 + timedelta(minutes=20))
    assert mark(conn, "report") == (T0 + timedelta(minutes=20), T0 + timedelta(days=1, minutes=15))
    tick(db_url, T0 + timedelta(days=1, minutes=16))
    # 10:15 on the day of the change came before the change: not made up
    assert scheduled(conn) == [T0 + timedelta(minutes=5), T0 + timedelta(days=1, minutes=15)]


# -- tenants --------------------------------------------------------------------------


def test_a_tenant_scoped_definition_makes_one_run_per_tenant(db_url, tenants):
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    report = tick(db_url, T0 + timedelta(minutes=5), tenants_sql=TENANTS_SQL)
    assert report.materialized == 3
    rows = tenants.execute("SELECT tenant_id, scheduled_for FROM job_runs ORDER BY tenant_id")
    assert rows.fetchall() == [(str(i), T0 + timedelta(minutes=5)) for i in (1, 2, 3)]


def test_tenants_created_later_get_runs_from_the_next_occurrence(db_url, tenants):
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    tick(db_url, T0 + timedelta(minutes=5), tenants_sql=TENANTS_SQL)
    tenants.execute("INSERT INTO tenants VALUES (4)")
    tick(db_url, T0 + timedelta(minutes=10), tenants_sql=TENANTS_SQL)
    rows = tenants.execute(
        "SELECT scheduled_for, array_agg(tenant_id ORDER BY tenant_id) FROM job_runs"
        " GROUP BY scheduled_for ORDER BY scheduled_for"
    ).fetchall()
    assert rows == [
        (T0 + timedelta(minutes=5), ["1", "2", "3"]),
        (T0 + timedelta(minutes=10), ["1", "2", "3", "4"]),
    ]


def test_an_occurrence_with_some_runs_already_gets_only_the_missing_ones(db_url, tenants):
    # A mark moved back by hand (say, a restored backup) meets runs that exist already.
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    tick(db_url, T0 + timedelta(minutes=5), tenants_sql=TENANTS_SQL)
    tenants.execute("DELETE FROM job_runs WHERE tenant_id = '2'")
    tenants.execute(
        "UPDATE job_definitions SET materialized_through = %s, next_fire_at = %s",
        [T0, T0 + timedelta(minutes=5)],
    )
    report = tick(db_url, T0 + timedelta(minutes=5), tenants_sql=TENANTS_SQL)
    assert (report.materialized, report.problems) == (1, [])
    assert scheduled(tenants) == [T0 + timedelta(minutes=5)] * 3


def test_the_tenant_query_may_repeat_ids_return_nulls_or_blanks_and_use_percent_signs(
    db_url, tenants
):
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    query = (
        "SELECT id::text, 'extra column' -- columns after the first are ignored\n"
        "FROM tenants WHERE id::text LIKE '%'"
        " UNION ALL SELECT id::text, 'again' FROM tenants UNION ALL SELECT NULL, 'none'"
        " UNION ALL SELECT '', 'empty';\n"
    )
    report = tick(db_url, T0 + timedelta(minutes=5), tenants_sql=query)
    assert report.problems == []
    assert report.materialized == 3


def test_the_handler_sees_its_tenant(db_url, tenants, fresh_registry):
    seen: list[tuple[str | None, datetime | None]] = []

    @handler("test.tenant_report")
    def tenant_report(ctx: Any, payload: Any) -> None:
        seen.append((ctx.tenant_id, ctx.scheduled_for))

    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant", type="test.tenant_report")
    tick(db_url, T0 + timedelta(minutes=5), tenants_sql=TENANTS_SQL, types=("test.tenant_report",))
    assert sorted(seen) == [(str(i), T0 + timedelta(minutes=5)) for i in (1, 2, 3)]


def test_a_tenant_scoped_definition_without_a_tenant_query_waits_and_is_reported(db_url, tenants):
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    define(tenants, "global", "*/5 * * * *")
    report = tick(db_url, T0 + timedelta(minutes=5))
    assert report.materialized == 1  # the global one
    assert [p.definition for p in report.problems] == ["per-tenant"]
    assert "no tenant query" in report.problems[0].reason
    assert mark(tenants, "per-tenant") == (T0, T0 + timedelta(minutes=5))
    # Once configured, the missed occurrences follow the policy (latest: the newest only).
    tick(db_url, T0 + timedelta(minutes=12), tenants_sql=TENANTS_SQL)
    assert scheduled(tenants, "per-tenant") == [T0 + timedelta(minutes=10)] * 3


def test_a_failing_tenant_query_is_reported_and_the_rest_of_the_batch_is_kept(db_url, tenants):
    define(tenants, "per-tenant", "*/5 * * * *", scope="tenant")
    define(tenants, "global", "*/5 * * * *")
    report = tick(db_url, T0 + timedelta(minutes=5), tenants_sql="SELECT id FROM no_such_table")
    assert report.materialized == 1
    [problem] = report.problems
    assert problem.definition == "per-tenant"
    assert "tenant query failed" in problem.reason and "no_such_table" in problem.reason
    assert scheduled(tenants) == [T0 + timedelta(minutes=5)]


# -- daylight-saving days, end to end -------------------------------------------------
# Rows of the table of docs/guides/schedules.md, materialized by ticks every ten minutes across
# the transition.

DST_DAYS = [
    pytest.param(
        "Europe/Amsterdam",
        "30 2 * * *",
        "2026-10-24T12:00",
        "2026-10-26T12:00",
        ["2026-10-25T00:30", "2026-10-26T01:30"],
        id="amsterdam-repeated-0230-runs-once",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "30 2 * * *",
        "2026-03-28T12:00",
        "2026-03-30T12:00",
        ["2026-03-29T01:00", "2026-03-30T00:30"],
        id="amsterdam-skipped-0230-runs-after-the-jump",
    ),
    pytest.param(
        "America/New_York",
        "*/30 * * * *",
        "2026-11-01T04:45",
        "2026-11-01T07:05",
        [
            "2026-11-01T05:00",
            "2026-11-01T05:30",
            "2026-11-01T06:00",
            "2026-11-01T06:30",
            "2026-11-01T07:00",
        ],
        id="new-york-half-hourly-runs-both-repeated-hours",
    ),
    pytest.param(
        "America/Santiago",
        "0 0 * * *",
        "2026-09-05T12:00",
        "2026-09-06T12:00",
        ["2026-09-06T04:00"],
        id="santiago-skipped-midnight-runs-at-0100",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "45 1 * * *",
        "2026-04-04T00:00",
        "2026-04-05T20:00",
        ["2026-04-04T14:45", "2026-04-05T15:15"],
        id="lord-howe-half-hour-shift-runs-once",
    ),
]


@pytest.mark.parametrize(("zone", "cron", "start", "end", "expected"), DST_DAYS)
def test_ticks_across_a_transition_create_exactly_the_runs_of_the_table(
    db_url, conn, zone, cron, start, end, expected
):
    define(conn, "dst", cron, at=utc(start), timezone=zone)
    moment = utc(start)
    with connect(db_url) as ticking:
        while moment < utc(end):
            moment += timedelta(minutes=10)
            tick(db_url, moment, conn=ticking)
    assert scheduled(conn) == [utc(t) for t in expected]


# -- cost of an idle tick ------------------------------------------------------------


def test_an_idle_tick_does_not_import_the_cron_library(db_url, conn):
    define(conn, "next-new-year", "0 0 1 1 *", at=None)
    code = (
        "import sys\n"
        "from cronjob.db import connect\n"
        "from cronjob.materialize import Materializer\n"
        f"conn = connect({db_url!r})\n"
        "assert Materializer().run(conn) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith(('croniter', 'cronjob.cron'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_definition_can_not_break_the_mark_invariant(conn):
    define(conn, "every5", "*/5 * * * *")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE job_definitions SET next_fire_at = materialized_through")
