"""Stopping and being stopped: SIGTERM/SIGINT with handlers running, a second signal,
cancelling a running run, and leases kept alive while runs wait. Real processes."""

from __future__ import annotations

import signal

from cronjob import store
from cronjob.api import enqueue
from tests.conftest import count, run_cli, wait_for


def _started(exec_log, ids: list[int], n: int) -> bool:
    return len({e.run_id for e in exec_log.entries() if e.run_id in ids}) >= n


def test_sigterm_lets_running_handlers_finish_and_hands_back_the_rest(
    db_url, conn, start_tick, exec_log, tmp_path
):
    """Scenario: SIGTERM while 2 handlers run and others wait; the 2 finish, the rest go back.

    The tick holds only what its workers start soon (two waiting here, one per
    worker); those go back untouched, and the runs it never claimed stay queued. The
    handlers run until the tick says it is stopping, however long the signal takes.
    """
    release = tmp_path / "release"
    ids = [enqueue(conn, "fault.gated", {"release": str(release)}) for _ in range(6)]
    t = start_tick(db_url, "--concurrency", "2", "--grace", "20s")
    wait_for(lambda: _started(exec_log, ids, 2), "two handlers to start")
    t.signal(signal.SIGTERM)
    wait_for(lambda: t.events("stopping"), "the tick to stop claiming")
    release.touch()

    assert t.wait() == 0
    summary = t.summary()
    ran = {e.run_id for e in exec_log.entries()}
    waiting = sorted(set(ids) - ran)
    assert len(ran) == 2 and summary["succeeded"] == 2
    assert summary["stopped_by"] == "SIGTERM" and summary["handed_back"] >= 1
    assert set(summary["handed_back_ids"]) <= set(waiting)
    for run_id in ran:
        assert store.run_get(conn, run_id).status == "succeeded"
    for run_id in waiting:
        run = store.run_get(conn, run_id)
        assert (run.status, run.attempts, run.locked_by, run.started_at) == (
            "queued",
            0,
            None,
            None,
        )
    assert count(conn, "SELECT count(*) FROM job_runs WHERE run_at > now()") == 0
    [stopping] = t.events("stopping")
    assert (stopping["reason"], stopping["running"]) == ("SIGTERM", 2)


def test_sigint_past_the_grace_hands_back_running_handlers_uncounted(
    db_url, conn, start_tick, exec_log
):
    """Scenario: SIGINT while handlers run longer than --grace; all runs are handed back, exit 0."""
    ids = [enqueue(conn, "fault.sleep", {"seconds": 60}) for _ in range(3)]
    t = start_tick(db_url, "--concurrency", "2", "--grace", "1s")
    wait_for(lambda: _started(exec_log, ids, 2), "two handlers to start")
    t.signal(signal.SIGINT)

    assert t.wait() == 0
    summary = t.summary()
    assert (summary["stopped_by"], summary["handed_back"], summary["succeeded"]) == ("SIGINT", 3, 0)
    assert sorted(summary["handed_back_ids"]) == ids
    for run_id in ids:
        run = store.run_get(conn, run_id)
        assert (run.status, run.attempts, run.locked_until) == ("queued", 0, None)
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0  # nothing counted as a failure
    assert len(exec_log.entries()) == 2


def test_a_second_signal_hands_back_at_once(db_url, conn, start_tick, exec_log):
    """Scenario: a second SIGTERM during a 60 s grace; the tick hands back and exits at once."""
    ids = [enqueue(conn, "fault.sleep", {"seconds": 60}) for _ in range(2)]
    t = start_tick(db_url, "--concurrency", "2", "--grace", "60s")
    wait_for(lambda: _started(exec_log, ids, 2), "both handlers to start")
    t.signal(signal.SIGTERM)
    wait_for(lambda: t.events("stopping"), "the tick to start its grace period")
    t.signal(signal.SIGTERM)

    assert t.wait(timeout=20) == 0  # well inside the 60 s grace and the handlers' 60 s
    summary = t.summary()
    assert (summary["handed_back"], sorted(summary["handed_back_ids"])) == (2, ids)
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 2


def test_cancelling_a_running_run_tells_its_handler_and_discards_its_outcome(
    db_url, conn, start_tick, exec_log
):
    """Scenario: `jobrunner cancel` on a running run; its handler learns at the next heartbeat."""
    run_id = enqueue(conn, "fault.block_first", {"seconds": 30})
    t = start_tick(db_url, "--lease", "3s")
    wait_for(lambda: exec_log.of(run_id), "the handler to start")

    cancelled = run_cli("cancel", str(run_id), "--database-url", db_url)
    assert cancelled.exit_code == 0, cancelled.stderr

    wait_for(lambda: exec_log.of(run_id, "cancelled"), "the handler to see ctx.cancelled")
    assert t.wait() == 0
    run = store.run_get(conn, run_id)
    assert (run.status, run.attempts, run.last_error) == ("cancelled", 1, None)
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0
    assert t.summary()["lost"] == 1
    [lost] = t.events("run outcome discarded")
    assert lost["run_id"] == run_id


def test_a_handler_told_its_run_was_cancelled_gets_the_grace_period_to_clean_up(
    db_url, conn, start_tick, exec_log
):
    """Scenario: the tick has nothing else to do when its one handler is told to stop."""
    run_id = enqueue(conn, "fault.cleans_up", {"seconds": 30, "cleanup_ms": 500})
    t = start_tick(db_url, "--lease", "3s", "--grace", "20s")
    wait_for(lambda: exec_log.of(run_id), "the handler to start")

    assert run_cli("cancel", str(run_id), "--database-url", db_url).exit_code == 0

    assert t.wait() == 0
    assert [e.event for e in exec_log.of(run_id, None)] == ["run", "cancelled", "cleaned_up"]
    assert store.run_get(conn, run_id).status == "cancelled"
    [waited] = t.events("waiting for handlers told to stop")
    assert waited["count"] == 1


def test_heartbeats_keep_the_leases_of_runs_waiting_for_a_worker(
    db_url, conn, start_tick, exec_log
):
    """Scenario: 3 s lease, a run waits 3.5 s for the only worker; no other tick can take it."""
    ids = [enqueue(conn, "fault.sleep", {"seconds": 3.5}) for _ in range(2)]
    holder = start_tick(db_url, "--lease", "3s", "--concurrency", "1")
    [first] = wait_for(lambda: exec_log.entries(), "a handler to start")
    [waiting] = set(ids) - {first.run_id}
    wait_for(
        lambda: count(
            conn,
            "SELECT count(*) FROM job_runs WHERE id = %s AND status = 'running'"
            " AND locked_until > started_at + interval '3.5 seconds'",
            waiting,
        ),
        "the waiting run's lease to be renewed",
    )

    rival = start_tick(db_url, "--lease", "3s")
    assert rival.wait() == 0
    assert not exec_log.of(waiting)  # still waiting when the rival came and went
    assert holder.wait() == 0

    assert (rival.summary()["rescued"], rival.summary()["claimed"]) == (0, 0)
    for run_id in ids:
        run = store.run_get(conn, run_id)
        assert (run.status, run.attempts) == ("succeeded", 1)
        assert [e.pid for e in exec_log.of(run_id)] == [holder.pid]
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0
