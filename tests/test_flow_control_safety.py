"""What a run's key, one limited type and another session can do to flow control: a key of any
length, a type whose choice fails, a key whose place is taken and a lock another login holds
stop no other type, tenant or key, and the tick says so when it cannot do its work.

Real `jobrunner tick` processes (their JSON log lines read from stderr) and the command line,
on the test database.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cronjob import store
from tests.conftest import count, jobrunner_process, run_cli, wait_for
from tests.factories import insert_run, insert_runs

HANDLERS = "tests.handlers.flow,tests.handlers.basic"


def limit(db_url: str, job_type: str, *args: str) -> None:
    result = run_cli("limit", job_type, *args, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr


def ticked(db_url: str, *args: str) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """One real tick: its exit code, its summary, and its log's events; the error it ended
    with, if any, as the last event ("jobrunner: error: ...")."""
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--json", *args
    )
    out, err = process.communicate(timeout=120)
    events = [
        json.loads(line) if line.startswith("{") else {"event": line, "level": "exit"}
        for line in err.splitlines()
    ]
    summary = json.loads(out) if out.strip() else {}
    return process.returncode, summary, events


def outcomes(conn: Any) -> dict[tuple[str, str, int], int]:
    rows = conn.execute(
        "SELECT job_type, status, attempts, count(*) FROM job_runs GROUP BY 1, 2, 3"
    ).fetchall()
    return {(t, s, a): n for t, s, a, n in rows}


# -- a key of any length ---------------------------------------------------------------


def test_a_limit_key_of_8000_characters_stops_no_claim_of_any_type(db_url, conn):
    limit(db_url, "flow.work", "--rate", "100/1m", "--per", "payload:account")
    insert_run(conn, "flow.work", payload={"account": secrets.token_hex(4000), "seconds": 0})
    insert_runs(conn, 3, "test.ok")
    code, summary, events = ticked(db_url)
    assert code == 0, events
    assert summary["claimed"] == 4
    assert outcomes(conn) == {("flow.work", "succeeded", 1): 1, ("test.ok", "succeeded", 1): 3}
    # The key is kept as its digest, a fixed 32 bytes.
    rows = conn.execute("SELECT octet_length(key_digest) FROM job_rate_arrivals").fetchall()
    assert rows == [(32,)]


# -- one limited type's failure --------------------------------------------------------


@pytest.fixture
def rates_refused_for_flow_work(db_url: str) -> Iterator[None]:
    """Whatever breaks the choice of one limited type's runs: here, the database refuses to
    time flow.work's starts (a trigger), with the error an oversized key gave."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "CREATE FUNCTION test_refuse_rate() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION USING ERRCODE = '54000',"
            " MESSAGE = 'index row size 8024 exceeds btree version 4 maximum 2704'; END $$"
        )
        c.execute(
            "CREATE TRIGGER test_refuse_rate BEFORE INSERT ON job_rate_arrivals FOR EACH ROW"
            " WHEN (NEW.job_type = 'flow.work') EXECUTE FUNCTION test_refuse_rate()"
        )
    try:
        yield
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("DROP TRIGGER test_refuse_rate ON job_rate_arrivals")
            c.execute("DROP FUNCTION test_refuse_rate()")


def test_a_limited_type_whose_choice_fails_fails_alone_and_the_tick_exits_1(
    db_url, conn, rates_refused_for_flow_work
):
    limit(db_url, "flow.work", "--rate", "100/1m")
    limit(db_url, "test.sleep", "--concurrency", "5")
    insert_runs(conn, 2, "flow.work", payload={"seconds": 0})
    insert_runs(conn, 3, "test.sleep", payload={"seconds": 0})
    insert_runs(conn, 3, "test.ok")
    # A claim a run: each claim meets flow.work's failure again.
    code, summary, events = ticked(db_url, "--batch-size", "1")
    assert code == 1
    assert (summary["claimed"], summary["unclaimable"]) == (6, ["flow.work"])
    assert outcomes(conn) == {
        ("flow.work", "queued", 0): 2,
        ("test.sleep", "succeeded", 1): 3,
        ("test.ok", "succeeded", 1): 3,
    }
    told = [e for e in events if e["event"] == "limited job type not claimed"]
    assert [(e["job_type"], e["level"]) for e in told] == [("flow.work", "warning")]
    assert "index row size 8024" in told[0]["error"]
    assert events[-1]["event"].startswith(
        "jobrunner: error: the runs of limited job type 'flow.work' could not be claimed:"
        " index row size 8024"
    )


