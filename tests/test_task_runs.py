"""The store's side of Django tasks, without Django: queues, waiting task types, return values,
result ids."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from cronjob import store
from cronjob.api import insert_runs, new_run
from cronjob.queries.enqueue import RUNS_INSERT_MANY, runs_insert_many_sending
from cronjob.queries.tasks import TASK_RESULT_GET_BY_RESULT_ID, TASK_TYPES_WAITING
from tests.factories import insert_runs as insert_runs_by_sql


def _enqueue(conn: psycopg.Connection[Any], job_type: str, queue: str | None) -> int:
    return insert_runs(conn, [new_run(job_type, {"args": [], "kwargs": {}}, queue=queue)])[0]


def test_only_task_runs_name_a_queue(conn: psycopg.Connection[Any]) -> None:
    plain = insert_runs(conn, [new_run("send_email")])[0]
    task = _enqueue(conn, "shop.tasks.add", "emails")
    queues = dict(conn.execute("SELECT id, queue FROM job_runs").fetchall())
    assert queues == {plain: None, task: "emails"}
    # Plain enqueues leave the column out, so they work on a schema without it.
    assert "queue" not in RUNS_INSERT_MANY
    assert "queue" in runs_insert_many_sending(("queue",))


def test_waiting_task_types_are_found_by_one_probe_per_queue_and_type(
    conn: psycopg.Connection[Any],
) -> None:
    insert_runs_by_sql(conn, 20000, "shop.tasks.add", queue="default")
    _enqueue(conn, "shop.tasks.mail", "emails")
    _enqueue(conn, "shop.tasks.add", "emails")
    done = _enqueue(conn, "shop.tasks.done", "emails")
    store.runs_cancel_many(conn, [done])
    insert_runs(conn, [new_run("send_email")])
    conn.execute("ANALYZE job_runs")
    assert sorted(store.task_types_waiting(conn, None)) == ["shop.tasks.add", "shop.tasks.mail"]
    assert sorted(store.task_types_waiting(conn, ["emails"])) == [
        "shop.tasks.add",
        "shop.tasks.mail",
    ]
    assert store.task_types_waiting(conn, ["nowhere"]) == []
    plan = conn.execute(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {TASK_TYPES_WAITING}", {"queues": None}
    ).fetchone()[0]
    assert _most_rows_read(plan[0]["Plan"]) < 10  # not the 20,000 runs of the default queue


def _most_rows_read(node: dict[str, Any]) -> int:
    own = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
    return max([own, *(_most_rows_read(child) for child in node.get("Plans", []))])


def test_a_return_value_is_written_only_under_the_runs_lease(
    conn: psycopg.Connection[Any],
) -> None:
    _enqueue(conn, "shop.tasks.add", "default")
    [run] = store.runs_claim_many(
        conn, job_types=["shop.tasks.add"], leases=[60], max_attempts=[3], limit=1, worker="w"
    )
    assert store.task_return_value_set(conn, run.id, run.lease_token, json.dumps({"sum": 3}))
    stale = run.lease_token.__class__(int=0)
    assert not store.task_return_value_set(conn, run.id, stale, "1")
    row = store.task_result_get(conn, run.id)
    assert json.loads(row["return_value"]) == {"sum": 3}
    assert row["queue"] == "default" and row["status"] == "running" and row["locked_by"] == "w"


def test_a_result_is_found_by_its_result_id_in_one_index_probe(
    conn: psycopg.Connection[Any],
) -> None:
    insert_runs_by_sql(conn, 20000, "shop.tasks.add", queue="default")
    wanted = uuid.uuid4()
    run_id = insert_runs(conn, [new_run("shop.tasks.add", queue="default", result_id=wanted)])[0]
    conn.execute("ANALYZE job_runs")
    assert store.task_result_get_by_result_id(conn, wanted)["id"] == run_id
    assert store.task_result_get_by_result_id(conn, uuid.uuid4()) is None
    plan = conn.execute(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {TASK_RESULT_GET_BY_RESULT_ID}", {"result_id": wanted}
    ).fetchone()[0]
    assert _most_rows_read(plan[0]["Plan"]) < 10  # not the 20,000 runs without one
