"""Chaos: busy drains of once()-guarded effects while ticks are killed and stalled, the
server restarts, and operators act on the same runs. Real processes, real servers, seeded
randomness; every verdict comes from the database and the handlers' own execution log.

What must hold every time: every run finishes; no attempt of a run is executed twice;
every effect commits exactly once, with its run's success; the attempt history has one
row per lost or failed attempt, naming a process that held the run then.
"""

from __future__ import annotations

import random
import signal
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob import store
from cronjob.api import new_run
from tests.conftest import count, effect_table, run_cli, wait_for
from tests.factories import insert_runs, now, tick
from tests.faults.conftest import db_now

ARGS = ("--concurrency", "4", "--batch-size", "10")


def _enqueue_effects(conn: Any, n: int, ms: int = 20) -> None:
    store.runs_insert_many(
        conn, [new_run("fault.effect", {"key": f"k{i}", "ms": ms}) for i in range(n)]
    )


def _progress(exec_log: Any, share: float, total: int) -> Any:
    return lambda: len({e.run_id for e in exec_log.entries()}) >= share * total


def _finish(url: str, conn: Any) -> None:
    """What dead or stalled ticks still held is rescued once their leases expire."""
    for _ in range(3):
        tick(url, "fault.effect", now=db_now(conn) + timedelta(seconds=30), batch_size=500)
        if not count(conn, "SELECT count(*) FROM job_runs WHERE status <> 'succeeded'"):
            return


def _assert_each_run_done_once(
    conn: Any, exec_log: Any, holders: set[int], context: str, *, retried: set[int] = frozenset()
) -> None:
    runs = dict(conn.execute("SELECT id, attempts FROM job_runs WHERE status = 'succeeded'"))
    executions = Counter((e.run_id, e.attempt) for e in exec_log.entries())
    twice = {k: n for k, n in executions.items() if n > 1 and k[0] not in retried}
    assert twice == {}, context  # no attempt of a run executed twice
    for run_id, attempts in runs.items():
        assert executions[(run_id, attempts)] >= 1, (context, run_id)  # its last one ran
    effects = conn.execute("SELECT key, run_id, attempt FROM effect_rows").fetchall()
    assert Counter(key for key, _, _ in effects).most_common(1)[0][1] == 1, context
    # Each effect committed with its run's success: the run's final attempt wrote it.
    assert {(run_id, attempt) for _, run_id, attempt in effects} == set(runs.items()), context
    history = conn.execute(
        "SELECT a.run_id, a.worker FROM job_attempts a JOIN job_runs r ON r.id = a.run_id"
        " WHERE r.status = 'succeeded'"
    ).fetchall()
    per_run = Counter(run_id for run_id, _ in history)
    for run_id, attempts in runs.items():
        # An operator's retry resets a dead or cancelled run's budget, its history kept:
        # only the others can be counted so.
        if run_id not in retried:
            assert per_run[run_id] == attempts - 1, (context, run_id)
    assert {int(worker.rsplit(":", 1)[1]) for _, worker in history} <= holders, context


def test_effects_commit_once_while_ticks_are_killed_and_stalled_past_their_leases(
    db_url, conn, start_tick, exec_log_here
):
    """Scenario: 4 ticks, 1,200 runs, 2 s leases; 3 SIGKILLs and 2 SIGSTOPs past the lease."""
    exec_log, total = exec_log_here, 1200
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    effect_table(db_url)
    _enqueue_effects(conn, total)
    args = ("--lease", "2s", *ARGS)
    ticks = [start_tick(db_url, *args) for _ in range(4)]
    killed: set[int] = set()
    disruptions = ["kill", "stop", "kill", "stop", "kill"]
    for share, what in zip(
        sorted(rng.uniform(0.05, 0.6) for _ in disruptions), disruptions, strict=True
    ):
        wait_for(_progress(exec_log, share, total), "the drain to progress", timeout=60)
        alive = [t for t in ticks if t.proc.poll() is None]
        if not alive:
            break
        victim = rng.choice(alive)
        if what == "kill":
            victim.signal(signal.SIGKILL)
            victim.wait()
            killed.add(victim.pid)
        else:
            victim.signal(signal.SIGSTOP)
            # Until the database says its leases ran out; the stalled tick then wakes to
            # find its runs gone.
            worker = f"%:{victim.pid}"
            wait_for(
                lambda worker=worker: (
                    not count(
                        conn,
                        "SELECT count(*) FROM job_runs WHERE status = 'running'"
                        " AND locked_by LIKE %s AND locked_until > now()",
                        worker,
                    )
                ),
                "the stalled tick's leases to expire",
                timeout=30,
            )
            # A new tick rescues them first thing (all but a run whose success the stalled
            # tick was committing when it stopped: its row lock keeps that one its own).
            rescuer = start_tick(db_url, *args)
            ticks.append(rescuer)
            wait_for(
                lambda rescuer=rescuer: (
                    rescuer.events("run finished") or rescuer.proc.poll() is not None
                ),
                "the new tick to rescue",
            )
            victim.signal(signal.SIGCONT)
        ticks.append(start_tick(db_url, *args))

    for t in ticks:
        code = t.wait(timeout=90)
        assert code == (-signal.SIGKILL if t.pid in killed else 0), (seed, t.stderr()[-2000:])
    _finish(db_url, conn)

    context = f"seed {seed}, killed {sorted(killed)}"
    statuses = dict(conn.execute("SELECT status, count(*) FROM job_runs GROUP BY status"))
    assert statuses == {"succeeded": total}, context
    _assert_each_run_done_once(conn, exec_log, {t.pid for t in ticks}, context)
    recorded = Counter(
        e["run_id"] for t in ticks for e in t.events("run finished") if e["outcome"] == "succeeded"
    )
    assert max(recorded.values()) == 1, context  # no outcome recorded twice


