"""A claim and an operator acting on the same runs at the same moment.

A claim is one statement whose runs are chosen by functions (migrations 0021, 0022): the
statement reads job_runs through its own snapshot, and each function statement that locks a
run reads through a later one. What an operator commits in between (a retry of a cancelled
or dead run) is seen by the function and not by the statement. The tests that race pause the claim
right there with a lock held from a third session, act, then let it go: no sleep races them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cronjob import store
from cronjob.models import TypeLimit
from tests.conftest import jobrunner_process, wait_for
from tests.factories import insert_run
from tests.test_history_cost import actual, counted
from tests.test_lifecycle import run_row


def _executions(exec_log: Any) -> list[tuple[int, int]]:
    """(run id, attempt) of each execution the handlers recorded, in order."""
    if not exec_log.exists():
        return []
    return [(int(w[0]), int(w[1])) for w in map(str.split, exec_log.read_text().splitlines())]


def _waiting_for(conn: psycopg.Connection[Any], table: str, process: subprocess.Popen[str]) -> bool:
    """Whether a session waits for a lock on `table`; fails at once if `process` ended."""
    if process.poll() is not None:
        _out, err = process.communicate()
        raise AssertionError(f"the tick ended before it waited: {err[-2000:]}")
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = %s::regclass)",
        [table],
    ).fetchone()[0]


@pytest.mark.parametrize("finished", ["cancelled", "dead"])
def test_a_run_retried_while_a_claim_chooses_its_runs_is_claimed_and_run_once(
    db_url, conn, tmp_path, finished
):
    # A rate-limited run makes the claim count its start in job_rate_arrivals after its
    # statement began and before its fair part chooses the other runs: a lock held on that
    # table pauses it there. The retry's transaction began before the claim's, so the run is
    # due by the claim's clock, as when the two overlap by a few milliseconds.
    exec_log = tmp_path / "exec.log"
    limit = TypeLimit("test.sleep", concurrency=None, rate=100, rate_period=60.0, per="type",
                      per_field=None)  # fmt: skip
    store.job_type_limit_set(conn, limit, actor="tests")
    limited = insert_run(conn, "test.sleep", payload={"seconds": 0})
    retried = insert_run(conn, "test.ok", status=finished, attempts=1)
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url) as operator:
        holder.execute("LOCK TABLE job_rate_arrivals IN SHARE MODE")
        operator.execute("SELECT now()")
        tick = jobrunner_process(
            "tick", "--database-url", db_url, "--handlers", "tests.handlers.basic", "--json",
            env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
        )  # fmt: skip
        try:
            wait_for(lambda: _waiting_for(conn, "job_rate_arrivals", tick), "the claim to wait")
            [change] = store.runs_retry_many(operator, [retried])
            operator.commit()
            assert change.changed
        except BaseException:
            tick.kill()
            raise
        holder.rollback()
    out, err = tick.communicate(timeout=60)

    assert tick.returncode == 0, err[-2000:]
    assert json.loads(out)["succeeded"] == 2
    assert sorted(_executions(exec_log)) == [(limited, 1), (retried, 1)]
    assert (run_row(conn, retried).status, run_row(conn, retried).attempts) == ("succeeded", 1)
    assert counted(conn) == actual(conn)  # the finished-run tally saw the newer version too


def _status_writes() -> dict[str, str]:
    """The SET clause of every statement of cronjob.queries that changes a run's status, by
    the name of the statement (module.NAME)."""
    import importlib
    import pkgutil

    import cronjob.queries

    found = {}
    for module_info in pkgutil.iter_modules(cronjob.queries.__path__):
        module = importlib.import_module(f"cronjob.queries.{module_info.name}")
        for name, text in vars(module).items():
            if not isinstance(text, str) or name.startswith("_"):
                continue
            for update in re.finditer(r"UPDATE job_runs\b.*?\n\s*SET\b(.*?)\n\s*(FROM|WHERE)\b",
                                      text, re.S):  # fmt: skip
                if re.search(r"(^|,)\s*status\s*=", update.group(1), re.M):
                    found[f"{module_info.name}.{name}"] = update.group(1)
    return found


def test_every_statement_that_changes_a_runs_status_sets_the_columns_tied_to_it():
    # The constraints job_runs_finished_iff_terminal and job_runs_leased_iff_running: a
    # statement whose rows are chosen through another snapshot (a function, a locking CTE)
    # builds its row from the version its own sees first, and the constraints are checked
    # on that row. Every column they tie to the status is set, whatever that version held.
    writes = _status_writes()
    assert {"runs.RUNS_CLAIM_MANY", "runs.RUNS_FINALIZE_MANY", "runs.RUNS_HAND_BACK_MANY",
            "runs.RUNS_RESCUE_MANY", "runs.RUNS_RETRY_MANY", "runs.RUNS_CANCEL_MANY",
            "incidents.RUNS_RETRY_SELECTED"} <= set(writes)  # fmt: skip
    unset = {
        name: column
        for name, clause in writes.items()
        for column in ("finished_at", "lease_token", "locked_until")
        if not re.search(rf"\b{column}\s*=", clause)
    }
    assert unset == {}


@pytest.fixture
def claims_of_fault_work_rejected(db_url: str) -> Iterator[None]:
    """A constraint of the test's own on job_runs: a claim of a fault.work run is rejected
    for its row, as a claim was for the race above, on a connection that works."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "ALTER TABLE job_runs ADD CONSTRAINT test_work_never_runs"
            " CHECK (status <> 'running' OR job_type <> 'fault.work') NOT VALID"
        )
    try:
        yield
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("ALTER TABLE job_runs DROP CONSTRAINT test_work_never_runs")


