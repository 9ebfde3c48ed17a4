"""A streaming drain writes outcomes on a second connection while its own claims
(cronjob/tick/writer.py): when it opens one, what it writes there, and what happens
when that connection is refused or killed."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cronjob.db import Database, connect
from cronjob.errors import DatabaseUnavailable
from cronjob.handlers import handler, registry
from cronjob.queries.runs import RUNS_FINALIZE_MANY
from cronjob.tick.writer import STREAMING_CLAIM
from tests.conftest import count, wait_for
from tests.factories import insert_run, insert_runs, tick
from tests.test_history_cost import actual, counted

WRITER = "jobrunner-second"  # the application name of the connections the tick opens


class Connections(Database):
    """The tick's database: real connections, counted, under a name a test can find."""

    def __init__(
        self,
        db_url: str,
        *,
        refuse: bool = False,
        refuse_after: int = 0,
        slow_until: int = 0,
        patience: float = 10.0,
    ) -> None:
        super().__init__(db_url)
        self.refuse, self.refuse_after, self.opened = refuse, refuse_after, 0
        self.slow_until, self.patience = slow_until, patience
        self.waited_for: str | None = None

    def connect(self, *, autocommit: bool = True) -> Any:
        self.opened += 1
        if self.refuse or 0 < self.refuse_after < self.opened:
            raise DatabaseUnavailable("cannot connect to the database: too many clients")
        if self.slow_until:
            self.waited_for = self._until_succeeded(self.slow_until)
        return connect(self.url, autocommit=autocommit, application_name=WRITER)

    def _until_succeeded(self, runs: int) -> str:
        """A server slow to answer: the connect returns once `runs` runs succeeded, which only
        a drain that goes on meanwhile can bring about, or when its patience runs out."""
        until = time.monotonic() + self.patience
        with psycopg.connect(self.url, autocommit=True) as watcher:
            while time.monotonic() < until:
                done = count(watcher, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'")
                if done >= runs:
                    return "the runs"
                time.sleep(0.01)
        return "its patience"


def _tick(db_url: str, connections: Connections, **options: Any) -> Any:
    options = {"concurrency": 1, "batch_size": 500, **options}
    return tick(db_url, "writer.ok", "writer.probe", database=connections, **options)


def _enqueue(conn: psycopg.Connection[Any], runs: int, job_type: str = "writer.ok") -> None:
    insert_runs(conn, runs, job_type)


def _shape(sql: str) -> str:
    """A statement with its parameters, as psycopg writes them or as the server shows them,
    reduced to one mark."""
    return re.sub(r"%\(\w+\)[sb]|\$\d+", "?", sql).strip()


def _second_connections(db_url: str) -> list[tuple[int, str]]:
    with psycopg.connect(db_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid, query FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (WRITER,),
        )
        return rows.fetchall()


@pytest.fixture
def probe(db_url: str) -> Iterator[list[Any]]:
    """writer.probe runs after every writer.ok run (a larger priority number comes later) and
    records what the tick's second connections were last doing, or kills them."""
    seen: list[Any] = []

    @handler("writer.ok")
    def ok(ctx: Any, payload: Any) -> None:
        pass

    @handler("writer.probe")
    def look(ctx: Any, payload: Any) -> None:
        seen.extend(_second_connections(db_url))
        if payload.get("kill"):
            with psycopg.connect(db_url, autocommit=True) as admin:
                for pid, _query in seen:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    try:
        yield seen
    finally:
        registry().pop("writer.ok")
        registry().pop("writer.probe")


def test_a_streaming_drain_writes_its_outcomes_on_a_second_connection(db_url, conn, probe):
    _enqueue(conn, 3000)
    insert_run(conn, "writer.probe", priority=1)
    connections = Connections(db_url)

    report = _tick(db_url, connections)

    assert report.succeeded == 3001
    assert connections.opened == 1  # one second connection, for the whole drain
    [(_pid, last_query)] = probe  # it wrote the finalize, while the first claimed
    # The server keeps the first kilobyte of a statement's text (track_activity_query_size).
    seen = _shape(last_query)[:900]
    assert len(seen) == 900 and _shape(RUNS_FINALIZE_MANY).startswith(seen)
    assert (
        counted(conn)
        == actual(conn)
        == {("writer.ok", "succeeded"): 3000, ("writer.probe", "succeeded"): 1}
    )
    assert _second_connections(db_url) == []  # closed when the drain ended


def test_a_drain_of_a_few_runs_opens_no_second_connection(db_url, conn, probe):
    _enqueue(conn, STREAMING_CLAIM - 1)
    connections = Connections(db_url)

    report = _tick(db_url, connections, batch_size=1000)

    assert report.succeeded == STREAMING_CLAIM - 1
    assert connections.opened == 0


def test_the_drain_goes_on_while_its_second_connection_is_being_opened(db_url, conn, probe):
    _enqueue(conn, 3000)
    connections = Connections(db_url, slow_until=3000)

    report = _tick(db_url, connections)

    # The connect returned only once the drain was done: the drain did not wait for it.
    assert wait_for(lambda: connections.waited_for, "the connect") == "the runs"
    assert connections.opened == 1
    assert report.succeeded == 3000
    assert counted(conn) == actual(conn) == {("writer.ok", "succeeded"): 3000}
    # Opened too late to write, and closed all the same.
    wait_for(lambda: _second_connections(db_url) == [], "the second connection to close")


def test_a_drain_that_ends_while_its_second_connection_is_being_opened_does_not_wait_for_it(
    db_url, conn, probe
):
    _enqueue(conn, 3000)
    connections = Connections(db_url, slow_until=10**9, patience=5.0)  # never, then gives up

    report = _tick(db_url, connections)

    assert connections.waited_for is None  # the tick is done; the connect is still under way
    assert report.succeeded == 3000
    assert wait_for(lambda: connections.waited_for, "the connect") == "its patience"
    wait_for(lambda: _second_connections(db_url) == [], "the late connection to be closed")


def test_when_no_second_connection_can_be_opened_the_tick_writes_through_its_own(
    db_url, conn, probe
):
    _enqueue(conn, 3000)
    connections = Connections(db_url, refuse=True)

    report = _tick(db_url, connections)

    assert connections.opened == 1  # asked once, not once per claim
    assert report.succeeded == 3000
    assert counted(conn) == actual(conn) == {("writer.ok", "succeeded"): 3000}


def test_a_killed_second_connection_loses_no_outcome_and_counts_none_twice(db_url, conn, probe):
    _enqueue(conn, 3000)
    # Claimed in the order enqueued (each statement has its own now()): the kill lands
    # mid-drain, with 3,000 runs still to claim.
    insert_run(conn, "writer.probe", payload={"kill": True})
    _enqueue(conn, 3000)
    connections = Connections(db_url)

    report = _tick(db_url, connections)

    assert probe, "the second connection was open when the probe ran"
    assert report.stopped_by == "database error"
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'") == 0
    # Every run either succeeded, once, or went back untouched to be claimed again.
    statuses = dict(conn.execute("SELECT status, count(*) FROM job_runs GROUP BY 1").fetchall())
    assert set(statuses) <= {"succeeded", "queued"}
    assert 0 < report.succeeded <= statuses["succeeded"]
    assert (
        count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued' AND attempts > 0") == 0
    )
    assert counted(conn) == actual(conn)


def test_a_second_connection_lost_for_good_leaves_the_rest_to_the_ticks_own(
    db_url, conn, probe, monkeypatch
):
    monkeypatch.setattr("cronjob.tick.connection.RECONNECT_PAUSES", (0.0, 0.0))
    _enqueue(conn, 3000)
    insert_run(conn, "writer.probe", payload={"kill": True})
    _enqueue(conn, 3000)
    connections = Connections(db_url, refuse_after=1)  # the second connection, then no more

    report = _tick(db_url, connections)

    assert probe, "the second connection was open when the probe ran"
    assert report.stopped_by == "database error" and report.unrecorded == 0
    assert connections.opened == 3  # opened once, then two failed attempts to open it again
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'") == 0
    statuses = dict(conn.execute("SELECT status, count(*) FROM job_runs GROUP BY 1").fetchall())
    assert set(statuses) <= {"succeeded", "queued"}
    assert counted(conn) == actual(conn)
