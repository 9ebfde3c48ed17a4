"""Crashes and stalls: a tick killed, a tick frozen past its lease, a handler that
takes its process down, and a drain under random kills. Real processes, real server."""

from __future__ import annotations

import json
import random
import signal
from collections import Counter, defaultdict
from datetime import timedelta

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob import store
from cronjob.api import enqueue, new_run
from tests.conftest import count, run_cli, wait_for
from tests.factories import tick
from tests.faults.conftest import db_now


def test_sigkill_mid_run_the_run_is_reclaimed_once_its_lease_expires(
    db_url, conn, start_tick, exec_log_here
):
    """Scenario: SIGKILL a tick while its handler runs; a tick after lease expiry re-runs it."""
    exec_log = exec_log_here
    run_id = enqueue(conn, "fault.block_first", {"seconds": 60})
    victim = start_tick(db_url, "--lease", "30s")
    wait_for(lambda: exec_log.of(run_id), "the handler to start")
    victim.signal(signal.SIGKILL)
    victim.wait()

    held = store.run_get(conn, run_id)
    assert (held.status, held.locked_by) == (
        "running",
        f"{held.locked_by.split(':')[0]}:{victim.pid}",
    )
    # Still leased: a tick now leaves it alone.
    assert tick(db_url, "fault.block_first").claimed == 0

    report = tick(db_url, "fault.block_first", now=db_now(conn) + timedelta(seconds=31))

    assert (report.rescued, report.succeeded) == (1, 1)
    run = store.run_get(conn, run_id)
    assert (run.status, run.attempts) == ("succeeded", 2)
    assert [(e.attempt, e.pid == victim.pid) for e in exec_log.of(run_id)] == [
        (1, True),
        (2, False),
    ]
    shown = run_cli("show", str(run_id), "--json", "--database-url", db_url)
    [lost] = json.loads(shown.stdout)["attempt_history"]
    assert (lost["attempt"], lost["error_type"]) == (1, "lease_expired")
    assert lost["worker"].endswith(f":{victim.pid}")
    assert "lease expired" in lost["message"]


def test_a_handler_calling_os_exit_loses_nothing(db_url, conn, start_tick, exec_log_here):
    """Scenario: a handler calls os._exit; every run its tick held is recovered after the lease."""
    exec_log = exec_log_here
    doomed = enqueue(conn, "fault.exit_first")
    bystanders = [enqueue(conn, "fault.sleep", {"seconds": 0.5}) for _ in range(3)]
    victim = start_tick(db_url, "--lease", "30s", "--concurrency", "1")

    assert victim.wait() == 3  # the handler's own exit status: the whole process went down
    held = {r[0] for r in conn.execute("SELECT id FROM job_runs WHERE status = 'running'")}
    assert doomed in held  # with whatever else the tick had claimed and not finished
    unfinished = count(conn, "SELECT count(*) FROM job_runs WHERE status <> 'succeeded'")

    report = tick(
        db_url, "fault.exit_first", "fault.sleep", now=db_now(conn) + timedelta(minutes=1)
    )

    assert (report.rescued, report.succeeded) == (len(held), unfinished)
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status <> 'succeeded'") == 0
    assert store.run_get(conn, doomed).attempts == 2
    for run_id in held:
        assert [a.error_type for a in store.run_attempts_get(conn, run_id)] == ["lease_expired"]
        assert exec_log.of(run_id)[-1].pid != victim.pid
    for run_id in set(bystanders) - held:
        # Finished before the exit, or never claimed by the victim: run once either way.
        assert len(exec_log.of(run_id)) == 1


def test_a_tick_frozen_past_its_lease_cannot_overwrite_the_newer_outcome(
    db_url, conn, start_tick, exec_log
):
    """Scenario: SIGSTOP a tick past its lease, let another tick re-run the run, then SIGCONT it."""
    run_id = enqueue(conn, "fault.block_first", {"seconds": 10})
    zombie = start_tick(db_url, "--lease", "2s")
    wait_for(lambda: exec_log.of(run_id), "the first attempt to start")
    zombie.signal(signal.SIGSTOP)
    wait_for(
        lambda: count(
            conn, "SELECT count(*) FROM job_runs WHERE id = %s AND locked_until < now()", run_id
        ),
        "the frozen tick's lease to expire",
    )

    rescuer = start_tick(db_url, "--lease", "2s")
    assert rescuer.wait() == 0
    recorded = store.run_get(conn, run_id)
    assert (recorded.status, recorded.attempts) == ("succeeded", 2)

    zombie.signal(signal.SIGCONT)
    assert zombie.wait() == 0

    assert store.run_get(conn, run_id) == recorded  # not one field changed
    assert zombie.summary()["lost"] == 1
    assert rescuer.summary()["rescued"] == 1
    [discarded] = [e for e in zombie.events("lease lost") if e.get("run_id") == run_id]
    assert discarded["attempt"] == 1
    assert [(e.attempt, e.pid) for e in exec_log.of(run_id)] == [(1, zombie.pid), (2, rescuer.pid)]
    history = store.run_attempts_get(conn, run_id)
    assert [(a.attempt, a.error_type) for a in history] == [(1, "lease_expired")]


