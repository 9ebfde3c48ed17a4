"""Servers of their own, a real streaming standby among them.

A failover in the middle of a drain: the primary the tick is on turns read-only (fenced),
the standby is promoted, and the tick, connected through a multi-host URL with
`target_session_attrs=read-write`, finds it. And what holds back cleanup on a primary
from elsewhere: a query on the standby, through its slot's hot_standby_feedback, and a
prepared transaction left behind (max_prepared_transactions is 0 on the shared server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob.api import enqueue
from tests.conftest import count, run_cli, wait_for
from tests.faults.conftest import PrivateServer
from tests.faults.replicas import ReplicaPair, migrated_cluster, replica_pair, server_copy


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


@pytest.fixture
def feedback_pair(template: PrivateServer) -> Iterator[ReplicaPair]:
    """A standby through a slot, telling the primary what its queries still need to see."""
    with replica_pair(
        template,
        standby_settings=("hot_standby_feedback=on", "wal_receiver_status_interval=1"),
        slot="standby_slot",
    ) as pair:
        yield pair


def _holders(url: str) -> list[dict[str, Any]]:
    return json.loads(run_cli("status", "--json", "--database-url", url).stdout)["snapshot_holders"]


def test_a_standby_query_holding_cleanup_back_through_its_slot_is_named_on_the_primary(
    feedback_pair,
):
    pair = feedback_pair
    with (
        psycopg.connect(pair.standby.url, autocommit=True) as standby,
        psycopg.connect(pair.primary.url, autocommit=True) as primary,
    ):
        standby.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        standby.execute("SELECT count(*) FROM job_runs")
        for _ in range(3):  # changes the standby's snapshot cannot see
            enqueue(primary, "fault.work")

        def slot_behind() -> list[dict[str, Any]]:
            return [
                holder
                for holder in _holders(pair.primary.url)
                if holder["kind"] == "replication slot" and holder["xmin_age"] >= 3
            ]

        [slot] = wait_for(slot_behind, "the standby's snapshot to hold the slot back")
        assert (slot["name"], slot["state"]) == ("standby_slot", "active")
        assert slot["age_seconds"] is None
        check = run_cli("check", "--max-snapshot-age", "0s", "--database-url", pair.primary.url)
        assert check.exit_code == 0, check.stdout  # its age is the standby's to know
        assert 'of unknown age: replication slot "standby_slot" (active, pid ' in check.stdout
        standby.execute("COMMIT")


def test_a_prepared_transaction_left_behind_is_named_until_it_is_rolled_back(template):
    with (
        server_copy(template, "max_prepared_transactions=2") as server,
        psycopg.connect(server.url, autocommit=True) as conn,
    ):
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE left_behind (x int)")
        conn.execute("PREPARE TRANSACTION 'left-behind'")

        check = run_cli("check", "--max-snapshot-age", "0s", "--database-url", server.url)

        assert check.exit_code == 1
        assert check.stdout.startswith(
            'BREACHED max-snapshot-age=0s: the oldest snapshot: prepared transaction "left-behind"'
            " (user postgres), open "
        ), check.stdout
        conn.execute("ROLLBACK PREPARED 'left-behind'")
        assert _holders(server.url) == []