def _lines_until(process: subprocess.Popen[str], event: str) -> list[dict[str, Any]]:
    """The JSON lines `process` writes on stderr, up to the first of `event` (or its end)."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(json.loads(line) if line.startswith("{") else {"text": line})
        if lines[-1].get("event") == event:
            break
    return lines


def test_a_claim_rejected_for_its_rows_lets_running_handlers_finish_under_their_leases(
    db_url, conn, tmp_path, claims_of_fault_work_rejected
):
    # The first claim takes the gated run alone (a batch of one); the second takes the
    # fault.work run, and pauses at its rate count (the lock held on job_rate_arrivals) until
    # the gated run's handler has started. Then its row is rejected. The handler is let go
    # only once the tick says it claims nothing more.
    exec_log, release = tmp_path / "exec.log", tmp_path / "release"
    gated = TypeLimit("fault.gated", concurrency=10, rate=None, rate_period=None, per="type",
                      per_field=None)  # fmt: skip
    rated = TypeLimit("fault.work", concurrency=None, rate=100, rate_period=60.0, per="type",
                      per_field=None)  # fmt: skip
    for limit in (gated, rated):
        store.job_type_limit_set(conn, limit, actor="tests")
    running = insert_run(conn, "fault.gated", payload={"release": str(release)})
    rejected = insert_run(conn, "fault.work", payload={"ms": 0})
    with psycopg.connect(db_url) as holder:
        holder.execute("LOCK TABLE job_rate_arrivals IN SHARE MODE")
        tick = jobrunner_process(
            "tick", "--database-url", db_url, "--handlers", "tests.handlers.faults",
            "--batch-size", "1", "--grace", "60s", "--json",
            env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
        )  # fmt: skip
        try:
            wait_for(lambda: _executions(exec_log), "the gated run's handler to start")
            wait_for(lambda: _waiting_for(conn, "job_rate_arrivals", tick), "the claim to wait")
        except BaseException:
            tick.kill()
            raise
        holder.rollback()
    lines = _lines_until(tick, "stopping: claiming nothing more")
    release.touch()
    _out, err = tick.communicate(timeout=60)

    assert [line.get("sqlstate") for line in lines if line.get("event") == "database error"] == [
        "23514"
    ]
    assert tick.returncode == 1, err[-2000:]
    assert err.splitlines()[-1] == (
        "jobrunner: error: the database refused the tick's claim: new row for relation"
        ' "job_runs" violates check constraint "test_work_never_runs"; every run it claimed'
        " was recorded or handed back"
    )
    [stopped] = [line for line in map(json.loads, err.splitlines()[:-1])
                 if line["event"] == "tick stopped"]  # fmt: skip
    assert (stopped["succeeded"], stopped["handed_back"]) == (1, 0)
    assert _executions(exec_log) == [(running, 1)]  # once, and never handed back to run again
    assert (run_row(conn, running).status, run_row(conn, running).attempts) == ("succeeded", 1)
    assert (run_row(conn, rejected).status, run_row(conn, rejected).attempts) == ("queued", 0)
