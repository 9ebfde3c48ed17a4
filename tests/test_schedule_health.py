"""Schedule health: each schedule's last success and failure, and `check --stale-schedules`.

Ticks run with their clock pinned to chosen moments, and the verdict is read at the same
moments, so the window is exercised minute by minute without waiting for it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import store
from cronjob.staleness import stale_schedules
from tests.conftest import run_cli
from tests.factories import tick


def add(db_url: str, name: str, job_type: str, *args: str) -> None:
    result = run_cli(
        "schedule",
        "add",
        name,
        "--cron",
        "*/5 * * * *",
        "--type",
        job_type,
        "--database-url",
        db_url,
        *args,
    )
    assert result.exit_code == 0, result.stderr


@pytest.fixture
def t0(conn) -> datetime:
    """A five-minute boundary two hours ago: every definition's start."""
    return conn.execute("SELECT date_trunc('hour', now()) - interval '2 hours'").fetchone()[0]


def start_at(conn, t0: datetime) -> None:
    conn.execute(
        "UPDATE job_definitions SET updated_at = %s, materialized_through = %s, next_fire_at = %s",
        [t0, t0, t0 + timedelta(minutes=5)],
    )


def an_hour_ago(conn) -> None:
    """Every definition created an hour ago, and due since: real ticks and `check` see it so."""
    conn.execute(
        "UPDATE job_definitions SET created_at = now() - interval '1 hour',"
        " updated_at = now() - interval '1 hour',"
        " materialized_through = now() - interval '1 hour',"
        " next_fire_at = now() - interval '55 minutes'"
    )


def verdicts(conn, now: datetime, **options):
    rows = store.definitions_list_health(conn, now=now)
    return {v.name: v for v in stale_schedules(rows, **options)}


def first_stale(db_url, conn, t0, name, job_type, **tick_options) -> timedelta | None:
    """Tick every five minutes for 40 minutes; when (after t0) did `name` first go stale?"""
    for minute in range(5, 45, 5):
        now = t0 + timedelta(minutes=minute, seconds=10)
        tick(db_url, job_type, now=now, **tick_options)
        if verdicts(conn, now)[name].stale:
            return now - t0
    return None


def test_a_handler_that_always_fails_breaches_within_its_window(db_url, conn, t0):
    add(db_url, "always-fails", "test.give_up")
    start_at(conn, t0)
    # The window of */5 is two intervals plus the lease: 12 minutes. The first occurrence
    # (t0+5m) failed; it is overdue from t0+17m, which the tick at t0+20m sees.
    assert first_stale(db_url, conn, t0, "always-fails", "test.give_up") == timedelta(
        minutes=20, seconds=10
    )
    [verdict] = verdicts(conn, t0 + timedelta(minutes=40)).values()
    assert verdict.last_success_at is None and verdict.last_failure_at is not None
    assert "permanently broken" in verdict.last_failure_error
    assert verdict.window == 12 * 60


def test_a_healthy_schedule_passes(db_url, conn, t0):
    add(db_url, "healthy", "test.ok")
    start_at(conn, t0)
    assert first_stale(db_url, conn, t0, "healthy", "test.ok") is None
    [verdict] = verdicts(conn, t0 + timedelta(minutes=40)).values()
    assert verdict.last_success_at is not None and verdict.last_failure_at is None


def test_a_tenant_query_returning_no_tenants_breaches(db_url, conn, t0):
    add(db_url, "no-tenants", "test.ok", "--scope", "tenant")
    start_at(conn, t0)
    empty = "SELECT 'tenant' WHERE false"
    assert first_stale(db_url, conn, t0, "no-tenants", "test.ok", tenants_sql=empty) == timedelta(
        minutes=20, seconds=10
    )


def test_a_tenant_scoped_schedule_succeeding_for_its_tenants_passes(db_url, conn, t0):
    add(db_url, "tenants", "test.ok", "--scope", "tenant")
    start_at(conn, t0)
    some = "SELECT unnest(ARRAY['a', 'b'])"
    assert first_stale(db_url, conn, t0, "tenants", "test.ok", tenants_sql=some) is None


def test_expect_within_replaces_the_derived_window(db_url, conn, t0):
    add(db_url, "patient", "test.give_up", "--expect-within", "30m")
    start_at(conn, t0)
    # The first failed occurrence (t0+5m) is overdue from t0+35m.
    assert first_stale(db_url, conn, t0, "patient", "test.give_up") == timedelta(
        minutes=35, seconds=10
    )


