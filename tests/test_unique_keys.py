"""Unique while active, and debounce: `--unique-key` and `--replace`, at every door.

A unique key is unique among the runs of a type and tenant that have not finished: enqueueing
it again returns the run that holds it. Unlike an idempotency key, it is free again once that
run has finished. `--replace` also gives the waiting run the new payload and run_at.
"""

from __future__ import annotations

import json
from datetime import timedelta

from tests.conftest import count, jobrunner_process, run_cli
from tests.factories import insert_run


def enqueue(db_url: str, *args: str) -> int:
    result = run_cli("enqueue", "reindex", *args, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def test_a_unique_key_held_by_a_waiting_run_returns_that_run(db_url, conn):
    first = enqueue(db_url, "--unique-key", "user:7")
    again = enqueue(db_url, "--unique-key", "user:7", "--payload", '{"n": 2}')
    assert again == first
    assert count(conn, "SELECT count(*) FROM job_runs") == 1
    assert conn.execute("SELECT payload FROM job_runs").fetchone()[0] == {}


def test_a_unique_key_is_free_again_once_its_run_has_finished(db_url, conn):
    for status in ("succeeded", "dead", "cancelled"):
        held = insert_run(conn, "reindex", unique_key=f"k-{status}", status=status)
        assert enqueue(db_url, "--unique-key", f"k-{status}") != held
    held = insert_run(conn, "reindex", unique_key="k-running", status="running")
    assert enqueue(db_url, "--unique-key", "k-running") == held
    held = insert_run(conn, "reindex", unique_key="k-failed", status="failed", attempts=1)
    assert enqueue(db_url, "--unique-key", "k-failed") == held


def test_a_unique_key_is_per_type_and_tenant(db_url, conn):
    ids = {
        enqueue(db_url, "--unique-key", "K"),
        enqueue(db_url, "--unique-key", "K", "--tenant", "acme"),
        int(run_cli("enqueue", "other", "--unique-key", "K", "--database-url", db_url).stdout),
    }
    assert len(ids) == 3


def test_eight_concurrent_enqueuers_of_one_unique_key_make_one_run(db_url, conn):
    processes = [
        jobrunner_process(
            "enqueue",
            "reindex",
            "--unique-key",
            "user:7",
            "--payload",
            json.dumps({"n": n}),
            "--database-url",
            db_url,
        )
        for n in range(8)
    ]
    ids = set()
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        ids.add(int(out))
    assert len(ids) == 1
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def test_replace_keeps_the_last_payload_and_pushes_run_at(db_url, conn):
    first = enqueue(db_url, "--unique-key", "user:7", "--delay", "30s", "--payload", '{"n": 1}')
    before = conn.execute("SELECT run_at FROM job_runs").fetchone()[0]
    again = enqueue(
        db_url, "--unique-key", "user:7", "--replace", "--delay", "60s", "--payload", '{"n": 2}'
    )
    assert again == first
    payload, run_at = conn.execute("SELECT payload, run_at FROM job_runs").fetchone()
    assert payload == {"n": 2}
    assert run_at - before >= timedelta(seconds=29)


def test_eight_concurrent_replacing_enqueuers_leave_one_run_with_one_of_their_payloads(
    db_url, conn
):
    processes = [
        jobrunner_process(
            "enqueue",
            "reindex",
            "--unique-key",
            "user:7",
            "--replace",
            "--delay",
            "30s",
            "--payload",
            json.dumps({"n": n}),
            "--database-url",
            db_url,
        )
        for n in range(8)
    ]
    for process in processes:
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    rows = conn.execute("SELECT payload FROM job_runs").fetchall()
    assert len(rows) == 1 and rows[0][0]["n"] in range(8)


def test_replace_leaves_a_run_that_has_started_alone(db_url, conn):
    running = insert_run(conn, "reindex", unique_key="K", status="running", payload={"n": 1})
    assert enqueue(db_url, "--unique-key", "K", "--replace", "--payload", '{"n": 2}') == running
    retrying = insert_run(
        conn, "reindex", unique_key="R", status="failed", attempts=1, payload={"n": 1}
    )
    assert enqueue(db_url, "--unique-key", "R", "--replace", "--payload", '{"n": 2}') == retrying
    payloads = conn.execute("SELECT payload FROM job_runs ORDER BY id").fetchall()
    assert payloads == [({"n": 1},), ({"n": 1},)]


def test_replace_without_a_unique_key_is_refused(db_url, conn):
    result = run_cli("enqueue", "reindex", "--replace", "--database-url", db_url)
    assert result.exit_code == 2
    assert "--replace needs a unique key" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_python_api_takes_unique_key_and_replace(db_url, conn):
    from cronjob import enqueue as api_enqueue

    first = api_enqueue(conn, "reindex", {"n": 1}, unique_key="user:7")
    again = api_enqueue(conn, "reindex", {"n": 2}, unique_key="user:7", replace=True)
    assert again == first
    assert conn.execute("SELECT payload FROM job_runs").fetchone()[0] == {"n": 2}


def test_a_jsonl_batch_with_a_unique_key_twice_makes_one_run(db_url, conn):
    lines = "".join(
        json.dumps({"type": "reindex", "unique_key": "K", "payload": {"n": n}}) + "\n"
        for n in range(3)
    )
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=lines)
    assert result.exit_code == 0, result.stderr
    assert len(set(result.stdout.split())) == 1
    assert count(conn, "SELECT count(*) FROM job_runs") == 1
