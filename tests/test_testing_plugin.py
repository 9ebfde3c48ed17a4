"""The pytest plugin as its users meet it: the sample shop project's tests, run by a real
`pytest` process, and what the plugin does to a session that never asks for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, _with_dbname

PROJECT = ROOT / "tests" / "plugin_project"


@pytest.fixture(scope="module")
def plugin_database_url(server_url: str) -> Any:
    """A database of the sample project's own: its session migrates it, as a user's would."""
    name = f"jobrunner_plugin_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _with_dbname(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pytest_run(
    *args: str, cwd: Path = PROJECT, database_url: str = "", timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`pytest ARGS` in `cwd`, in a process of its own, with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBRUNNER_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if database_url:
        env["JOBRUNNER_TEST_DATABASE_URL"] = database_url
    # An install from before the plugin's entry point does not register it: named here, as
    # `-p` names a plugin that is not installed.
    registered = any(ep.value == "cronjob.testing.plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if registered else ["-p", "cronjob.testing.plugin"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_package_registers_the_plugin() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {
        "jobrunner": "cronjob.testing.plugin"
    }


def test_the_sample_projects_tests_pass(plugin_database_url: str) -> None:
    done = pytest_run("-q", "-rA", database_url=plugin_database_url)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?13 passed(, \d+ warnings?)? in .*", summary), summary
    for shown in [
        "test_a_failed_charge_is_retried_after_its_backoff",
        "test_a_charge_that_keeps_failing_ends_dead",
        "test_the_nightly_report_runs_at_two",
        "test_an_async_handler_is_awaited_by_adrain",
        "test_a_handler_is_called_alone_with_run_handler",
    ]:
        assert f"PASSED tests/test_shop_jobs.py::{shown}" in done.stdout


def test_a_failed_assertion_lists_what_was_enqueued_instead(plugin_database_url: str) -> None:
    done = pytest_run("-q", "failing", database_url=plugin_database_url)
    assert done.returncode == 1, done.stdout[-4000:]
    out = done.stdout
    assert (
        "AssertionError: expected a waiting run of job type 'send_welcome_email' with payload"
        ' containing {"to": "bob@example.com"}; found none' in out
    )
    assert "enqueued (2):" in out
    assert re.search(
        r'#\d+ send_welcome_email payload=\{"to": "ada@example.com", "user_id": \d+\}'
        r" run_at=\S+",
        out,
    )
    assert re.search(r"#\d+ charge_card tenant='7' payload=\{\"card\": \"4242\"", out)
    assert (
        "AssertionError: expected no waiting run of job type 'charge_card' with tenant '7'" in out
    )
    assert "found (1):" in out
    assert re.fullmatch(r"=* ?2 failed in .*", out.strip().splitlines()[-1])


def test_a_session_that_never_asks_for_the_fixture_needs_no_database(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text(
        "import sys\n\n\n"
        "def test_nothing_of_jobrunner_is_loaded():\n"
        "    assert 'cronjob.testing.jobrunner' not in sys.modules\n"
        "    assert 'psycopg' not in sys.modules\n"
    )
    # A database that cannot be reached: the plugin must not look for it.
    unreachable = "postgresql://nobody@/nowhere?host=/nonexistent&connect_timeout=1"
    done = pytest_run("-q", cwd=tmp_path, database_url=unreachable, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
