"""Dependencies: a run enqueued `after` others is claimable only once they have succeeded.

Real `jobrunner tick` processes run chains and diamonds; their handler
(tests/handlers/batches.py) logs every start and end with the wall clock, and the order is
read from that log. The race of two parents finishing at once is played out on two
connections, in an order the test chooses.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from cronjob import enqueue, new_run
from cronjob.api import enqueue_many
from cronjob.errors import BadInput
from tests.conftest import count, run_cli, wait_for
from tests.test_batches import Hosts, read_log


def status_of(conn: Any, run_id: int) -> tuple[str, str | None]:
    return conn.execute(
        "SELECT status, last_error FROM job_runs WHERE id = %s", [run_id]
    ).fetchone()


def work(conn: Any, *, after: list[int] | None = None, **payload: Any) -> int:
    return enqueue(conn, "batch.member", payload, after=after)


def spans(log: Any) -> dict[int, tuple[float, float]]:
    """Each run's last execution: (start, end)."""
    executions, _ = read_log(log)
    return {run_id: (times[0], times[-1]) for (run_id, _), times in sorted(executions.items())}


def test_a_chain_of_three_runs_one_after_another(db_url, conn, tmp_path):
    a = work(conn)
    b = work(conn, after=[a])
    c = work(conn, after=[b])
    assert [status_of(conn, r)[0] for r in (a, b, c)] == ["queued", "waiting", "waiting"]
    Hosts(db_url, tmp_path / "exec.log", 2).join()
    ran = spans(tmp_path / "exec.log")
    assert ran[a][1] <= ran[b][0] and ran[b][1] <= ran[c][0]
    assert [status_of(conn, r)[0] for r in (a, b, c)] == ["succeeded"] * 3


def test_a_diamond_runs_its_last_run_after_both_middle_ones(db_url, conn, tmp_path):
    a = work(conn)
    b = work(conn, after=[a], seconds=0.2)
    c = work(conn, after=[a])
    d = work(conn, after=[b, c])
    Hosts(db_url, tmp_path / "exec.log", 2).join()
    ran = spans(tmp_path / "exec.log")
    assert ran[a][1] <= min(ran[b][0], ran[c][0])
    assert max(ran[b][1], ran[c][1]) <= ran[d][0]
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 4


def test_a_dead_parent_cancels_its_children_and_theirs_with_a_reason_naming_it(
    db_url, conn, tmp_path
):
    a = work(conn, fail=True)
    b = work(conn, after=[a])
    c = work(conn, after=[b])
    anyway = enqueue(conn, "batch.member", {}, after=[a], after_policy="finished")
    Hosts(db_url, tmp_path / "exec.log", 1).join()
    assert status_of(conn, a)[0] == "dead"
    assert status_of(conn, b) == ("cancelled", f"cancelled: run {a}, which it waits for, is dead")
    assert status_of(conn, c) == (
        "cancelled",
        f"cancelled: run {b}, which it waits for, is cancelled",
    )
    assert status_of(conn, anyway)[0] == "succeeded"
    assert set(spans(tmp_path / "exec.log")) == {a, anyway}


def test_a_run_enqueued_after_runs_that_ended_already_is_decided_at_once(db_url, conn):
    done, gone = work(conn), work(conn)
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [done]
    )
    assert run_cli("cancel", str(gone), "--database-url", db_url).exit_code == 0
    assert status_of(conn, work(conn, after=[done]))[0] == "queued"
    late = work(conn, after=[done, gone])
    assert status_of(conn, late) == (
        "cancelled",
        f"cancelled: run {gone}, which it waits for, is cancelled",
    )


def test_unknown_ids_are_refused_at_enqueue_and_nothing_is_written(db_url, conn):
    a = work(conn)
    with pytest.raises(BadInput, match=r"no run with id 999998, 999999 to wait for"):
        enqueue_many(conn, [new_run("t", after=[a, 999999]), new_run("t", after=999998)])
    result = run_cli(
        "enqueue", "t", "--after", str(a), "--after", "424242", "--database-url", db_url
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "jobrunner: error: no run with id 424242 to wait for (after)"
    ]
    line = json.dumps({"type": "t", "after": [a, 777]}) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=line)
    assert result.exit_code == 2 and "777" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 1
    assert count(conn, "SELECT count(*) FROM job_run_dependencies") == 0


def test_the_command_line_and_jsonl_enqueue_runs_that_wait(db_url, conn):
    a = work(conn)
    result = run_cli("enqueue", "t", "--after", str(a), "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    lines = json.dumps({"type": "t", "after": [a], "after_policy": "finished"}) + "\n"
    result2 = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=lines)
    assert result2.exit_code == 0, result2.stderr
    rows = conn.execute(
        "SELECT run_id, policy FROM job_run_dependencies WHERE parent_id = %s ORDER BY run_id",
        [a],
    ).fetchall()
    assert rows == [(int(result.stdout), "succeeded"), (int(result2.stdout), "finished")]
    bad = run_cli("enqueue", "t", "--after-policy", "finished", "--database-url", db_url)
    assert bad.exit_code == 2