@pytest.fixture
def claims_refused(db_url: str) -> Iterator[None]:
    """An index on job_runs whose entry for a running run with a long payload field is too
    large: the claim's update of such a run fails, each time the same way."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "CREATE INDEX test_oversized ON job_runs"
            " ((CASE WHEN status = 'running' THEN payload ->> 'blob' END))"
        )
    try:
        yield
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("DROP INDEX test_oversized")


def test_a_tick_whose_claim_fails_exits_1(db_url, conn, claims_refused):
    insert_run(conn, "test.ok", payload={"blob": secrets.token_hex(4000)})
    code, _, events = ticked(db_url)
    assert code == 1
    assert events[-1]["event"].startswith(
        "jobrunner: error: the database refused the tick's claim: index row size"
    )
    assert outcomes(conn) == {("test.ok", "queued", 0): 1}


# -- a key without room ----------------------------------------------------------------


def test_an_exhausted_key_of_one_tenant_starves_no_other_tenant(db_url, conn):
    # aaa's 400 due runs all wait for key "hog", whose one place a running run holds; zzz's
    # one run has key "victim". The walk goes tenant by tenant, aaa first.
    limit(db_url, "flow.work", "--concurrency", "1", "--per", "payload:account")
    hog = {"account": "hog", "seconds": 0}
    insert_run(conn, "flow.work", status="running", tenant_id="aaa", payload=hog)
    insert_runs(conn, 400, "flow.work", tenant_id="aaa", payload=hog)
    victim = insert_run(
        conn, "flow.work", tenant_id="zzz", payload={"account": "victim", "seconds": 0}
    )
    claimed = []
    for _ in range(3):
        code, summary, events = ticked(db_url)
        assert code == 0, events
        claimed.append(summary["claimed"])
    assert claimed == [1, 0, 0]
    assert store.run_get(conn, victim).status == "succeeded"
    assert outcomes(conn) == {
        ("flow.work", "running", 1): 1,
        ("flow.work", "queued", 0): 400,
        ("flow.work", "succeeded", 1): 1,
    }


# -- a lock another session holds ------------------------------------------------------


def key_lock(job_type: str, key: str) -> tuple[str, tuple[str, str]]:
    """The statement that takes the lock of `key` of limited `job_type`, as a claim does."""
    return (
        "SELECT pg_advisory_xact_lock(jobrunner_limit_lock_class(%s), hashtext(%s))",
        (job_type, key),
    )


def status(db_url: str) -> tuple[dict[str, Any], str]:
    as_json = run_cli("status", "--json", "--database-url", db_url)
    text = run_cli("status", "--database-url", db_url)
    assert as_json.exit_code == 0 and text.exit_code == 0, as_json.stderr + text.stderr
    return json.loads(as_json.stdout), text.stdout


def test_a_key_locked_by_another_session_is_told_once_a_tick_and_status_names_the_holder(
    db_url, conn
):
    limit(db_url, "flow.work", "--concurrency", "2")
    insert_runs(conn, 2, "flow.work", payload={"seconds": 0})
    insert_runs(conn, 3, "test.ok")
    with psycopg.connect(db_url, application_name="mallory") as holder:
        holder.execute(*key_lock("flow.work", ""))
        # A claim a run: each of the tick's claims finds the key locked.
        code, summary, events = ticked(db_url, "--batch-size", "1")
        assert code == 0, events
        assert summary["claimed"] == 3
        told = [e for e in events if "locked by another session" in e["event"]]
        assert [(e["job_type"], e["level"]) for e in told] == [("flow.work", "warning")]
        assert outcomes(conn) == {
            ("flow.work", "queued", 0): 2,
            ("test.ok", "succeeded", 1): 3,
        }
        found, text = status(db_url)
        user = holder.info.user
        [held] = found["advisory_locks"]
        assert {k: v for k, v in held.items() if k != "age_seconds"} == {
            "lock": "a key of limited type",
            "job_type": "flow.work",
            "pid": holder.info.backend_pid,
            "user": user,
            "application_name": "mallory",
            "state": "idle in transaction",
        }
        assert held["age_seconds"] >= 0
        [line] = [line for line in text.splitlines() if line.startswith("held locks:")]
        assert line.startswith(
            f"held locks:      a key of limited type flow.work: pid {holder.info.backend_pid}"
            f" (mallory, user {user}, idle in transaction, held "
        )
    # Let go, the next tick claims them.
    code, summary, _ = ticked(db_url)
    assert (code, summary["claimed"]) == (0, 2)
    assert status(db_url)[0]["advisory_locks"] == []
    assert "held locks:      none" in status(db_url)[1]


def test_status_names_the_session_that_holds_the_keyed_batch_lock(db_url, conn):
    with psycopg.connect(db_url, application_name="stuck-import") as holder:
        store.runs_lock_for_keyed_batch(holder)
        found, text = status(db_url)
        [held] = found["advisory_locks"]
        assert (held["lock"], held["job_type"], held["pid"], held["application_name"]) == (
            "keyed-batch enqueue",
            None,
            holder.info.backend_pid,
            "stuck-import",
        )
        assert f"held locks:      keyed-batch enqueue: pid {holder.info.backend_pid}" in text


def test_a_key_locked_by_a_statement_running_now_is_busy_and_one_idle_in_a_transaction_held(
    db_url, conn
):
    # A claim holds a key's lock for as long as its statement runs: another claim that finds
    # it so is not told of a locked key. A session that keeps it while idle holds it.
    limit(db_url, "flow.work", "--concurrency", "1")
    held = "SELECT jobrunner_limit_lock_held('flow.work', '')"
    with psycopg.connect(db_url, autocommit=True) as busy:
        running = threading.Thread(target=_lock_and_sleep, args=(busy,))
        running.start()
        try:
            wait_for(lambda: lock_granted(conn, busy.info.backend_pid), "the lock to be held")
            assert conn.execute(held).fetchone()[0] is False
        finally:
            busy.cancel_safe()
            running.join(timeout=30)
    with psycopg.connect(db_url) as idle:
        idle.execute(*key_lock("flow.work", ""))
        assert conn.execute(held).fetchone()[0] is True


def _lock_and_sleep(conn: Any) -> None:
    """flow.work's key lock, held by a statement that sleeps a minute, until cancelled."""
    statement, params = key_lock("flow.work", "")
    with contextlib.suppress(psycopg.errors.QueryCanceled):
        conn.execute(f"{statement}, pg_sleep(60)", params)


def lock_granted(conn: Any, pid: int) -> bool:
    return bool(
        count(
            conn,
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND granted",
            pid,
        )
    )


# -- what `limit` echoes ---------------------------------------------------------------


def test_limit_echoes_a_type_and_a_field_with_their_control_characters_escaped(db_url, conn):
    job_type, per = "evil\x1b]0;owned\x07type", "payload:f\x1b[2Jield"
    result = run_cli(
        "limit", job_type, "--concurrency", "1", "--per", per, "--database-url", db_url
    )
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert result.stdout.strip() == (
        "limited evil\\x1b]0;owned\\x07type: at most 1 running, per payload field f\\x1b[2Jield"
    )
    cleared = run_cli("limit", job_type, "--clear", "--database-url", db_url)
    assert cleared.stdout.strip() == "cleared the limit of evil\\x1b]0;owned\\x07type"
    again = run_cli("limit", job_type, "--clear", "--database-url", db_url)
    assert again.stdout.strip() == "evil\\x1b]0;owned\\x07type had no limit"
