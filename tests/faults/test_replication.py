"""A real streaming standby on this machine. A failover in the middle of a drain: the
primary the tick is on turns read-only (fenced), the standby is promoted, and the tick,
connected through a multi-host URL with `target_session_attrs=read-write`, finds it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob.api import enqueue
from tests.conftest import count, wait_for
from tests.faults.conftest import PrivateServer
from tests.faults.replicas import ReplicaPair, migrated_cluster, replica_pair


@pytest.fixture(scope="module")
def template() -> Iterator[PrivateServer]:
    with migrated_cluster() as template:
        yield template


@pytest.fixture
def pair(template: PrivateServer) -> Iterator[ReplicaPair]:
    with replica_pair(template) as pair:
        yield pair


def _started(exec_log: Any, n: int) -> bool:
    return len({e.run_id for e in exec_log.entries()}) >= n


def test_a_failover_mid_drain_ends_every_run_once_on_the_new_primary(
    pair, start_tick, exec_log, tmp_path
):
    release = tmp_path / "release"
    with psycopg.connect(pair.url, autocommit=True) as conn:
        ids = [enqueue(conn, "fault.gated", {"release": str(release)}) for _ in range(6)]
    t = start_tick(pair.url, "--concurrency", "2")
    wait_for(lambda: _started(exec_log, 2), "two handlers to start")

    pair.wait_until_the_standby_has_replayed_everything()
    pair.fence_the_primary()
    pair.standby.promote()
    release.touch()

    assert t.wait() == 1, t.stderr()[-3000:]
    [error] = t.plain_lines()
    assert error.startswith("jobrunner: error: the database refused the tick's ")
    assert error.endswith(
        " in a read-only transaction; the tick reconnected to a server that takes writes;"
        " every run it claimed was recorded or handed back"
    ), error
    assert "Traceback" not in t.stderr()
    assert t.events("reconnected to a server that takes writes")
    [stopped] = t.events("tick stopped")
    assert stopped["stopped_by"] == "database error"
    assert stopped["claimed"] == stopped["succeeded"] + stopped["handed_back"]  # none twice
    assert stopped["lost"] == 0 and "unrecorded" not in stopped

    finisher = start_tick(pair.url)
    assert finisher.wait() == 0, finisher.stderr()[-3000:]
    with psycopg.connect(pair.standby.url, autocommit=True) as new_primary:
        rows = new_primary.execute("SELECT status, attempts FROM job_runs ORDER BY id")
        assert rows.fetchall() == [("succeeded", 1)] * len(ids)
        assert count(new_primary, "SELECT count(*) FROM job_attempts") == 0
    assert sorted(e.run_id for e in exec_log.entries()) == ids  # each ran exactly once


def test_a_failover_through_a_stopped_primary_is_ridden_through(
    pair, start_tick, exec_log, tmp_path
):
    release = tmp_path / "release"
    with psycopg.connect(pair.url, autocommit=True) as conn:
        ids = [enqueue(conn, "fault.gated", {"release": str(release)}) for _ in range(6)]
    t = start_tick(pair.url, "--concurrency", "2")
    wait_for(lambda: _started(exec_log, 2), "two handlers to start")

    pair.wait_until_the_standby_has_replayed_everything()
    pair.primary.stop()
    pair.standby.promote()
    release.touch()

    assert t.wait() == 0, t.stderr()[-3000:]
    assert t.plain_lines() == [] and "Traceback" not in t.stderr()
    assert t.events("reconnected to the database")
    summary = t.summary()
    assert summary["stopped_by"] == "database error"
    assert summary["claimed"] == summary["succeeded"] + summary["handed_back"]

    assert start_tick(pair.url).wait() == 0
    with psycopg.connect(pair.standby.url, autocommit=True) as new_primary:
        rows = new_primary.execute("SELECT status, attempts FROM job_runs ORDER BY id")
        assert rows.fetchall() == [("succeeded", 1)] * len(ids)
    assert sorted(e.run_id for e in exec_log.entries()) == ids
