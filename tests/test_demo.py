"""The demo writes only where it is told to, and touches only what it created."""

from __future__ import annotations

import pytest

from tests.conftest import count, run_cli

WRITE = "--write-to-configured-database"


def _production_schedule(conn, name: str = "billing", job_type: str = "billing.charge") -> None:
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, materialized_through,"
        " next_fire_at) VALUES (%s, %s, '* * * * *', now() - interval '10 minutes',"
        " now() - interval '9 minutes')",
        [name, job_type],
    )


def test_a_database_url_without_the_flag_is_refused_and_nothing_written(db_url, conn):
    result = run_cli("demo", "--database-url", db_url)
    assert result.exit_code == 2
    assert WRITE in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


@pytest.mark.parametrize("variable", ["JOBRUNNER_DATABASE_URL", "DATABASE_URL"])
def test_a_configured_database_is_not_where_the_demo_runs(db_url, conn, variable):
    _production_schedule(conn)
    result = run_cli("demo", env={variable: db_url})
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert count(conn, "SELECT count(*) FROM job_definitions WHERE name <> 'billing'") == 0


def test_when_told_the_demo_materializes_only_its_own_schedules(db_url, conn):
    _production_schedule(conn)
    before = conn.execute("SELECT next_fire_at FROM job_definitions").fetchone()[0]
    result = run_cli("demo", WRITE, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs WHERE job_type = 'billing.charge'") == 0
    assert conn.execute("SELECT next_fire_at FROM job_definitions").fetchone()[0] == before
    assert count(conn, "SELECT count(*) FROM job_definitions") == 1
    # Nothing of the demo's stays due for ticks without demo handlers.
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status IN ('queued', 'failed')") == 0


def test_the_demo_leaves_a_schedule_of_its_name_that_is_not_its_own_alone(db_url, conn):
    _production_schedule(conn, name="demo-greeting")
    result = run_cli("demo", WRITE, "--database-url", db_url)
    assert result.exit_code == 1
    assert "demo-greeting exists" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions WHERE name = 'demo-greeting'") == 1
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_demo_replaces_what_an_interrupted_demo_left(db_url, conn):
    _production_schedule(conn, name="demo-greeting", job_type="demo.greet")
    result = run_cli("demo", WRITE, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def _demo_on_embedded_server(db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`jobrunner demo` as on its embedded server. Its database here is the tests' (as root
    the embedded server is refused); everything after choosing it is the demo's own path."""
    from cronjob.commands import demo as demo_command
    from cronjob.db import Database

    def embedded(stack, settings, write_configured):
        assert not write_configured
        database = Database(db_url, "embedded")
        return database, stack.enter_context(database.connect()), False

    monkeypatch.setattr(demo_command, "_demo_database", embedded)
    result = run_cli("demo")
    assert result.exit_code == 0, result.stderr
    return result.stdout


def _nothing_due_a_week_later(db_url: str, conn) -> None:
    """The embedded server persists: whatever the demo left due would breach
    `check --max-queue-age` on it for good."""
    # A week later, by the database's clock: every time the demo wrote, moved a week back.
    conn.execute(
        "UPDATE job_runs SET run_at = run_at - interval '7 days',"
        " created_at = created_at - interval '7 days'"
    )
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status IN ('queued', 'failed')") == 0
    check = run_cli("check", "--database-url", db_url, "--max-queue-age", "5m")
    assert check.exit_code == 0, check.stdout + check.stderr


def test_the_demo_on_its_embedded_server_leaves_nothing_due_a_week_later(db_url, conn, monkeypatch):
    _demo_on_embedded_server(db_url, monkeypatch)
    _nothing_due_a_week_later(db_url, conn)


def test_what_the_demos_tick_left_unfinished_is_cancelled(db_url, conn, monkeypatch):
    """The demo's own tick finishes its runs, retries included, on a quiet machine; one that
    ends first (its time spent, a retry due after it) leaves runs waiting. Here its tick
    runs no handler at all: every run it enqueued, and every one its schedules made, is
    left for the demo to cancel."""
    import cronjob.tick

    run_tick = cronjob.tick.run_tick
    monkeypatch.setattr(
        cronjob.tick, "run_tick", lambda conn, specs, **options: run_tick(conn, {}, **options)
    )
    shown = _demo_on_embedded_server(db_url, monkeypatch)

    assert "  demo.flaky   queued     0/-       not run by the tick" in shown
    statuses = conn.execute("SELECT job_type, status FROM job_runs ORDER BY id").fetchall()
    assert statuses[:4] == [
        ("demo.greet", "cancelled"),
        ("demo.flaky", "cancelled"),
        ("demo.broken", "cancelled"),
        ("demo.broken", "cancelled"),
    ]
    assert {status for _type, status in statuses} == {"cancelled"}
    _nothing_due_a_week_later(db_url, conn)