DRAIN_RUNS = 3000
DRAIN_TICKS = 8
DRAIN_KILLS = 6


def test_a_drain_under_random_sigkills_loses_nothing_and_repeats_only_killed_work(
    db_url, conn, start_tick, exec_log_here
):
    """Scenario: 8 ticks drain 3,000 runs while random ticks are SIGKILLed and replaced."""
    exec_log = exec_log_here
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    store.runs_insert_many(conn, [new_run("fault.work", {"ms": 15}) for _ in range(DRAIN_RUNS)])
    # A lease long enough that no surviving tick loses one on a busy machine; what
    # killed ticks held is rescued by later replacements or by the final tick.
    args = ("--lease", "5s", "--concurrency", "4", "--batch-size", "25")
    ticks = [start_tick(db_url, *args) for _ in range(DRAIN_TICKS)]

    killed: set[int] = set()
    kill_points = sorted(rng.uniform(0.05, 0.7) for _ in range(DRAIN_KILLS))
    for point in kill_points:
        reached = wait_for(
            lambda point=point: (
                len(exec_log.entries()) >= point * DRAIN_RUNS
                or all(t.proc.poll() is not None for t in ticks)
            ),
            "the drain to progress",
            timeout=60,
        )
        alive = [t for t in ticks if t.proc.poll() is None]
        if not alive or not reached:
            break
        victim = rng.choice(alive)
        victim.signal(signal.SIGKILL)
        victim.wait()
        killed.add(victim.pid)
        ticks.append(start_tick(db_url, *args))

    for t in ticks:
        code = t.wait(timeout=60)
        assert code == (-signal.SIGKILL if t.pid in killed else 0), (seed, t.stderr()[-2000:])
    # Whatever the killed ticks still held is rescued once their leases have expired.
    final = tick(db_url, "fault.work", now=db_now(conn) + timedelta(seconds=10), batch_size=500)

    context = f"seed {seed}, killed {sorted(killed)}"
    assert len(killed) >= 3, context
    statuses = dict(
        conn.execute("SELECT status, count(*) FROM job_runs GROUP BY status").fetchall()
    )
    assert statuses == {"succeeded": DRAIN_RUNS}, context

    executions: dict[int, list[int]] = defaultdict(list)
    for e in exec_log.entries():
        executions[e.run_id].append(e.pid)
    ids = {r[0] for r in conn.execute("SELECT id FROM job_runs")}
    assert set(executions) == ids, context  # every run executed at least once
    for run_id, pids in executions.items():
        # At most one execution by a process that lived: any other was by a killed tick.
        assert sum(pid not in killed for pid in pids) <= 1, (context, run_id, pids)

    # The database tells the same story: every extra attempt is a lost lease of a killed tick.
    history = conn.execute("SELECT run_id, error_type, worker FROM job_attempts").fetchall()
    assert {h[1] for h in history} <= {"lease_expired"}, context
    assert {int(h[2].rsplit(":", 1)[1]) for h in history} <= killed, context
    lost_leases = Counter(h[0] for h in history)
    assert count(conn, "SELECT count(*) FROM job_runs WHERE attempts <> 1") == len(lost_leases)
    for run_id, attempts in conn.execute("SELECT id, attempts FROM job_runs WHERE attempts > 1"):
        assert attempts == 1 + lost_leases[run_id], (context, run_id)
    assert lost_leases, context  # the kills did land on ticks holding runs
    for run_id, pids in executions.items():
        assert len(pids) - 1 <= lost_leases[run_id], (context, run_id)

    # And no run's outcome was recorded twice: one "succeeded" log line at most per run.
    recorded = Counter(
        e["run_id"] for t in ticks for e in t.events("run finished") if e["outcome"] == "succeeded"
    )
    assert max(recorded.values()) == 1, context
    assert sum(recorded.values()) + final.succeeded <= DRAIN_RUNS, context
