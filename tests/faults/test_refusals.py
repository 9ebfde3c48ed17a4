"""The database refuses a drain's statements: the server turned read-only, the tick's login
lost a privilege, the schema was dropped. Each ends the tick at once, with one line and
exit 1; what it held is handed back where the database still takes it, else left to its
lease. A failure that is worth retrying but persists (a serialization failure) ends it the
same way once retried. The drain is caught in the middle: its handlers wait for a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob import migrate, store
from cronjob.api import enqueue
from tests.conftest import count, wait_for
from tests.factories import tick
from tests.faults.conftest import ExecLog, PrivateServer, TickProcess, db_now

RUNS = 6
OUTCOMES = ("succeeded", "failed", "dead", "lost", "handed_back", "unrecorded")


def _drain_in_the_middle(
    url: str,
    start_tick: Callable[..., TickProcess],
    exec_log: ExecLog,
    release: Path,
    *,
    tick_url: str | None = None,
) -> tuple[list[int], TickProcess]:
    """Enqueue gated runs through `url` and start a tick (through `tick_url`, if given);
    returns once two handlers run, and wait for `release`."""
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [enqueue(conn, "fault.gated", {"release": str(release)}) for _ in range(RUNS)]
    t = start_tick(tick_url or url, "--concurrency", "2")
    wait_for(lambda: len({e.run_id for e in exec_log.entries()}) >= 2, "two handlers to start")
    return ids, t


def _ended_with_one_refusal(t: TickProcess) -> tuple[str, dict[str, Any]]:
    """Exit 1, one plain line between JSON events, no traceback; the line and the summary."""
    assert t.wait() == 1, t.stderr()[-3000:]
    [error] = t.plain_lines()
    assert error.startswith("jobrunner: error: the database refused the tick's "), error
    assert "Traceback" not in t.stderr()
    [stopped] = t.events("tick stopped")
    assert stopped["stopped_by"] == "database error"
    assert stopped["claimed"] == sum(stopped.get(k, 0) for k in OUTCOMES)  # none counted twice
    return error, stopped


def _login(url: str, user: str) -> str:
    return conninfo.make_conninfo(url, user=user)


def test_a_server_turned_read_only_mid_drain_leaves_what_the_tick_holds_to_its_leases(
    private_server: PrivateServer, private_db, start_tick, exec_log, tmp_path, monkeypatch
):
    release = tmp_path / "release"
    ids, t = _drain_in_the_middle(private_db, start_tick, exec_log, release)
    with psycopg.connect(private_server.admin_url, autocommit=True) as admin:
        try:
            admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            admin.execute("SELECT pg_reload_conf()")
            with psycopg.connect(private_db, autocommit=True) as probe:
                wait_for(
                    lambda: probe.execute("SHOW transaction_read_only").fetchone()[0] == "on",
                    "the server to turn read-only",
                )
            release.touch()

            error, stopped = _ended_with_one_refusal(t)
        finally:
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            admin.execute("SELECT pg_reload_conf()")
    held = stopped["claimed"]
    assert error.endswith(
        " in a read-only transaction (a standby, or a primary turned read-only); "
        f"{held} run(s) not finalized become claimable again when their leases expire"
    ), error
    assert stopped["unrecorded"] == held  # a read-only server takes no outcome, no hand-back

    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log.path))
    with psycopg.connect(private_db, autocommit=True) as conn:
        wait_for(lambda: not store.session_read_only(conn), "the server to take writes again")
        assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'") == held
        report = tick(private_db, "fault.gated", now=db_now(conn) + timedelta(minutes=3))
        assert (report.rescued, report.succeeded) == (held, RUNS)
        rows = conn.execute("SELECT status, count(*) FROM job_runs GROUP BY 1").fetchall()
        assert rows == [("succeeded", RUNS)]  # every run ends once
        lost = conn.execute("SELECT run_id FROM job_attempts WHERE error_type = 'lease_expired'")
        assert len(lost.fetchall()) == held
    assert {e.run_id for e in exec_log.entries()} == set(ids)


@pytest.fixture
def tick_login(private_server: PrivateServer, private_db: str) -> Iterator[str]:
    """A login with a worker's privileges on jobrunner's tables; dropped afterwards."""
    with psycopg.connect(private_db, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS refused_tick")
        admin.execute("CREATE ROLE refused_tick LOGIN")
        admin.execute("GRANT USAGE ON SCHEMA public TO refused_tick")
        admin.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO refused_tick"
        )
        admin.execute("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO refused_tick")
    yield _login(private_db, "refused_tick")
    with psycopg.connect(private_db, autocommit=True) as admin:
        admin.execute("DROP OWNED BY refused_tick")
        admin.execute("DROP ROLE refused_tick")


def test_a_privilege_revoked_mid_drain_ends_the_tick_with_one_line(
    private_db, tick_login, start_tick, exec_log, tmp_path
):
    release = tmp_path / "release"
    _, t = _drain_in_the_middle(private_db, start_tick, exec_log, release, tick_url=tick_login)
    with psycopg.connect(private_db, autocommit=True) as admin:
        admin.execute("REVOKE UPDATE ON job_runs FROM refused_tick")
    release.touch()

    error, stopped = _ended_with_one_refusal(t)
    assert ": permission denied for table job_runs; " in error
    assert error.endswith("run(s) not finalized become claimable again when their leases expire")
    assert stopped["unrecorded"] == stopped["claimed"]


def test_a_schema_dropped_mid_drain_ends_the_tick_with_one_line(
    private_server: PrivateServer, start_tick, exec_log, tmp_path
):
    with psycopg.connect(private_server.admin_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dropped_schema WITH (FORCE)")
        admin.execute("CREATE DATABASE dropped_schema")
    url = conninfo.make_conninfo(private_server.url, dbname="dropped_schema")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)
        release = tmp_path / "release"
        _, t = _drain_in_the_middle(url, start_tick, exec_log, release)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
        release.touch()

        error, _ = _ended_with_one_refusal(t)
        assert " does not exist" in error
    finally:
        with psycopg.connect(private_server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS dropped_schema WITH (FORCE)")


def test_a_serialization_failure_that_persists_ends_the_tick_with_one_line(
    private_db, start_tick, exec_log, tmp_path
):
    release = tmp_path / "release"
    _, t = _drain_in_the_middle(private_db, start_tick, exec_log, release)
    with psycopg.connect(private_db, autocommit=True) as admin:
        admin.execute(
            "CREATE FUNCTION never_serializable() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'could not serialize access due to concurrent update'"
            " USING ERRCODE = 'serialization_failure'; END $$"
        )
        admin.execute(
            "CREATE TRIGGER never_serializable BEFORE UPDATE ON job_runs"
            " FOR EACH ROW EXECUTE FUNCTION never_serializable()"
        )
        try:
            release.touch()
            assert t.wait() == 1, t.stderr()[-3000:]
        finally:
            admin.execute("DROP FUNCTION never_serializable() CASCADE")
    [error] = t.plain_lines()
    assert error.startswith("jobrunner: error: the database failed while this tick finished (")
    assert ": could not serialize access due to concurrent update): " in error
    assert error.endswith("run(s) not finalized become claimable again when their leases expire")
    assert "Traceback" not in t.stderr()
    [stopped] = t.events("tick stopped")
    assert stopped["claimed"] == sum(stopped.get(k, 0) for k in OUTCOMES) == stopped["unrecorded"]
    # Retried, but not in a busy loop: a few tries, each logged once.
    assert 2 <= len(t.events("database error")) <= 8
