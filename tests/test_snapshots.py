"""What holds back cleanup: `status`, `metrics` and `check --max-snapshot-age` name the
transaction that keeps VACUUM from removing the queue's dead rows, here another session
holding a REPEATABLE READ snapshot open, as an analytics query or a forgotten BEGIN does.

Replication slots and prepared transactions are in tests/faults/test_replication.py, on
servers of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import conninfo

from cronjob import horizon
from tests.conftest import run_cli
from tests.test_lifecycle import db_now


def cli(url: str, *args: str) -> Any:
    return run_cli(*args, "--database-url", url)


class HeldSnapshot:
    """Another session, holding a REPEATABLE READ snapshot open until `end`."""

    def __init__(self, url: str, *, application_name: str = "analytics", query: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, application_name=application_name)
        self.pid = self.conn.info.backend_pid
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.conn.execute(query)

    def end(self) -> None:
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def hold(db_url: str) -> Iterator[Any]:
    held: list[HeldSnapshot] = []

    def start(query: str = "SELECT count(*) FROM job_runs", **options: Any) -> HeldSnapshot:
        held.append(HeldSnapshot(options.pop("url", db_url), query=query, **options))
        return held[-1]

    yield start
    for snapshot in held:
        snapshot.close()


def test_check_max_snapshot_age_breaches_while_a_snapshot_is_held_and_passes_once_it_ends(
    db_url, hold
):
    held = hold()

    breached = cli(db_url, "check", "--max-snapshot-age", "0s")

    assert breached.exit_code == 1, breached.stderr
    assert breached.stdout.startswith(
        f"BREACHED max-snapshot-age=0s: the oldest snapshot: pid {held.pid} "
        "(analytics, user postgres, idle in transaction), open "
    ), breached.stdout
    assert breached.stdout.rstrip().endswith(": SELECT count(*) FROM job_runs")

    held.end()
    passed = cli(db_url, "check", "--max-snapshot-age", "0s")
    # The check's own statement holds a snapshot too, while it runs: never named.
    assert (passed.exit_code, passed.stdout) == (
        0,
        "OK max-snapshot-age=0s: nothing holds back cleanup\n",
    )


def test_a_snapshot_is_as_old_as_its_transaction_by_the_database_clock(conn, hold):
    held = hold()
    later = db_now(conn) + timedelta(seconds=2)

    [holder] = horizon.read_holders(conn, now=later)
    assert (holder.pid, holder.kind.value) == (held.pid, "session")
    assert holder.state == "idle in transaction"
    assert 2.0 <= holder.age < 10.0
    assert horizon.finding([holder], 1.0).breached
    assert not horizon.finding([holder], 60.0).breached

    held.end()
    assert horizon.read_holders(conn, now=later) == []
    assert not horizon.finding([], 1.0).breached


def test_status_names_the_oldest_snapshot_with_its_query(db_url, hold):
    held = hold()

    found = json.loads(cli(db_url, "status", "--json").stdout)["snapshot_holders"]
    text = cli(db_url, "status").stdout

    [holder] = found
    assert holder["pid"] == held.pid and holder["kind"] == "session"
    assert (holder["application_name"], holder["user"]) == ("analytics", "postgres")
    assert holder["state"] == "idle in transaction"
    assert holder["query"] == "SELECT count(*) FROM job_runs"
    assert holder["age_seconds"] > 0 and holder["xmin_age"] >= 0
    assert holder["jobrunner"] is False and holder["visible"] is True
    [line] = [line for line in text.splitlines() if line.startswith("oldest snapshot:")]
    assert f"pid {held.pid} (analytics, user postgres, idle in transaction), open " in line
    assert line.endswith(": SELECT count(*) FROM job_runs")

    held.end()
    assert json.loads(cli(db_url, "status", "--json").stdout)["snapshot_holders"] == []
    assert "oldest snapshot: nothing holds back cleanup" in cli(db_url, "status").stdout


def _metrics(db_url: str) -> dict[str, Any]:
    result = cli(db_url, "metrics")
    assert result.exit_code == 0, result.stderr
    return {f.name: f for f in text_string_to_metric_families(result.stdout)}


def test_metrics_show_how_old_the_oldest_snapshot_is_and_whose_it_is(db_url, conn, hold):
    held = hold()
    # Cleanup is held back only once something has changed since the snapshot was taken.
    conn.execute("CREATE TEMPORARY TABLE t (x int)")
    conn.execute("INSERT INTO t VALUES (1)")

    parsed = _metrics(db_url)

    [age] = parsed["jobrunner_oldest_snapshot_age_seconds"].samples
    assert age.value > 0
    [behind] = parsed["jobrunner_oldest_snapshot_xmin_age"].samples
    assert behind.value >= 1
    [info] = parsed["jobrunner_oldest_snapshot_info"].samples
    assert info.value == 1
    labels = info.labels
    assert (labels["kind"], labels["pid"]) == ("session", str(held.pid))
    assert (labels["application_name"], labels["user"]) == ("analytics", "postgres")

    held.end()
    parsed = _metrics(db_url)
    assert [s.value for s in parsed["jobrunner_oldest_snapshot_age_seconds"].samples] == [0]
    assert [s.value for s in parsed["jobrunner_oldest_snapshot_xmin_age"].samples] == [0]
    assert parsed["jobrunner_oldest_snapshot_info"].samples == []


def test_the_query_shown_is_its_start_on_one_line_without_passwords(db_url, hold):
    hold(
        "SELECT 'postgresql://app:hunter22@db.internal/app' AS dsn,\n"
        f"       '{'x' * 300}' AS padding"
    )
    hold("CREATE ROLE never_committed LOGIN PASSWORD 'pw-in-sql' VALID UNTIL 'infinity'")

    holders = json.loads(cli(db_url, "status", "--json").stdout)["snapshot_holders"]

    first, second = (holder["query"] for holder in holders)
    assert first.startswith("SELECT 'postgresql://app:***@db.internal/app' AS dsn, 'xxx")
    assert len(first) == 100 and first.endswith("...")
    assert second == "CREATE ROLE never_committed LOGIN PASSWORD '***' VALID UNTIL 'infinity'"


def test_jobrunner_own_sessions_are_named_as_such(db_url, hold):
    held = hold(application_name="jobrunner")

    result = cli(db_url, "check", "--max-snapshot-age", "0s")

    assert f"pid {held.pid} (jobrunner's own jobrunner, user postgres, " in result.stdout
    [holder] = json.loads(cli(db_url, "status", "--json").stdout)["snapshot_holders"]
    assert holder["jobrunner"] is True


@pytest.fixture
def reader(db_url: str) -> Iterator[str]:
    """A login that may read jobrunner's tables, and is not the one holding the snapshot."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS snapshot_reader")
        admin.execute("CREATE ROLE snapshot_reader LOGIN")
        admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO snapshot_reader")
    yield conninfo.make_conninfo(db_url, user="snapshot_reader")
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("DROP OWNED BY snapshot_reader")
        admin.execute("DROP ROLE snapshot_reader")


def test_without_pg_read_all_stats_another_users_snapshot_is_named_but_its_age_unknown(
    db_url, reader, hold
):
    held = hold()

    [holder] = json.loads(cli(reader, "status", "--json").stdout)["snapshot_holders"]
    check = cli(reader, "check", "--max-snapshot-age", "0s")

    assert (holder["pid"], holder["user"]) == (held.pid, "postgres")
    assert holder["application_name"] == "analytics"
    assert (holder["visible"], holder["age_seconds"], holder["query"]) == (False, None, None)
    assert check.exit_code == 0  # no age to hold against the limit, and it says why
    assert check.stdout.startswith(
        "OK max-snapshot-age=0s: no snapshot this role can see the age of; of unknown age: "
        f"pid {held.pid} (analytics, user postgres, state hidden), age unknown (another "
        "user's session: grant this role pg_read_all_stats)"
    ), check.stdout

    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("GRANT pg_read_all_stats TO snapshot_reader")
    [holder] = json.loads(cli(reader, "status", "--json").stdout)["snapshot_holders"]
    assert holder["visible"] and holder["age_seconds"] > 0
    assert holder["query"] == "SELECT count(*) FROM job_runs"
    assert cli(reader, "check", "--max-snapshot-age", "0s").exit_code == 1
