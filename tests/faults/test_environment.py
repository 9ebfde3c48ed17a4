"""The host around the tick: a clock hours off the database's, and cron's minimal
environment. Neither may change what the tick stores or does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from cronjob import store
from tests.conftest import ROOT, count, wait_for
from tests.faults.conftest import HANDLERS

FAKETIME = shutil.which("faketime")


def _jobrunner(
    *args: str, env: dict[str, str], prefix: tuple[str, ...] = (), **popen: object
) -> subprocess.Popen:
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "cronjob", *args],
        env=env,
        cwd=ROOT,  # `-m` puts the working directory on sys.path: the tests' handlers import
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def _finish(proc: subprocess.Popen, input: str | None = None) -> str:
    stdout, stderr = proc.communicate(input, timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    return stdout


@pytest.mark.skipif(FAKETIME is None, reason="needs faketime (Debian package: faketime)")
@pytest.mark.parametrize("shift", ["+5h", "-5h"])
def test_a_host_clock_hours_off_the_database_changes_nothing(db_url, conn, exec_log, shift):
    """Scenario: enqueue, add a schedule and tick under faketime, 5 h ahead or behind; delays,
    leases, backoff and materialization all follow the database clock."""
    env = {
        **os.environ,
        "JOBRUNNER_DATABASE_URL": db_url,
        "JOBRUNNER_HANDLERS": HANDLERS,
        "JOBRUNNER_TEST_EXEC_LOG": str(exec_log.path),
    }
    skewed = (FAKETIME, "-m", "-f", shift)

    runs = [
        {"type": "fault.work", "delay": "90s"},
        {"type": "fault.fail"},
        {"type": "fault.sleep", "payload": {"seconds": 2}},
    ]
    enqueuing = _jobrunner("enqueue", "--jsonl", "-", env=env, prefix=skewed, stdin=subprocess.PIPE)
    lines = "".join(json.dumps(r) + "\n" for r in runs)
    delayed, failing, sleeping = map(int, _finish(enqueuing, lines).split())
    ahead = "SELECT extract(epoch FROM {} - now()) FROM job_runs WHERE id = %s"
    assert 80 < conn.execute(ahead.format("run_at"), (delayed,)).fetchone()[0] <= 90

    _finish(
        _jobrunner(
            "schedule",
            "add",
            "minutely",
            "--cron",
            "* * * * *",
            "--type",
            "fault.work",
            env=env,
            prefix=skewed,
        )
    )
    definition = "SELECT extract(epoch FROM {} - now()) FROM job_definitions"
    assert -60 < conn.execute(definition.format("materialized_through")).fetchone()[0] <= 0
    assert 0 < conn.execute(definition.format("next_fire_at")).fetchone()[0] <= 60
    # As if created ten minutes ago: by the database clock one occurrence is due now
    # (catch-up "latest"); by a host clock 5 h off, none or one 5 h away would be.
    conn.execute(
        "UPDATE job_definitions SET materialized_through = now() - interval '10 minutes',"
        " next_fire_at = date_trunc('minute', now() - interval '10 minutes') + interval '1 minute'"
    )
    minute = "SELECT date_trunc('minute', now())"
    earliest = conn.execute(minute).fetchone()[0]

    ticking = _jobrunner("tick", "--lease", "60s", env=env, prefix=skewed)
    wait_for(lambda: exec_log.of(sleeping), "the sleeping handler to start")
    assert 55 < conn.execute(ahead.format("locked_until"), (sleeping,)).fetchone()[0] <= 60
    _finish(ticking)
    latest = conn.execute(minute).fetchone()[0]

    [(scheduled_for,)] = conn.execute(
        "SELECT scheduled_for FROM job_runs WHERE definition_id IS NOT NULL"
    ).fetchall()
    assert earliest <= scheduled_for <= latest

    assert store.run_get(conn, delayed).status == "queued"  # not due for another ~90 s
    assert store.run_get(conn, sleeping).status == "succeeded"
    failed = store.run_get(conn, failing)
    assert failed.status == "failed"
    # Full-jitter backoff (base 15 s) from the database's now; a short draw may have let
    # the tick retry it already, each retry doubling the ceiling.
    ceiling = timedelta(seconds=15 * 2 ** (failed.attempts - 1))
    assert timedelta(0) <= failed.run_at - failed.updated_at <= ceiling
    stamps = (
        "SELECT count(*) FROM job_runs WHERE {} NOT BETWEEN now() - interval '1 minute' AND now()"
    )
    for column in ("created_at", "started_at", "updated_at"):
        assert count(conn, stamps.format(column) + f" AND {column} IS NOT NULL") == 0, column


def _cron_environment(db_url: str, exec_log) -> dict[str, str]:
    # What cron gives a job: a bare PATH, SHELL, LOGNAME and a HOME; no TZ, no
    # locale. Plus the variables a crontab line would set for jobrunner.
    return {
        "PATH": "/usr/bin:/bin",
        "SHELL": "/bin/sh",
        "LOGNAME": "root",
        "HOME": "/nonexistent",
        "JOBRUNNER_DATABASE_URL": db_url,
        "JOBRUNNER_HANDLERS": HANDLERS,
        "JOBRUNNER_TEST_EXEC_LOG": str(exec_log.path),
    }


def test_a_tick_under_crons_minimal_environment_behaves_as_from_a_shell(db_url, conn, exec_log):
    """Scenario: enqueue and tick with cron's environment, then with a shell's (TZ, locale set);
    the runs stored, their payloads and the summaries are the same."""
    cron = _cron_environment(db_url, exec_log)
    shell = {**os.environ, **cron, "TZ": "Asia/Tokyo", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    text = "Zoë ✓ 日本"
    outcomes = []
    for env in (cron, shell):
        run_id = int(
            _finish(
                _jobrunner(
                    "enqueue",
                    "fault.echo",
                    "--payload",
                    f'{{"text": "{text}"}}',
                    "--run-at",
                    "2020-01-05T09:00:00",
                    env=env,
                )
            )
        )
        summary = _finish(_jobrunner("tick", "--json", env=env))
        run = store.run_get(conn, run_id)
        [echoed] = [e.event for e in exec_log.of(run_id, event=None)]
        outcomes.append(
            (
                run.status,
                run.run_at,
                run.payload,
                bytes.fromhex(echoed).decode(),
                sorted(json.loads(summary).items()),
            )
        )

    cron_outcome, shell_outcome = outcomes
    assert cron_outcome[:4] == (
        "succeeded",
        datetime(2020, 1, 5, 9, tzinfo=UTC),
        {"text": text},
        text,
    )
    without_elapsed = [[kv for kv in o[4] if kv[0] != "elapsed_s"] for o in outcomes]
    assert cron_outcome[:4] == shell_outcome[:4]
    assert without_elapsed[0] == without_elapsed[1]
