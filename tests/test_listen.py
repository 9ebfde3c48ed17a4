"""Starting promptly: `jobrunner tick --listen`, with real tick processes on the real server.

A test waits until the tick sleeps (it holds the sleeper's advisory lock of migration 0027,
which the server shows in pg_locks) before it does what should wake it, and then for the
outcome, with bounds that only keep a hung test from hanging: a run "starts in well under a
second" is asserted as under two, from the database's own timestamps. The typical figures
are bench/latency.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tests.handlers.basic  # noqa: F401 - registers test.ok for the ticks run in-process
from cronjob import store
from cronjob.api import enqueue, enqueue_many, new_run
from cronjob.settings import LISTENING_TICK_STALE
from tests import factories
from tests.conftest import ROOT, count, run_cli, wait_for
from tests.factories import insert_run, now

HANDLERS = "tests.handlers.basic"
SLEEPING = 29958816149106292
AWAITING_FINISHES = 29958816149106294
PROMPTLY = 2.0  # seconds: "well under a second", generously


def holders(conn: psycopg.Connection[Any], key: int) -> list[int]:
    """The backends that hold the advisory lock `key` (the bigint form) shared."""
    rows = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        " AND granted AND mode = 'ShareLock' AND database = ("
        "   SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND ((classid::bigint << 32) | objid::bigint) = %s",
        [key],
    ).fetchall()
    return [row[0] for row in rows]


@contextmanager
def listening_tick(
    db_url: str, *args: str, tmp_path: Path, max_runtime: str = "60s", prefix: tuple = ()
) -> Iterator[subprocess.Popen[str]]:
    """A `tick --listen` process, run under `prefix` if given (another host's name); stopped
    with SIGTERM at the end if it still runs."""
    command = ["tick", "--listen", "--max-runtime", max_runtime, "--handlers", HANDLERS]
    command += ["--database-url", db_url, "--log-level", "warning", *args]
    env = {
        **os.environ,
        "JOBRUNNER_TEST_EXEC_LOG": str(tmp_path / "exec.log"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(
        [*prefix, sys.executable, "-m", "cronjob", *command],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)


def asleep(conn: psycopg.Connection[Any], *ticks: subprocess.Popen[str]) -> None:
    """Wait until every tick of `ticks` sleeps on LISTEN (failing at once if one ended)."""

    def sleeping() -> bool:
        for tick in ticks:
            if tick.poll() is not None:
                raise AssertionError(f"the tick ended: {tick.communicate()[1]}")
        return len(holders(conn, SLEEPING)) >= len(ticks)

    wait_for(sleeping, "the ticks to sleep on LISTEN")


def finished(conn: psycopg.Connection[Any], run_id: int) -> tuple[Any, ...]:
    return wait_for(
        lambda: conn.execute(
            "SELECT status, started_at, created_at, run_at, finished_at FROM job_runs"
            " WHERE id = %s AND status IN ('succeeded', 'dead', 'cancelled')",
            [run_id],
        ).fetchone(),
        f"run {run_id} to finish",
    )


def executions(tmp_path: Path) -> Counter[int]:
    log = tmp_path / "exec.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(int(line.split()[0]) for line in lines)


def stop(tick: subprocess.Popen[str]) -> tuple[int, str]:
    tick.send_signal(signal.SIGTERM)
    _out, err = tick.communicate(timeout=60)
    return tick.returncode, err


# -- a run starts as soon as it is enqueued --


def test_a_run_enqueued_while_a_tick_listens_starts_at_once(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        run_id = enqueue(conn, "test.ok")
        status, started, created, _, _ = finished(conn, run_id)
        assert status == "succeeded"
        assert (started - created).total_seconds() < PROMPTLY
        # And the next one, once it sleeps again: not only the first wake-up works.
        asleep(conn, tick)
        second = enqueue(conn, "test.ok")
        status, started, created, _, _ = finished(conn, second)
        assert (started - created).total_seconds() < PROMPTLY
    assert executions(tmp_path) == {run_id: 1, second: 1}


def test_a_delayed_run_starts_at_its_run_at_not_at_the_next_minute(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        # Enqueued while the tick sleeps: it wakes, finds it not due, and sleeps until then.
        run_id = insert_run(conn, "test.ok", run_at=now("1.5 seconds"))
        status, started, _, run_at, _ = finished(conn, run_id)
    assert status == "succeeded"
    assert started >= run_at
    assert (started - run_at).total_seconds() < 1.0


def test_a_retry_backoff_is_run_on_time_by_a_tick_that_sleeps(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        run_id = enqueue(conn, "test.retry_in", {"delay": "1s"}, max_attempts=2)
        wait_for(lambda: executions(tmp_path)[run_id] == 2, "the retry to run")
        retried_at, attempts = conn.execute(
            "SELECT started_at, attempts FROM job_runs WHERE id = %s", [run_id]
        ).fetchone()
        first = conn.execute(
            "SELECT finished_at FROM job_attempts WHERE run_id = %s AND attempt = 1", [run_id]
        ).fetchone()[0]
    assert attempts == 2
    assert 1.0 <= (retried_at - first).total_seconds() < 1.0 + PROMPTLY


def test_a_rolled_back_enqueue_wakes_nothing_into_a_wrong_claim(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path, max_runtime="8s") as tick:
        asleep(conn, tick)
        with psycopg.connect(db_url) as app:
            rolled_back = enqueue(app, "test.ok")
            app.rollback()
        kept = enqueue(conn, "test.ok")
        finished(conn, kept)
        _out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    assert executions(tmp_path) == {kept: 1}
    assert count(conn, "SELECT count(*) FROM job_runs WHERE id = %s", rolled_back) == 0


def test_an_enqueue_still_open_when_the_tick_goes_to_sleep_is_claimed_once_it_commits(
    db_url, conn, tmp_path
):
    # The enqueue sees no sleeper and so sends nothing; the tick, going to sleep, finds its
    # transaction open and looks again until it has ended, rather than sleep on.
    with psycopg.connect(db_url) as app:
        run_id = enqueue(app, "test.ok")
        with listening_tick(db_url, tmp_path=tmp_path) as tick:
            asleep(conn, tick)
            app.commit()
            status, started, _, _, _ = finished(conn, run_id)
            committed = conn.execute("SELECT now()").fetchone()[0]
    assert status == "succeeded"
    assert (started - committed).total_seconds() < PROMPTLY


def test_two_listening_ticks_on_two_hosts_share_a_burst_each_run_once(db_url, conn, tmp_path):
    other_host = ()
    if shutil.which("unshare") and os.geteuid() == 0:
        other_host = ("unshare", "--uts", "sh", "-c", 'hostname other-host && exec "$@"', "-")
    with (
        listening_tick(db_url, tmp_path=tmp_path) as first,
        listening_tick(db_url, tmp_path=tmp_path, prefix=other_host) as second,
    ):
        asleep(conn, first, second)
        with conn.transaction():
            ids = enqueue_many(conn, (new_run("test.ok", {"n": n}) for n in range(400)))
        wait_for(
            lambda: (
                count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == len(ids)
            ),
            "the burst to finish",
        )
        hosts = {row[0] for row in conn.execute("SELECT host FROM job_ticks").fetchall()}
    assert executions(tmp_path) == dict.fromkeys(ids, 1)
    if other_host:
        assert hosts == {os.uname().nodename, "other-host"}


def test_a_retry_and_a_resume_start_runs_at_once_on_a_sleeping_tick(db_url, conn, tmp_path):
    dead = insert_run(conn, "test.ok", status="dead", attempts=3)
    assert run_cli("pause", "test.sleep", "--database-url", db_url).exit_code == 0
    paused = enqueue(conn, "test.sleep", {"seconds": 0})
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        assert run_cli("retry", str(dead), "--database-url", db_url).exit_code == 0
        retried_at = conn.execute("SELECT now()").fetchone()[0]
        _, started, *_ = finished(conn, dead)
        assert (started - retried_at).total_seconds() < PROMPTLY
        asleep(conn, tick)
        assert run_cli("resume", "test.sleep", "--database-url", db_url).exit_code == 0
        resumed_at = conn.execute("SELECT now()").fetchone()[0]
        _, started, *_ = finished(conn, paused)
        assert (started - resumed_at).total_seconds() < PROMPTLY


def test_a_place_freed_by_a_run_finishing_on_another_host_starts_the_next_at_once(
    db_url, conn, tmp_path
):
    limit = ("limit", "test.ok", "--concurrency", "1", "--database-url", db_url)
    assert run_cli(*limit).exit_code == 0
    # The one place is taken by a run another host holds; the next waits for it.
    elsewhere = insert_run(conn, "test.ok", status="running", locked_by="other-host:1")
    waiting = enqueue(conn, "test.ok")
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        wait_for(lambda: holders(conn, AWAITING_FINISHES), "the tick to wait for a place")
        assert count(conn, "SELECT count(*) FROM job_runs WHERE id = %s AND attempts = 0", waiting)
        # The other host's finalize: the run succeeded, the place is free.
        conn.execute(
            "UPDATE job_runs SET status = 'succeeded', finished_at = now(), locked_by = NULL,"
            " locked_until = NULL, lease_token = NULL WHERE id = %s",
            [elsewhere],
        )
        freed = conn.execute("SELECT now()").fetchone()[0]
        status, started, *_ = finished(conn, waiting)
    assert status == "succeeded"
    assert (started - freed).total_seconds() < PROMPTLY


def test_a_run_held_back_by_a_rate_limit_starts_when_the_rate_allows(db_url, conn, tmp_path):
    limit = ("limit", "test.ok", "--rate", "1/2s", "--database-url", db_url)
    assert run_cli(*limit).exit_code == 0
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        first, second = enqueue(conn, "test.ok"), enqueue(conn, "test.ok")
        _, started_first, *_ = finished(conn, first)
        _, started_second, *_ = finished(conn, second)
    # The rate spaces starts two seconds apart (a period over N): the sleeping tick wakes for
    # the second run's start, not at its next minute. (That no span holds more than N starts
    # is test_flow_control's.)
    gap = (started_second - started_first).total_seconds()
    assert 1.9 <= gap < 3.0


def test_a_schedule_fires_at_its_time_not_at_the_next_tick(db_url, conn, tmp_path):
    added = run_cli(
        "schedule", "add", "every-minute", "--cron", "* * * * *", "--type", "test.ok",
        "--database-url", db_url,
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    with listening_tick(db_url, tmp_path=tmp_path, max_runtime="90s") as tick:
        asleep(conn, tick)
        # Its next fire time is the coming minute's start: the tick sleeps until then.
        run = wait_for(
            lambda: conn.execute(
                "SELECT scheduled_for, started_at FROM job_runs"
                " WHERE scheduled_for IS NOT NULL AND started_at IS NOT NULL"
            ).fetchone(),
            "the schedule's run to start",
            timeout=90,
        )
    scheduled_for, started = run
    assert 0 <= (started - scheduled_for).total_seconds() < 1.0


# -- where it cannot listen, and when its connection is lost --


def test_the_listening_connection_killed_reconnects_and_loses_nothing(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        (backend,) = holders(conn, SLEEPING)
        conn.execute("SELECT pg_terminate_backend(%s)", [backend])
        # Enqueued while the tick's connection is down: nobody sleeps to be told.
        run_id = enqueue(conn, "test.ok")
        status, *_ = finished(conn, run_id)
        asleep(conn, tick)
        assert holders(conn, SLEEPING) != [backend]
        later = enqueue(conn, "test.ok")
        status_later, started, created, _, _ = finished(conn, later)
        code, err = stop(tick)
    assert (status, status_later) == ("succeeded", "succeeded")
    assert (started - created).total_seconds() < PROMPTLY
    assert code == 143, err
    assert executions(tmp_path) == {run_id: 1, later: 1}


# -- signals --


def test_sigterm_while_listening_exits_at_once_with_one_line(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        sent = time.monotonic()
        code, err = stop(tick)
        took = time.monotonic() - sent
    assert code == 143
    assert took < PROMPTLY
    assert err.splitlines() == [
        "jobrunner: tick stopped by SIGTERM while listening, with nothing running"
        " (claimed 0, succeeded 0, failed 0, dead 0)"
    ]
    # Its row stays, ended, and says why; it no longer counts as listening.
    assert conn.execute(
        "SELECT stopped_by, ended_at IS NOT NULL, listening_since IS NOT NULL FROM job_ticks"
    ).fetchall() == [("SIGTERM", True, True)]
    assert store.ticks_list(conn, stale=LISTENING_TICK_STALE) == []


def test_sigterm_while_a_listening_tick_runs_a_handler_lets_it_finish_as_today(
    db_url, conn, tmp_path
):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        run_id = enqueue(conn, "test.sleep", {"seconds": 1})
        wait_for(lambda: executions(tmp_path)[run_id], "the handler to start")
        code, err = stop(tick)
    assert code == 0, err
    assert finished(conn, run_id)[0] == "succeeded"


# -- what wakes it, and what it costs: notifications, on the server itself --


@contextmanager
def sleeper(db_url: str, *, finishes: bool = False) -> Iterator[psycopg.Connection[Any]]:
    """A session that listens and sleeps as a tick does (or, `finishes`, waits as `wait`)."""
    with psycopg.connect(db_url, autocommit=True) as session:
        store.tick_listen(session)
        if finishes:
            store.runs_wait_begin(session)
        else:
            store.tick_sleep(session)
        yield session
        # Before it closes: a closed session's locks go when its backend has exited.
        store.tick_wake(session, finishes=finishes)


def notifications(session: psycopg.Connection[Any]) -> int:
    """Notifications the session has received by now (each transaction's, once committed)."""
    session.execute("SELECT 1")  # delivered with the answer to a statement, if pending
    return len(list(session.notifies(timeout=0.2)))


def test_a_transaction_that_enqueues_many_runs_sends_one_notification(db_url):
    with sleeper(db_url) as session, psycopg.connect(db_url) as app:
        enqueue_many(app, (new_run("test.ok") for _ in range(2000)))  # by COPY
        enqueue(app, "test.ok", idempotency_key="k")  # by insert
        run_cli("enqueue", "test.ok", "--database-url", db_url)  # a transaction of its own
        assert notifications(session) == 1
        app.commit()
        assert notifications(session) == 1
        lines = "".join(
            json.dumps({"type": "test.ok", "payload": {"n": n}}) + "\n" for n in range(300)
        )
        jsonl = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=lines)
        assert jsonl.exit_code == 0, jsonl.stderr
        assert notifications(session) == 1


def test_nothing_is_sent_while_no_tick_sleeps(db_url):
    with psycopg.connect(db_url, autocommit=True) as listening:
        store.tick_listen(listening)  # listens, but does not sleep
        with sleeper(db_url) as session:
            enqueue(listening, "test.ok")
            # The sleeping session is told; the one that only listens is told too (the
            # channel is one), but only because somebody sleeps.
            assert notifications(session) == 1
            assert notifications(listening) == 1
        enqueue(listening, "test.ok")
        assert notifications(listening) == 0


def test_retry_resume_and_a_changed_limit_wake_a_sleeping_tick(db_url, conn):
    dead = insert_run(conn, "test.ok", status="dead", attempts=3)
    with sleeper(db_url) as session:
        assert run_cli("retry", str(dead), "--database-url", db_url).exit_code == 0
        assert notifications(session) == 1
        assert run_cli("pause", "test.ok", "--database-url", db_url).exit_code == 0
        assert notifications(session) == 0  # pausing makes nothing claimable
        assert run_cli("resume", "test.ok", "--database-url", db_url).exit_code == 0
        assert notifications(session) == 1
        limit = ("limit", "test.ok", "--concurrency", "2", "--database-url", db_url)
        assert run_cli(*limit).exit_code == 0
        assert notifications(session) == 1
        assert run_cli("limit", "test.ok", "--clear", "--database-url", db_url).exit_code == 0
        assert notifications(session) == 1


def test_a_claim_and_a_success_wake_no_sleeping_tick(db_url, conn):
    insert_run(conn, "test.ok")
    with sleeper(db_url) as session:
        assert factories.tick(db_url, "test.ok").succeeded == 1
        assert notifications(session) == 0  # a success makes nothing claimable


def test_a_finish_tells_a_waiter_once_per_transaction(db_url, conn):
    first, second = insert_run(conn, "test.ok"), insert_run(conn, "test.ok")
    with sleeper(db_url, finishes=True) as waiter:
        assert run_cli("cancel", str(first), str(second), "--database-url", db_url).exit_code == 0
        assert notifications(waiter) == 1


def test_the_default_listening_time_ends_ten_seconds_into_the_next_minute(conn):
    at = datetime(2026, 1, 5, 12, 0, 45, 250000, tzinfo=UTC)
    assert store.tick_listen_until(conn, overlap=10, now=at) == pytest.approx(24.75)


def test_listen_database_url_without_listen_is_bad_usage(db_url):
    result = run_cli("tick", "--listen-database-url", db_url, "--database-url", db_url)
    assert result.exit_code == 2
    assert "only with --listen" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_status_shows_the_listening_tick_with_its_host_and_since_when(db_url, conn, tmp_path):
    with listening_tick(db_url, tmp_path=tmp_path) as tick:
        asleep(conn, tick)
        shown = json.loads(run_cli("status", "--json", "--database-url", db_url).stdout)
        metrics = run_cli("metrics", "--database-url", db_url).stdout
        code, _err = stop(tick)
    (listening,) = shown["ticks"]
    assert listening["host"] == os.uname().nodename
    assert listening["pid"] == tick.pid
    assert listening["listening_since"] is not None
    assert 'jobrunner_ticks_listening{mode="listening"} 1' in metrics.splitlines()
    assert code == 143


def test_the_dashboard_shows_the_listening_and_polling_ticks(db_url, conn):
    pytest.importorskip("starlette")
    from cronjob.web import app
    from tests.web_server import request, serving

    store.ticks_insert(conn, host="web-1", pid=4242, poll_interval=None)
    store.ticks_insert(conn, host="web-2", pid=77, poll_interval=1.0)
    with serving(app(db_url)) as base:
        page = request(base + "/").body
    section = page[page.index('id="ticks"') :]
    assert "web-1" in section and "4242" in section and "listening" in section
    assert "web-2" in section and "polling every 1.0s" in section
