"""Database faults: a server restart mid-tick, a server that stays down, a server
that is down at start, and a lock held too long. Restarts and stops happen on a
private server of this test session, never on the shared one."""

from __future__ import annotations

import socket
from datetime import timedelta

import psycopg

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob import store
from cronjob.api import enqueue
from cronjob.db import connect
from tests.conftest import count, jobrunner_process, wait_for
from tests.factories import tick
from tests.faults.conftest import db_now


def _started(exec_log, n: int) -> bool:
    return len({e.run_id for e in exec_log.entries()}) >= n


def test_a_fast_restart_mid_tick_finalizes_what_finished_and_hands_back_the_rest(
    private_server, private_db, start_tick, exec_log
):
    """Scenario: `pg_ctl restart -m fast` while handlers run; the tick reconnects, loses nothing."""
    with psycopg.connect(private_db, autocommit=True) as conn:
        ids = [enqueue(conn, "fault.sleep", {"seconds": 2}) for _ in range(6)]
    t = start_tick(private_db, "--concurrency", "2", "--lease", "30s")
    wait_for(lambda: _started(exec_log, 2), "two handlers to start")

    private_server.restart_fast()

    assert t.wait() == 0, t.stderr()[-2000:]
    summary = t.summary()
    ran = sorted({e.run_id for e in exec_log.entries()})
    assert summary["stopped_by"] == "database error"
    assert t.events("database error") and t.events("reconnected")
    # What finished was recorded after reconnecting; what had not started went back.
    assert summary["succeeded"] == len(ran) and summary["lost"] == 0
    # The rest went back, or were never claimed: nothing else holds them.
    assert set(summary.get("handed_back_ids", [])) <= set(ids) - set(ran)
    with psycopg.connect(private_db, autocommit=True) as conn:
        done = "SELECT count(*) FROM job_runs WHERE status = 'succeeded'"
        assert count(conn, done) == len(ran)

    finisher = start_tick(private_db)
    assert finisher.wait() == 0
    with psycopg.connect(private_db, autocommit=True) as conn:
        assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 6
        assert count(conn, "SELECT count(*) FROM job_runs WHERE attempts <> 1") == 0
        assert count(conn, "SELECT count(*) FROM job_attempts") == 0
    assert sorted(e.run_id for e in exec_log.entries()) == ids  # each ran exactly once


def test_a_server_that_stays_down_mid_tick_exits_1_and_its_runs_are_recovered_later(
    private_server, private_db, start_tick, exec_log, monkeypatch
):
    """Scenario: the server stops for good while handlers run; exit 1, leases recover the runs."""
    with psycopg.connect(private_db, autocommit=True) as conn:
        ids = [enqueue(conn, "fault.sleep", {"seconds": 3}) for _ in range(3)]
    t = start_tick(private_db, "--concurrency", "3", "--lease", "30s")
    wait_for(lambda: _started(exec_log, 3), "the handlers to start")

    private_server.stop()

    assert t.wait() == 1
    lines = [line for line in t.stderr().splitlines() if not line.startswith("{")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("jobrunner: error: lost the database connection mid-tick")
    assert "3 run(s) not finalized become claimable again when their leases expire" in lines[0]
    assert "Traceback" not in t.stderr()

    private_server.start()
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log.path))
    with psycopg.connect(private_db, autocommit=True) as conn:
        assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'") == 3
        report = tick(private_db, "fault.sleep", now=db_now(conn) + timedelta(seconds=31))
        assert (report.rescued, report.succeeded) == (3, 3)
        for run_id in ids:
            history = store.run_attempts_get(conn, run_id)
            assert [a.error_type for a in history] == ["lease_expired"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_down_at_start_gives_one_clear_line_and_exit_1(tmp_path):
    """Scenario: nothing listens at the URL; a few short retries, then one line, exit 1."""
    url = f"postgresql://jobrunner:s3cret-pw@127.0.0.1:{_closed_port()}/jobrunner"
    proc = jobrunner_process("tick", env={"JOBRUNNER_DATABASE_URL": url})
    stdout, stderr = proc.communicate(timeout=30)

    assert proc.returncode == 1
    assert stdout == ""
    assert stderr.splitlines() == [stderr.strip()]  # one line
    assert stderr.startswith("jobrunner: error: cannot connect to the database:")
    assert "s3cret-pw" not in stderr and "Traceback" not in stderr


def test_an_unparsable_url_never_shows_its_password():
    """Scenario: a URL libpq cannot parse is quoted back without the password in it."""
    proc = jobrunner_process("tick", "--database-url", "jobrunner:s3cret-pw@db.internal")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert stderr.startswith("jobrunner: error:") and len(stderr.splitlines()) == 1
    assert "s3cret-pw" not in stderr


def test_a_lock_held_on_a_run_cannot_hang_the_tick(db_url, conn, start_tick, exec_log):
    """Scenario: another session locks a run while its handler runs; the tick's write gives up
    after lock_timeout, the tick stops claiming, and records the outcome once the lock is gone."""
    run_id = enqueue(conn, "fault.sleep", {"seconds": 2})
    t = start_tick(db_url, "--lease", "30s")
    with connect(db_url, autocommit=False) as locker:
        wait_for(lambda: exec_log.of(run_id), "the handler to start")
        locker.execute("SELECT 1 FROM job_runs WHERE id = %s FOR UPDATE", (run_id,))
        wait_for(lambda: t.events("database error"), "the finalize to give up on the lock")
        locker.rollback()

    assert t.wait() == 0
    assert t.summary()["stopped_by"] == "database error"
    assert store.run_get(conn, run_id).status == "succeeded"
    [error] = t.events("database error")
    assert error["during"] == "finalize" and "lock timeout" in error["error"]
