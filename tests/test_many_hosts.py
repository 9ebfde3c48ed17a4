"""Many hosts at once: batches that share idempotency keys, and hosts queued behind a lock.

Real processes against the real server. Each test holds what makes the race certain (a key,
a lock) in a transaction of its own, waits until the server shows the processes waiting on
it, and then lets go: the outcome does not depend on timing.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import psycopg

from tests.conftest import jobrunner_process

# The runner's 5 s lock_timeout, made short enough to be sure a waiting host outlasts it.
SHORT_LOCK_TIMEOUT = {"PGOPTIONS": "-c lock_timeout=200"}


def _waiting_on_locks(
    conn: psycopg.Connection[Any], *processes: subprocess.Popen[str], longer_than: float = 0
) -> None:
    """Wait until each of `processes` waits on a lock (for `longer_than` s), failing at once
    if one of them ends instead."""
    count = len(processes)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ended = [p for p in processes if p.poll() is not None]
        if ended:
            raise AssertionError(f"ended instead of waiting: {ended[0].communicate()[1]}")
        waiting = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND application_name = 'jobrunner' AND datname = current_database()"
            " AND now() - state_change > make_interval(secs => %s)",
            [longer_than],
        ).fetchone()[0]
        if waiting >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} jobrunner processes waiting on a lock")


def test_two_batches_sharing_keys_in_opposite_orders_both_succeed_and_agree(db_url, conn, tmp_path):
    from cronjob.api import enqueue

    keys = [f"nightly:{n:04d}" for n in range(200)]
    forward, backward = tmp_path / "forward.jsonl", tmp_path / "backward.jsonl"
    for path, order in ((forward, keys), (backward, list(reversed(keys)))):
        path.write_text(
            "".join(json.dumps({"type": "t", "idempotency_key": k}) + "\n" for k in order)
        )
    with psycopg.connect(db_url) as holder:
        # Holding the middle key stops both batches halfway, each holding half of the keys
        # the other needs next: without turns, letting go of it deadlocks them.
        enqueue(holder, "t", idempotency_key=keys[100])
        first = jobrunner_process("enqueue", "--jsonl", str(forward), "--database-url", db_url)
        second = jobrunner_process("enqueue", "--jsonl", str(backward), "--database-url", db_url)
        _waiting_on_locks(conn, first, second)
        holder.rollback()
    out_first, err_first = first.communicate(timeout=60)
    out_second, err_second = second.communicate(timeout=60)
    assert first.returncode == 0, err_first
    assert second.returncode == 0, err_second
    ids_first = [int(i) for i in out_first.split()]
    ids_second = [int(i) for i in out_second.split()]
    assert len(ids_first) == len(keys)
    assert ids_first == list(reversed(ids_second))
    assert conn.execute("SELECT count(*) FROM job_runs").fetchone()[0] == len(keys)


def test_a_host_queued_behind_a_migration_waits_past_the_lock_timeout_and_says_so(db_url, conn):
    from cronjob import store

    with psycopg.connect(db_url) as holder:
        store.migrations_lock(holder)
        waiting = jobrunner_process("migrate", "--database-url", db_url, env=SHORT_LOCK_TIMEOUT)
        _waiting_on_locks(conn, waiting, longer_than=1.0)
        holder.commit()
    _, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, stderr
    events = [json.loads(line)["event"] for line in stderr.splitlines()]
    assert events == ["waiting for another host's migration", "schema up to date"]


def test_a_host_queued_behind_a_schedule_sync_waits_past_the_lock_timeout(db_url, conn, tmp_path):
    from cronjob import store

    path = tmp_path / "schedules.toml"
    path.write_text('[schedules.nightly]\ncron = "0 2 * * *"\ntype = "t"\n')
    with psycopg.connect(db_url) as holder:
        store.definitions_lock_for_sync(holder)
        waiting = jobrunner_process(
            "schedule", "sync", str(path), "--database-url", db_url, env=SHORT_LOCK_TIMEOUT
        )
        _waiting_on_locks(conn, waiting, longer_than=1.0)
        holder.commit()
    stdout, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, stderr
    assert "waiting for another host's schedule sync" in stderr
    assert "add       nightly" in stdout


def test_a_host_gives_up_after_lock_wait_with_one_line_and_exit_1(db_url, conn):
    from cronjob import store

    with psycopg.connect(db_url) as holder:
        store.migrations_lock(holder)
        waiting = jobrunner_process("migrate", "--lock-wait", "1s", "--database-url", db_url)
        _, stderr = waiting.communicate(timeout=60)
        holder.rollback()
    assert waiting.returncode == 1, stderr
    *log, last = stderr.strip().splitlines()
    assert [json.loads(line)["event"] for line in log] == ["waiting for another host's migration"]
    assert last == (
        "jobrunner: error: gave up waiting for another host's migration after 1s "
        "(--lock-wait sets how long to wait)"
    )