@pytest.mark.parametrize("restarts", [("fast", "immediate")])
def test_effects_commit_once_through_fast_and_immediate_server_restarts(
    private_server, private_db, start_tick, exec_log_here, restarts
):
    """Scenario: 3 ticks drain 900 runs; the server restarts fast, then as if it crashed."""
    exec_log, total = exec_log_here, 900
    effect_table(private_db)
    with psycopg.connect(private_db, autocommit=True) as conn:
        _enqueue_effects(conn, total)
    args = ("--lease", "5s", *ARGS)
    ticks = [start_tick(private_db, *args) for _ in range(3)]
    for share, mode in zip((0.2, 0.5), restarts, strict=True):
        wait_for(_progress(exec_log, share, total), "the drain to progress", timeout=60)
        getattr(private_server, f"restart_{mode}")()
        ticks += [start_tick(private_db, *args) for _ in range(2)]
    for t in ticks:
        # 0: reconnected and wound down; 1: could not reconnect in time, one line.
        assert t.wait(timeout=90) in (0, 1), t.stderr()[-2000:]
        assert all(line.startswith("{") for line in t.stderr().splitlines()), t.stderr()[-2000:]
    with psycopg.connect(private_db, autocommit=True) as conn:
        _finish(private_db, conn)
        statuses = dict(conn.execute("SELECT status, count(*) FROM job_runs GROUP BY status"))
        assert statuses == {"succeeded": total}
        _assert_each_run_done_once(conn, exec_log, {t.pid for t in ticks}, "restarts")


def test_operators_acting_on_runs_while_ticks_drain_them_break_nothing(
    db_url, conn, start_tick, exec_log_here, tmp_path
):
    """Scenario: cancel, retry, prune and schedule sync race three ticks draining 900 runs."""
    exec_log, total = exec_log_here, 900
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    effect_table(db_url)
    insert_runs(
        conn,
        500,
        "old.report",
        status="succeeded",
        attempts=1,
        started_at=now("-3 days"),
        finished_at=now("-3 days"),
    )
    _enqueue_effects(conn, total)
    ids = [r[0] for r in conn.execute("SELECT id FROM job_runs WHERE job_type = 'fault.effect'")]
    schedules = tmp_path / "schedules.toml"
    schedules.write_text(
        "".join(f'[schedules.s{i}]\ncron = "*/5 * * * *"\ntype = "fault.work"\n' for i in range(3))
    )
    ticks = [start_tick(db_url, "--lease", "5s", *ARGS) for _ in range(3)]
    cancelled: set[int] = set()
    retried: set[int] = set()
    url = ("--database-url", db_url)
    while any(t.proc.poll() is None for t in ticks):
        picked = [str(i) for i in rng.sample(ids, 10)]
        assert run_cli("cancel", *picked, *url).exit_code in (0, 1)
        cancelled.update(map(int, picked))
        again = [str(i) for i in rng.sample(sorted(cancelled), min(5, len(cancelled)))]
        assert run_cli("retry", *again, *url).exit_code in (0, 1)
        retried.update(map(int, again))
        assert run_cli("prune", "--older-than", "1d", *url).exit_code == 0
        assert run_cli("schedule", "sync", str(schedules), *url).exit_code == 0
    for t in ticks:
        assert t.wait(timeout=60) == 0, (seed, t.stderr()[-2000:])
    _finish(db_url, conn)

    context = f"seed {seed}"
    statuses = dict(
        conn.execute(
            "SELECT status, count(*) FROM job_runs WHERE job_type = 'fault.effect' GROUP BY status"
        )
    )
    assert set(statuses) <= {"succeeded", "cancelled"} and sum(statuses.values()) == total
    assert count(conn, "SELECT count(*) FROM job_runs WHERE job_type = 'old.report'") == 0
    assert count(conn, "SELECT count(*) FROM job_definitions") == 3
    gone = {r[0] for r in conn.execute("SELECT id FROM job_runs WHERE status = 'cancelled'")}
    assert gone <= cancelled, context
    effects_of_cancelled = count(
        conn, "SELECT count(*) FROM effect_rows WHERE run_id = ANY(%s)", sorted(gone)
    )
    assert effects_of_cancelled == 0, context  # a cancelled run's writes never committed
    _assert_each_run_done_once(conn, exec_log, {t.pid for t in ticks}, context, retried=retried)