def test_check_names_every_stale_schedule_and_leaves_paused_ones_out(db_url, conn):
    add(db_url, "broken", "test.give_up")
    add(db_url, "paused-broken", "test.give_up")
    add(db_url, "fine", "test.ok")
    an_hour_ago(conn)
    tick(db_url, "test.give_up", "test.ok")
    assert run_cli("schedule", "pause", "paused-broken", "--database-url", db_url).exit_code == 0

    result = run_cli("check", "--stale-schedules", "--database-url", db_url)
    assert result.exit_code == 1
    [line] = result.stdout.splitlines()
    assert line.startswith("BREACHED stale-schedules=0: 1 stale schedule(s): broken (")
    assert "never succeeded" in line and "permanently broken" in line

    result = run_cli("check", "--stale-schedules", "--include-paused", "--database-url", db_url)
    assert result.exit_code == 1
    assert "2 stale schedule(s): broken (" in result.stdout and "; paused-broken (" in result.stdout
    assert "fine" not in result.stdout

    found = json.loads(
        run_cli("check", "--stale-schedules", "--json", "--database-url", db_url).stdout
    )
    assert found["ok"] is False and found["findings"][0]["value"] == 1


def test_status_and_metrics_show_the_health_of_each_schedule(db_url, conn):
    add(db_url, "broken", "test.give_up")
    add(db_url, "fine", "test.ok")
    an_hour_ago(conn)
    tick(db_url, "test.give_up", "test.ok")

    status = json.loads(run_cli("status", "--json", "--database-url", db_url).stdout)
    by_name = {s["name"]: s for s in status["schedules"]}
    assert by_name["broken"]["stale"] is True and by_name["broken"]["last_success_at"] is None
    assert by_name["fine"]["stale"] is False and by_name["fine"]["last_success_at"]
    text = run_cli("status", "--database-url", db_url).stdout
    assert "stale schedules: broken (" in text

    metrics = run_cli("metrics", "--database-url", db_url).stdout
    assert 'jobrunner_schedule_stale{schedule="broken"} 1' in metrics
    assert 'jobrunner_schedule_stale{schedule="fine"} 0' in metrics
    assert 'jobrunner_schedule_last_success_timestamp_seconds{schedule="broken"} 0' in metrics
    [fine] = [
        line
        for line in metrics.splitlines()
        if line.startswith('jobrunner_schedule_last_success_timestamp_seconds{schedule="fine"}')
    ]
    assert float(fine.split()[-1]) > 0


def test_check_without_anything_to_check_is_bad_usage(db_url):
    result = run_cli("check", "--include-paused", "--database-url", db_url)
    assert result.exit_code == 2


def test_show_summarises_the_tenants_of_the_newest_occurrence(db_url, conn):
    add(db_url, "per-tenant", "test.ok", "--scope", "tenant")
    an_hour_ago(conn)
    tick(db_url, "test.ok", tenants_sql="SELECT unnest(ARRAY['a', 'b', 'c'])")

    shown = json.loads(
        run_cli("schedule", "show", "per-tenant", "--json", "--database-url", db_url).stdout
    )
    health = shown["health"]
    assert health["stale"] is False and health["last_success_at"]
    assert health["latest_occurrence_runs"] == {"succeeded": 3}
    text = run_cli("schedule", "show", "per-tenant", "--database-url", db_url).stdout
    assert ": 3 succeeded" in text and "ok: last success" in text


def test_a_schedules_health_is_read_by_its_id_as_the_list_reads_it(db_url, conn, t0):
    add(db_url, "fails", "test.give_up")
    add(db_url, "succeeds", "test.ok")
    start_at(conn, t0)
    now = t0 + timedelta(minutes=5, seconds=10)
    tick(db_url, "test.give_up", "test.ok", now=now)

    listed = {row.name: row for row in store.definitions_list_health(conn, now=now)}
    ids = dict(conn.execute("SELECT name, id FROM job_definitions").fetchall())
    for name, definition_id in ids.items():
        assert store.definition_get_health(conn, definition_id, now=now) == listed[name]
    assert store.definition_get_health(conn, max(ids.values()) + 1) is None


def test_show_gives_each_schedule_its_own_health(db_url, conn):
    add(db_url, "fails", "test.give_up")
    add(db_url, "succeeds", "test.ok")
    an_hour_ago(conn)
    tick(db_url, "test.give_up", "test.ok")

    def health(name: str) -> dict:
        result = run_cli("schedule", "show", name, "--json", "--database-url", db_url)
        return json.loads(result.stdout)["health"]

    failing, succeeding = health("fails"), health("succeeds")
    assert failing["last_failure_at"] and not failing["last_success_at"]
    assert succeeding["last_success_at"] and not succeeding["last_failure_at"]
