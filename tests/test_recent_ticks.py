"""Every run of `jobrunner tick` keeps a row in job_ticks (migration 0028): where it ran,
when, and what it did; an idle tick's in its one statement. The dashboard's overview shows
them (tests/test_web_alive.py), `status` the ones listening (tests/test_listen.py).
"""

from __future__ import annotations

import json
import os
import socket

import psycopg

import tests.handlers.basic  # noqa: F401 - registers test.ok, test.give_up
from tests.conftest import count, run_cli
from tests.factories import insert_run, insert_runs, now, tick
from tests.test_web import _Recorded

TICK_ROW = (
    "SELECT host, pid, stopped_by, ended_at IS NOT NULL, ended_at >= started_at,"
    " listening_since, claimed, succeeded, failed, dead FROM job_ticks ORDER BY id"
)


def test_an_idle_tick_enters_its_row_ended_in_its_one_statement(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.cursor_factory = _Recorded.cursor_class()
        _Recorded.statements.clear()
        report = tick(db_url, "test.ok", conn=conn)
        asked = list(_Recorded.statements)
        rows = conn.execute(TICK_ROW).fetchall()
    assert report.claimed == 0
    assert len(asked) == 1  # the idle tick's one question, its row entered by it
    host = socket.gethostname()
    assert rows == [(host, os.getpid(), "idle", True, True, None, None, None, None, None)]


def test_a_tick_that_works_records_what_it_did_when_it_ends(db_url, conn):
    insert_runs(conn, 3, "test.ok")
    insert_run(conn, "test.give_up")
    report = tick(db_url, "test.ok", "test.give_up")
    assert (report.claimed, report.succeeded, report.dead) == (4, 3, 1)
    rows = conn.execute(TICK_ROW).fetchall()
    assert rows == [(socket.gethostname(), os.getpid(), None, True, True, None, 4, 3, 0, 1)]


def test_a_ticks_row_says_what_stopped_it(db_url, conn):
    insert_runs(conn, 3, "test.ok")
    tick(db_url, "test.ok", max_runtime=0.0)
    assert conn.execute("SELECT stopped_by FROM job_ticks").fetchall() == [("max-runtime",)]


def test_rows_of_ticks_that_ended_a_day_ago_go_a_few_at_a_time(db_url, conn):
    old = (
        "INSERT INTO job_ticks (host, pid, started_at, last_seen, ended_at, stopped_by)"
        " SELECT 'old-host', i, now() - %s::interval, now() - %s::interval,"
        " now() - %s::interval, 'idle' FROM generate_series(1, %s) i"
    )
    conn.execute(old, ("25 hours", "25 hours", "25 hours", 12))
    conn.execute(old, ("2 hours", "2 hours", "2 hours", 1))
    tick(db_url, "test.ok")
    gone_first = 13 - count(conn, "SELECT count(*) FROM job_ticks WHERE host = 'old-host'")
    tick(db_url, "test.ok")
    left = count(conn, "SELECT count(*) FROM job_ticks WHERE host = 'old-host'")
    assert gone_first == 10 and left == 1  # the one of 2 hours ago is kept a day
    tick(db_url, "test.ok", prune_older_than=3600.0)
    assert count(conn, "SELECT count(*) FROM job_ticks WHERE host = 'old-host'") == 0


def test_a_listening_tick_killed_is_closed_as_lost_by_the_next_that_starts(db_url, conn):
    from cronjob import store
    from cronjob.settings import LISTENING_TICK_STALE

    conn.execute(
        "INSERT INTO job_ticks (host, pid, started_at, listening_since, last_seen)"
        " VALUES ('killed', 1, now() - interval '1 hour', now() - interval '1 hour',"
        " now() - interval '10 minutes')"
    )
    insert_run(conn, "test.ok", run_at=now("1 hour"))
    tick(db_url, "test.ok", listen=True, max_runtime=0.2)
    rows = conn.execute(
        "SELECT host, stopped_by, ended_at = last_seen FROM job_ticks ORDER BY id"
    ).fetchall()
    assert rows[0] == ("killed", "lost", True)
    assert rows[1][0] == socket.gethostname() and rows[1][1] is None  # its time was up
    assert store.ticks_list(conn, stale=LISTENING_TICK_STALE) == []


def test_status_counts_listening_ticks_not_the_ticks_that_ended(db_url, conn):
    from cronjob import store

    store.ticks_insert(conn, host="web-1", pid=4242, poll_interval=None)
    insert_run(conn, "test.ok", run_at=now("1 hour"))
    tick(db_url, "test.ok", listen=True, max_runtime=0.2)
    tick(db_url, "test.ok")
    result = run_cli("status", "--database-url", db_url, "--json")
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)["ticks"]
    assert [(t["host"], t["pid"]) for t in listed] == [("web-1", 4242)]
    assert count(conn, "SELECT count(*) FROM job_ticks") == 3


def test_a_tick_that_does_not_stay_killed_shows_as_lost_once_past_its_end_and_goes(db_url, conn):
    from cronjob import store
    from cronjob.tick import ENDS_BY_MARGIN

    insert_runs(conn, 2, "test.ok")
    tick(db_url, "test.ok", max_runtime=30.0, grace=5.0)
    [bound] = conn.execute(
        "SELECT extract(epoch FROM ends_by - started_at)::float FROM job_ticks"
    ).fetchone()
    assert bound == 30.0 + 5.0 + ENDS_BY_MARGIN
    # Killed: entered, never ended. One past its end, one within it, one lost a day ago.
    killed = (
        "INSERT INTO job_ticks (host, pid, started_at, last_seen, ends_by)"
        " VALUES (%s, 1, now() - %s::interval, now() - %s::interval, now() - %s::interval)"
    )
    conn.execute(killed, ("past-its-end", "20 minutes", "20 minutes", "5 minutes"))
    conn.execute(killed, ("still-within", "1 minute", "1 minute", "-5 minutes"))
    conn.execute(killed, ("lost-a-day-ago", "26 hours", "26 hours", "25 hours"))
    shown = {t.host: t for t in store.ticks_list_recent(conn, limit=10)}
    assert shown["past-its-end"].stopped_by == "lost"
    assert shown["past-its-end"].ended_at is not None
    assert (shown["still-within"].stopped_by, shown["still-within"].ended_at) == (None, None)
    tick(db_url, "test.ok")
    hosts = {host for (host,) in conn.execute("SELECT host FROM job_ticks").fetchall()}
    assert "lost-a-day-ago" not in hosts and {"past-its-end", "still-within"} <= hosts
