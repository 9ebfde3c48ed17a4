"""jobrunner's commands as the least-privilege roles of deploy/roles.sql, on a real server.

The database is set up the documented way: roles.sql, `jobrunner migrate` as a login
of jobrunner_owner, roles.sql again. Then a login of jobrunner_worker does the daily
work, and cannot change the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import Result, run_cli
from tests.test_deploy import Server, server, throwaway_database  # noqa: F401 - fixture


@dataclass(frozen=True)
class Logins:
    owner: str
    worker: str


@pytest.fixture(scope="module")
def logins(server: Server) -> Iterator[Logins]:  # noqa: F811 - the imported fixture
    with throwaway_database(server) as db:
        db.roles_sql()
        owner = db.login("jobrunner_owner")
        migrated = run_cli("migrate", "--database-url", owner)
        assert migrated.exit_code == 0, migrated.stderr
        db.roles_sql()
        yield Logins(owner, db.login("jobrunner_worker"))


def as_worker(logins: Logins, *args: str) -> Result:
    result = run_cli(*args, "--database-url", logins.worker)
    assert result.exit_code == 0, f"{args}: {result.stderr}"
    return result


def test_the_worker_enqueues_ticks_retries_cancels_and_reads_status(logins: Logins) -> None:
    ok = int(as_worker(logins, "enqueue", "test.ok").stdout)
    doomed = int(as_worker(logins, "enqueue", "test.give_up").stdout)
    later = int(as_worker(logins, "enqueue", "test.ok", "--delay", "1h").stdout)

    tick = as_worker(logins, "tick", "--handlers", "tests.handlers.basic", "--json")
    assert json.loads(tick.stdout)["claimed"] >= 2
    assert status_of(logins, ok) == "succeeded"
    assert status_of(logins, doomed) == "dead"

    assert as_worker(logins, "retry", str(doomed)).stdout == f"retried {doomed}\n"
    assert as_worker(logins, "cancel", str(later)).stdout == f"cancelled {later}\n"
    assert (status_of(logins, doomed), status_of(logins, later)) == ("queued", "cancelled")

    status = json.loads(as_worker(logins, "status", "--json").stdout)
    assert status["runs"]["cancelled"] >= 1 and status["job_types"]["test.ok"]["runs"]


def status_of(logins: Logins, run_id: int) -> str:
    return json.loads(as_worker(logins, "show", str(run_id), "--json").stdout)["status"]


def test_the_worker_runs_the_monitoring_and_housekeeping_commands(logins: Logins) -> None:
    as_worker(logins, "list", "--json")
    assert "jobrunner_runs" in as_worker(logins, "metrics").stdout
    as_worker(logins, "check", "--max-stuck", "0")
    pruned = json.loads(as_worker(logins, "prune", "--older-than", "0s", "--json").stdout)
    assert pruned["dry_run"] is False
    # The tick's own housekeeping works with the same privileges.
    as_worker(logins, "tick", "--handlers", "tests.handlers.basic", "--prune-older-than", "0s")


def test_the_worker_cannot_migrate(logins: Logins) -> None:
    result = run_cli("migrate", "--database-url", logins.worker)
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("jobrunner: error: cannot migrate as role jr_test_worker_")
    assert "permission denied for schema public" in line
    assert "run `jobrunner migrate` as the schema owner" in line


def test_the_owner_migrates_again_as_a_no_op(logins: Logins) -> None:
    result = run_cli("migrate", "--database-url", logins.owner)
    assert result.exit_code == 0, result.stderr
    assert "schema up to date" in result.stderr
