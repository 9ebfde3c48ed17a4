"""The Tasks backend as the roles of deploy/roles.sql: a Django app whose login may enqueue
(jobrunner_enqueuer) enqueues without reading any column of a run (the run that holds a task's
unique key, its result id and enqueue time come from jobrunner_runs_holding_keys), and
reading results (`get_result`) takes a login that may read runs.

Each role's login runs the test project in a process of its own, its database URL the login's.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import run_cli
from tests.django_suite.conftest import PROJECT, project_env
from tests.test_deploy import Server, server, throwaway_database  # noqa: F401 - fixture
from tests.test_roles import DJANGO_ROLE_TABLE, ROLES

# Enqueues add(1, 2) (or total(1, 2) with a unique key), or reads the result of a run; one
# line and exit 1 when refused.
PROBE = """
import sys

import django

django.setup()
from shop.tasks import add, total

try:
    if sys.argv[1] == "enqueue":
        print(add.enqueue(1, 2).id)
    elif sys.argv[1] == "enqueue-unique":
        print(total.using(unique_key=sys.argv[2]).enqueue(1, 2).id)
    else:
        print(add.get_result(sys.argv[2]).status)
except Exception as exc:
    print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture(scope="module")
def logins(server: Server) -> Iterator[dict[str, str]]:  # noqa: F811 - the imported fixture
    with throwaway_database(server) as db:
        db.roles_sql()
        owner = db.login("jobrunner_owner")
        migrated = run_cli("migrate", "--database-url", owner)
        assert migrated.exit_code == 0, migrated.stderr
        db.roles_sql()
        yield {"owner": owner} | {role: db.login(f"jobrunner_{role}") for role in ROLES[1:]}


def probe(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=PROJECT,
        env=project_env(url),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("role", ROLES)
def test_task_enqueue_takes_a_role_that_may_enqueue(logins: dict[str, str], role: str) -> None:
    done = probe(logins[role], "enqueue")

    if role in DJANGO_ROLE_TABLE["Task.enqueue()"]:
        assert done.returncode == 0, done.stderr
        assert uuid.UUID(done.stdout.strip())  # the result's id
    else:
        assert done.returncode == 1
        assert done.stderr.startswith("InsufficientPrivilege: permission denied for table job_runs")


@pytest.mark.parametrize("role", ROLES)
def test_get_result_takes_a_role_that_may_read_runs(logins: dict[str, str], role: str) -> None:
    enqueued = probe(logins["owner"], "enqueue")
    assert enqueued.returncode == 0, enqueued.stderr

    done = probe(logins[role], "get_result", enqueued.stdout.strip())

    if role in DJANGO_ROLE_TABLE["get_result()"]:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "READY"
    else:
        assert done.returncode == 1
        assert done.stderr.startswith("InsufficientPrivilege: permission denied for table")


def test_the_enqueuer_learns_the_result_of_the_run_holding_a_unique_key(
    logins: dict[str, str],
) -> None:
    first = probe(logins["enqueuer"], "enqueue-unique", "month-end")
    again = probe(logins["enqueuer"], "enqueue-unique", "month-end")

    assert (first.returncode, again.returncode) == (0, 0), (first.stderr, again.stderr)
    assert again.stdout == first.stdout