def _finish(conn: Any, run_id: int) -> None:
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [run_id]
    )


def test_two_parents_finishing_at_once_release_their_child(db_url, conn):
    b, c = work(conn), work(conn)
    d = work(conn, after=[b, c])
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        _finish(first, b)  # sees c unfinished; holds d until it commits
        finishing = threading.Thread(target=lambda: (_finish(second, c), second.commit()))
        finishing.start()
        wait_for(
            lambda: count(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'UPDATE job_runs%%'",
            ),
            "c's finish to wait for b's",
        )
        first.commit()
        finishing.join(20)
    assert status_of(conn, d)[0] == "queued"


def test_a_waiting_run_is_counted_and_can_be_cancelled(db_url, conn):
    a = work(conn)
    b = work(conn, after=[a])
    status = json.loads(run_cli("status", "--json", "--database-url", db_url).stdout)
    assert "waiting" in json.dumps(status)
    assert run_cli("cancel", str(b), "--database-url", db_url).exit_code == 0
    assert status_of(conn, b)[0] == "cancelled"


def test_show_names_the_runs_a_run_waits_for_and_those_that_wait_for_it(db_url, conn):
    a = work(conn)
    b = enqueue(conn, "batch.member", {}, after=[a], after_policy="finished")
    c = work(conn, after=[b])
    _finish(conn, a)
    shown = run_cli("show", str(b), "--database-url", db_url)
    assert shown.exit_code == 0, shown.stderr
    text = shown.stdout.split("\nwaits for", 1)[1]
    assert text.splitlines()[:5] == [
        " 1 run(s) (--after-policy finished):",
        f"  {a}  succeeded",
        "",
        "waited for by 1 run(s):",
        f"  {c}  waiting",
    ]
    data = json.loads(run_cli("show", str(b), "--json", "--database-url", db_url).stdout)
    assert data["waits_for"] == {
        "after_policy": "finished",
        "total": 1,
        "runs": [{"id": a, "status": "succeeded"}],
        "more": 0,
    }
    assert data["waited_for_by"]["runs"] == [{"id": c, "status": "waiting"}]
    alone = json.loads(run_cli("show", str(work(conn)), "--json", "--database-url", db_url).stdout)
    assert not {"batch", "waits_for", "waited_for_by"} & alone.keys()


def test_show_of_a_run_with_thousands_of_dependencies_lists_the_first_and_counts_the_rest(
    db_url, conn
):
    from cronjob.run_options import MAX_AFTER
    from cronjob.store.dependencies import LISTED_AT_MOST as SHOWN

    parents = enqueue_many(conn, [new_run("batch.member") for _ in range(MAX_AFTER)])
    waiting = work(conn, after=parents)
    children = enqueue_many(conn, [new_run("batch.member", after=[waiting]) for _ in range(2500)])
    shown = run_cli("show", str(waiting), "--database-url", db_url)
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"waits for {MAX_AFTER} run(s) (--after-policy succeeded):" in lines
    assert "waited for by 2500 run(s):" in lines
    assert f"  and {MAX_AFTER - SHOWN:,} more" in lines
    assert f"  and {2500 - SHOWN:,} more" in lines
    assert f"  {parents[SHOWN - 1]}  queued" in lines
    assert f"  {parents[SHOWN]}  queued" not in lines
    assert len(lines) < 100
    data = json.loads(run_cli("show", str(waiting), "--json", "--database-url", db_url).stdout)
    assert [r["id"] for r in data["waits_for"]["runs"]] == parents[:SHOWN]
    assert data["waits_for"]["more"] == MAX_AFTER - SHOWN
    assert [r["id"] for r in data["waited_for_by"]["runs"]] == children[:SHOWN]
    assert data["waited_for_by"] | {"runs": None} == {
        "total": 2500, "runs": None, "more": 2500 - SHOWN,
    }  # fmt: skip


def test_each_foreign_key_of_the_dependencies_has_an_index_that_leads_with_its_column(conn):
    """Pruning a run deletes its edges by ON DELETE CASCADE, a lookup per foreign key: on an
    index, not a scan of every edge, whatever the table holds."""
    unindexed = conn.execute(
        """SELECT a.attname FROM pg_constraint c
           JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
           WHERE c.conrelid = 'job_run_dependencies'::regclass AND c.contype = 'f'
             AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.conrelid
                             AND i.indkey[0] = c.conkey[1])"""
    ).fetchall()
    keys = count(
        conn,
        "SELECT count(*) FROM pg_constraint"
        " WHERE conrelid = 'job_run_dependencies'::regclass AND contype = 'f'",
    )
    assert keys == 2 and unindexed == []
