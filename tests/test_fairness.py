"""Fair tenants by default: within one priority a claim takes runs tenant by tenant, in turns,
so one tenant's backlog delays another tenant's due run by no more than one batch.

One real tick drains the queue; the test handler logs each run as it executes (a record kept
outside the database), and the order of that log is the order the tick ran them in.
"""

from __future__ import annotations

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from tests.factories import insert_runs, now, tick


def executed(log) -> list[int]:
    return [int(line.split()[0]) for line in log.read_text().splitlines()]


def test_ten_small_tenants_finish_within_the_first_300_runs_beside_a_backlog_of_20000(
    db_url, conn, tmp_path, monkeypatch
):
    log = tmp_path / "exec.log"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(log))
    due = now("-1 minute")
    insert_runs(conn, 20_000, "test.ok", tenant_id="A", run_at=due)
    small = {
        run_id
        for tenant in "BCDEFGHIJK"
        for run_id in insert_runs(conn, 20, "test.ok", tenant_id=tenant, run_at=due)
    }
    conn.execute("ANALYZE job_runs")
    report = tick(db_url, "test.ok", batch_size=100)
    order = executed(log)
    assert report.succeeded == len(order) == 20_200
    positions = [i for i, run_id in enumerate(order) if run_id in small]
    assert len(positions) == 200 and max(positions) < 300


def test_more_tenants_than_a_batch_holds_take_turns_from_claim_to_claim(
    db_url, conn, tmp_path, monkeypatch
):
    log = tmp_path / "exec.log"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(log))
    due = now("-1 minute")
    insert_runs(conn, 2_000, "test.ok", tenant_id="A", run_at=due)
    first: dict[str, int] = {}
    for n in range(300):
        ids = insert_runs(conn, 3, "test.ok", tenant_id=f"t{n:03d}", run_at=due)
        first[f"t{n:03d}"] = ids[0]
    tick(db_url, "test.ok", batch_size=100)
    order = executed(log)
    # 301 tenants: each has had its first run once 301 runs have finished (a batch may end
    # part-way through a turn, and the next claim goes on from where it stopped).
    assert max(order.index(run_id) for run_id in first.values()) < 301 + 100


def test_a_lower_priority_number_still_runs_first_whatever_its_tenant(
    db_url, conn, tmp_path, monkeypatch
):
    log = tmp_path / "exec.log"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(log))
    due = now("-1 minute")
    later = insert_runs(conn, 50, "test.ok", tenant_id="A", run_at=due, priority=5)
    urgent = insert_runs(conn, 50, "test.ok", tenant_id="B", run_at=due, priority=-5)
    tick(db_url, "test.ok", batch_size=10, concurrency=1)
    order = executed(log)
    assert order[:50] == urgent and sorted(order[50:]) == later
