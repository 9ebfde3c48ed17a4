"""Overlap policies: a slow run of `* * * * *` and the occurrences that fall due meanwhile.

Each minute of database time is a few real tick processes started together with their clock
pinned to that minute (tests/tick_at.py). The handler (tests/handlers/overlap.py) holds a run
until the test releases it, and records outside the database if two runs of the schedule
ever run at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, count, run_cli, wait_for
from tests.faults.conftest import ExecLog

TICKS_PER_MINUTE = 3


class Minutes:
    """Database minutes of one schedule, ticked by real processes with a pinned clock."""

    def __init__(self, db_url: str, conn: psycopg.Connection[Any], folder: Path) -> None:
        self.db_url, self.conn, self.folder = db_url, conn, folder
        self.exec_log = ExecLog(folder / "executions.log")
        start = conn.execute("SELECT date_trunc('minute', now()) + interval '1 hour'").fetchone()
        self.t0: datetime = start[0]
        self.holding: dict[int, subprocess.Popen[str]] = {}  # run id -> the process running it
        self.started: list[subprocess.Popen[str]] = []

    def add(self, policy: str, *extra: str) -> None:
        result = run_cli(
            "schedule",
            "add",
            "every-minute",
            "--cron",
            "* * * * *",
            "--type",
            "overlap.slow",
            "--overlap",
            policy,
            "--database-url",
            self.db_url,
            *extra,
        )
        assert result.exit_code == 0, result.stderr
        self.conn.execute(
            "UPDATE job_definitions SET materialized_through = %s, next_fire_at = %s",
            [self.t0 - timedelta(seconds=30), self.t0],
        )

    def at(self, minute: int) -> datetime:
        return self.t0 + timedelta(minutes=minute)

    def tick(
        self, minute: int, *, seconds: int = 10, ticks: int = TICKS_PER_MINUTE, **options: Any
    ) -> None:
        """Start `ticks` processes at that minute; return once each has exited or holds a run."""
        now = self.at(minute) + timedelta(seconds=seconds)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JOBRUNNER_TEST_EXEC_LOG": str(self.exec_log.path),
            "JOBRUNNER_TEST_OVERLAP_DIR": str(self.folder),
        }
        batch = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.tick_at",
                    self.db_url,
                    now.isoformat(),
                    json.dumps(options),
                ],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=(self.folder / f"tick-{len(self.started) + i}.log").open("w"),
            )
            for i in range(ticks)
        ]
        self.started.extend(batch)

        def settled() -> bool:
            runs = self.exec_log.entries("run")
            pids = {e.pid for e in runs}
            if any(proc.poll() is None and proc.pid not in pids for proc in batch):
                return False
            live = {proc.pid: proc for proc in batch if proc.poll() is None}
            self.holding.update({e.run_id: live[e.pid] for e in runs if e.pid in live})
            return True

        wait_for(settled, f"the ticks of minute {minute} to settle", timeout=60)
        for proc in batch:
            if proc.poll() is not None:
                assert proc.returncode == 0, proc.stderr

    def release(self, run_id: int) -> None:
        """Let the run's handler return; wait until its tick exits or starts the next run."""
        (self.folder / f"release-{run_id}").touch()
        proc = self.holding.pop(run_id)
        seen = {e.run_id for e in self.exec_log.entries("run")}

        def next_run() -> int | None:
            fresh = [
                e.run_id
                for e in self.exec_log.entries("run")
                if e.pid == proc.pid and e.run_id not in seen
            ]
            return fresh[0] if fresh else None

        wait_for(lambda: proc.poll() is not None or next_run(), "the tick to move on", 30)
        if proc.poll() is None:
            self.holding[next_run()] = proc  # back to back: the same tick took the next run
        else:
            assert proc.returncode == 0

    def running(self) -> int:
        [run_id] = self.holding
        return run_id

    def runs(self) -> list[tuple[int, int, str]]:
        """(minute, attempts, status) of each run, by minute."""
        rows = self.conn.execute(
            "SELECT scheduled_for, attempts, status FROM job_runs ORDER BY scheduled_for"
        ).fetchall()
        return [(self.minute_of(t), attempts, status) for t, attempts, status in rows]

    def skipped(self) -> list[int]:
        rows = self.conn.execute("SELECT scheduled_for FROM job_schedule_skips ORDER BY 1")
        return [self.minute_of(t) for (t,) in rows.fetchall()]

    def waiting(self) -> int:
        return count(self.conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'")

    def minute_of(self, moment: datetime) -> int:
        return int((moment - self.t0).total_seconds() // 60)

    def stop(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def minutes(db_url, conn, tmp_path):
    clock = Minutes(db_url, conn, tmp_path)
    yield clock
    clock.stop()


def test_skip_never_overlaps_and_every_minute_is_a_run_or_a_recorded_skip(minutes):
    minutes.add("skip")
    minutes.tick(0)
    first = minutes.running()
    minutes.tick(1)
    minutes.tick(2)
    minutes.release(first)
    minutes.tick(3)
    minutes.tick(4)
    minutes.release(minutes.running())
    minutes.tick(5)
    minutes.release(minutes.running())

    assert minutes.runs() == [(0, 1, "succeeded"), (3, 1, "succeeded"), (5, 1, "succeeded")]
    assert minutes.skipped() == [1, 2, 4]
    assert minutes.exec_log.entries("overlap") == []
    assert len(minutes.exec_log.entries("run")) == 3


def test_skips_are_shown_with_their_reason_and_counted(minutes, db_url):
    minutes.add("skip")
    minutes.tick(0, ticks=1)
    minutes.tick(1, ticks=1)
    minutes.release(minutes.running())

    shown = json.loads(
        run_cli("schedule", "show", "every-minute", "--json", "--database-url", db_url).stdout
    )
    assert (shown["overlap"], shown["overlap_skips"]) == ("skip", 1)
    [skip] = shown["recent_skips"]
    assert datetime.fromisoformat(skip["scheduled_for"]) == minutes.at(1)
    assert skip["reason"] == "overlap skip: the previous run had not finished"
    text = run_cli("schedule", "show", "every-minute", "--database-url", db_url).stdout
    assert "recent skips:" in text and "the previous run had not finished" in text
    assert "skip (1 skipped so far)" in text
    metrics = run_cli("metrics", "--database-url", db_url).stdout
    assert 'jobrunner_schedule_overlap_skips_total{schedule="every-minute"} 1' in metrics


def test_queue_runs_back_to_back_with_at_most_one_waiting(minutes):
    minutes.add("queue")
    minutes.tick(0)
    first = minutes.running()
    minutes.tick(1)
    assert minutes.waiting() == 1  # minute 1 waits behind minute 0
    minutes.tick(2)
    minutes.tick(3)
    assert minutes.waiting() == 1
    assert list(minutes.holding) == [first]  # nothing started beside it
    minutes.release(first)
    minutes.tick(4)  # minute 1 starts; minute 4 waits behind it
    assert minutes.waiting() == 1
    second = minutes.running()
    minutes.release(second)
    # The tick that ran minute 1 looks again once it is done, and starts minute 4 at once.
    third = minutes.running()
    assert minutes.holding[third].pid == next(e.pid for e in minutes.exec_log.of(second))
    assert minutes.waiting() == 0
    minutes.release(third)

    assert [m for m, _, _ in minutes.runs()] == [0, 1, 4]
    assert {status for _, _, status in minutes.runs()} == {"succeeded"}
    assert minutes.skipped() == [2, 3]
    assert minutes.exec_log.entries("overlap") == []
    # They ran in their order, one after the other.
    run_ids = [e.run_id for e in minutes.exec_log.entries("run")]
    assert run_ids == sorted(run_ids) and len(run_ids) == 3


def test_queue_with_catch_up_all_keeps_one_waiting_and_skips_the_rest(minutes):
    minutes.add("queue", "--catch-up", "all")
    minutes.tick(0)
    first = minutes.running()
    minutes.tick(4, ticks=1)  # minutes 1 to 4 are due at once
    assert minutes.waiting() == 1
    assert minutes.skipped() == [2, 3, 4]
    minutes.release(first)
    minutes.tick(4, seconds=50, ticks=1)
    minutes.release(minutes.running())
    assert minutes.holding == {}
    assert [m for m, _, _ in minutes.runs()] == [0, 1]
    assert minutes.exec_log.entries("overlap") == []


def test_kill_9_of_the_running_tick_frees_the_schedule_after_its_lease(minutes):
    minutes.add("skip")
    minutes.tick(0, lease=90)  # claimed at 0:10, leased until 1:40
    first = minutes.running()
    victim = minutes.holding.pop(first)
    victim.kill()
    victim.wait()

    minutes.tick(1)  # 1:10: the lease holds, so minute 1 is skipped and nothing runs
    assert minutes.skipped() == [1]
    assert minutes.holding == {}
    minutes.tick(2)  # 2:10: the lease expired; the run is rescued and runs again, minute 2 skips
    assert minutes.running() == first
    minutes.release(first)
    minutes.tick(3)
    minutes.release(minutes.running())

    assert minutes.runs() == [(0, 2, "succeeded"), (3, 1, "succeeded")]
    assert minutes.skipped() == [1, 2]
    assert minutes.exec_log.entries("overlap") == []


def test_tenant_scoped_skip_is_per_tenant(minutes, conn):
    conn.execute("DROP TABLE IF EXISTS overlap_tenants")
    conn.execute("CREATE TABLE overlap_tenants (id text)")
    conn.execute("INSERT INTO overlap_tenants VALUES ('a'), ('b')")
    try:
        minutes.add("skip", "--scope", "tenant")
        tenants = {"tenants_sql": "SELECT id FROM overlap_tenants"}
        minutes.tick(0, ticks=2, **tenants)  # two runs, one per tenant, both held
        assert len(minutes.holding) == 2
        minutes.tick(1, ticks=2, **tenants)
        rows = conn.execute("SELECT tenant_id FROM job_schedule_skips ORDER BY 1").fetchall()
        assert rows == [("a",), ("b",)]
        for run_id in minutes.holding:
            (minutes.folder / f"release-{run_id}").touch()
        for proc in set(minutes.holding.values()):
            assert proc.wait(timeout=30) == 0
    finally:
        conn.execute("DROP TABLE overlap_tenants")
    assert minutes.exec_log.entries("overlap") == []
