"""status, metrics and check read the active queue and a tally, never finished history."""

from __future__ import annotations

import json
from typing import Any

import psycopg

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import store
from cronjob.api import enqueue
from cronjob.queries.tally import RUNS_SNAPSHOT
from tests.conftest import run_cli
from tests.factories import insert_runs, now, tick


def counted(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    """Runs by (type, status), as the snapshot reports them."""
    return {(c.job_type, c.status.value): c.runs for c in store.runs_snapshot(conn).cells}


def actual(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    rows = conn.execute("SELECT job_type, status, count(*) FROM job_runs GROUP BY 1, 2")
    return {(t, s): n for t, s, n in rows.fetchall()}


def test_the_snapshot_counts_finished_runs_exactly_through_every_way_they_change(db_url, conn):
    for _ in range(4):
        enqueue(conn, "test.ok", {})
        enqueue(conn, "test.give_up", {})
    tick(db_url, "test.ok", "test.give_up")
    assert counted(conn) == actual(conn)

    insert_runs(conn, 5, "import", status="succeeded")  # by hand, as a restore or a script would
    run_cli("retry", "--status", "dead", "--limit", "2", "--yes", "--database-url", db_url)
    run_cli("cancel", "--type", "test.give_up", "--yes", "--database-url", db_url)
    run_cli("prune", "--type", "import", "--limit", "3", "--database-url", db_url)
    conn.execute("UPDATE job_runs SET status = 'dead' WHERE job_type = 'import'")
    conn.execute("DELETE FROM job_runs WHERE id = (SELECT min(id) FROM job_runs)")
    assert counted(conn) == actual(conn)

    store.run_tally_compact(conn)
    assert counted(conn) == actual(conn)
    rows = conn.execute("SELECT job_type, status, count(*) FROM job_run_tally GROUP BY 1, 2")
    assert {n for _, _, n in rows.fetchall()} == {1}  # one row per (type, status) once folded


def test_a_tick_that_did_work_folds_the_tally(db_url, conn):
    for _ in range(3):
        enqueue(conn, "test.ok", {})
        tick(db_url, "test.ok")
    assert conn.execute("SELECT count(*) FROM job_run_tally").fetchone()[0] == 1
    assert counted(conn) == {("test.ok", "succeeded"): 3}


def test_the_last_start_of_a_type_is_known_without_reading_its_history(db_url, conn):
    enqueue(conn, "test.ok", {})
    tick(db_url, "test.ok")
    latest = conn.execute("SELECT max(started_at) FROM job_runs").fetchone()[0]
    status = json.loads(run_cli("status", "--json", "--database-url", db_url).stdout)
    assert status["job_types"]["test.ok"]["last_started_at"] == latest.isoformat()


def test_the_snapshot_reads_no_finished_run(db_url, conn):
    insert_runs(conn, 20000, "old", status="succeeded", started_at=now())
    enqueue(conn, "test.ok", {})
    conn.execute("ANALYZE job_runs")
    [[plan]] = conn.execute("EXPLAIN (FORMAT JSON) " + RUNS_SNAPSHOT, {"now": None}).fetchall()

    def scans(node: dict[str, Any]) -> list[str]:
        found = [node["Node Type"]] if node.get("Relation Name") == "job_runs" else []
        for child in node.get("Plans", []):
            found.extend(scans(child))
        return found

    # One scan through each partial index (runnable, running, waiting); never one of the table.
    found = scans(plan[0]["Plan"])
    assert len(found) == 3 and "Seq Scan" not in found, found


def test_what_holds_back_cleanup_is_read_from_the_servers_views_alone(conn):
    from cronjob.queries.server import SERVER_LIST_SNAPSHOT_HOLDERS

    params = {"now": None, "limit": 100}
    [[plan]] = conn.execute("EXPLAIN (FORMAT JSON) " + SERVER_LIST_SNAPSHOT_HOLDERS, params)

    def relations(node: dict[str, Any]) -> set[str]:
        found = {node["Relation Name"]} if "Relation Name" in node else set()
        for child in node.get("Plans", []):
            found |= relations(child)
        return found

    found = relations(plan[0]["Plan"])
    assert "pg_database" in found  # the catalogs behind the views; no table of jobrunner's
    assert not {name for name in found if name.startswith("job")}, found
