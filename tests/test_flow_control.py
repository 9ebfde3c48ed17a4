"""Flow control under real concurrency: limits per type and per key, checked from outside.

Several real `jobrunner tick` processes (the hosts) drain one queue at once, each restarted as
cron would restart it until nothing is left. Their handler (tests/handlers/flow.py) logs the
start and end of every run to a file, with the wall clock: the runs in flight at any instant
are counted from that log, never from what the database says about itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

import tests.handlers.flow  # noqa: F401 - registers flow.work for the in-process ticks
from tests.conftest import count, jobrunner_process, run_cli, wait_for
from tests.factories import insert_runs, tick

HANDLERS = "tests.handlers.flow"


class Hosts:
    """`n` hosts, each running `jobrunner tick` again and again (as cron would) until no run
    of flow.work is left unfinished, or `stop()`."""

    def __init__(self, db_url: str, log: Path, n: int, *tick_args: str) -> None:
        self.db_url, self.log, self.args = db_url, log, tick_args
        self.stopping = threading.Event()
        self.current: dict[int, subprocess.Popen[str]] = {}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._host, args=(i,)) for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _left(self) -> int:
        with psycopg.connect(self.db_url) as conn:
            return count(conn, "SELECT count(*) FROM job_runs WHERE finished_at IS NULL")

    def _host(self, i: int) -> None:
        while not self.stopping.is_set() and self._left():
            process = jobrunner_process(
                "tick",
                "--database-url",
                self.db_url,
                "--handlers",
                HANDLERS,
                "--log-level",
                "warning",
                *self.args,
                env={"JOBRUNNER_TEST_EXEC_LOG": str(self.log)},
            )
            self.current[i] = process
            _, stderr = process.communicate(timeout=120)
            if process.returncode not in (0, -signal.SIGKILL):
                self.errors.append(stderr)
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        os.kill(self.current[i].pid, signal.SIGKILL)

    def join(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.stopping.set()
        assert not any(t.is_alive() for t in self.threads), "the hosts did not finish"
        assert not self.errors, self.errors[0]


class Ran:
    """One execution of a run, from the log: when it started and ended (None: killed)."""

    def __init__(self, run_id: int, attempt: int, pid: int, tenant: str, key: str, start: float):
        self.run_id, self.attempt, self.pid = run_id, attempt, pid
        self.tenant, self.key, self.start = tenant, key, start
        self.end: float | None = None


def executions(log: Path) -> list[Ran]:
    ran: dict[tuple[int, int], Ran] = {}
    for line in log.read_text().splitlines():
        event, run_id, attempt, pid, tenant, key, at = line.split()
        slot = (int(run_id), int(attempt))
        if event == "start":
            ran[slot] = Ran(int(run_id), int(attempt), int(pid), tenant, key, float(at))
        else:
            ran[slot].end = float(at)
    return list(ran.values())


def most_in_flight(ran: list[Ran], killed_at: dict[int, float] | None = None) -> int:
    """The most executions in flight at one instant. An execution of a killed process ends
    when it was killed; an end comes before a start at the same instant."""
    events = []
    for r in ran:
        end = r.end if r.end is not None else (killed_at or {})[r.pid]
        events += [(r.start, 1), (end, -1)]
    most = current = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        current += step
        most = max(most, current)
    return most


def by(ran: list[Ran], attribute: str) -> dict[str, list[Ran]]:
    groups: dict[str, list[Ran]] = defaultdict(list)
    for r in ran:
        groups[getattr(r, attribute)].append(r)
    return groups


def work(conn: Any, n: int, *, seconds: float = 0.1, **columns: Any) -> list[int]:
    payload = sql.SQL("jsonb_build_object('seconds', {}::float8, 'account', 'acct-' || (i % 3))")
    return insert_runs(conn, n, "flow.work", payload=payload.format(seconds), **columns)


def limit(db_url: str, *args: str) -> None:
    result = run_cli("limit", "flow.work", *args, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr


def all_succeeded_first_time(conn: Any, n: int) -> None:
    """Nothing held back was charged an attempt or marked failed."""
    rows = conn.execute("SELECT status, attempts, count(*) FROM job_runs GROUP BY 1, 2").fetchall()
    assert rows == [("succeeded", 1, n)]
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0


# -- the command --------------------------------------------------------------------


def test_a_limit_is_set_listed_cleared_and_audited(db_url, conn):
    args = ["--concurrency", "2", "--per", "payload:account", "--rate", "10/1s"]
    set_ = run_cli("limit", "flow.work", *args, "--reason", "partner API", "--database-url", db_url)
    assert set_.exit_code == 0, set_.stderr
    assert set_.stdout.strip() == (
        "limited flow.work: at most 2 running, 10 starts per 1s, per payload field account"
    )
    listed = json.loads(run_cli("limits", "--json", "--database-url", db_url).stdout)
    assert [
        (x["job_type"], x["concurrency"], x["rate"], x["per"], x["reason"]) for x in listed
    ] == [("flow.work", 2, "10/1s", "payload:account", "partner API")]
    cleared = run_cli("limit", "flow.work", "--clear", "--database-url", db_url)
    assert cleared.stdout.strip() == "cleared the limit of flow.work"
    assert run_cli("limits", "--database-url", db_url).stdout.strip() == "no limits"
    audit = conn.execute("SELECT command, reason FROM job_audit ORDER BY id").fetchall()
    assert audit == [("limit", "partner API"), ("limit --clear", None)]


def test_a_limit_without_a_number_or_with_a_bad_key_is_refused_and_nothing_is_written(db_url, conn):
    bad = [
        [],
        ["--concurrency", "0"],
        ["--concurrency", "2", "--per", "account"],
        ["--rate", "10"],
        ["--rate", "0/1s"],
        ["--clear", "--concurrency", "2"],
    ]
    for args in bad:
        result = run_cli("limit", "flow.work", *args, "--database-url", db_url)
        assert result.exit_code == 2, (args, result.stderr)
    assert count(conn, "SELECT count(*) FROM job_type_limits") == 0
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


# -- concurrency --------------------------------------------------------------------


def test_a_type_limited_to_two_never_has_more_than_two_in_flight_across_four_hosts(
    db_url, conn, tmp_path
):
    log = tmp_path / "exec.log"
    limit(db_url, "--concurrency", "2")
    work(conn, 40)
    Hosts(db_url, log, 4, "--concurrency", "4").join()
    ran = executions(log)
    assert len(ran) == 40
    assert most_in_flight(ran) == 2
    all_succeeded_first_time(conn, 40)


def test_a_limit_per_tenant_holds_each_tenant_apart_and_lets_tenants_run_side_by_side(
    db_url, conn, tmp_path
):
    log = tmp_path / "exec.log"
    limit(db_url, "--concurrency", "1", "--per", "tenant")
    for tenant in ("a", "b", "c"):
        work(conn, 12, tenant_id=tenant)
    Hosts(db_url, log, 3, "--concurrency", "4").join()
    ran = executions(log)
    assert len(ran) == 36
    assert {t: most_in_flight(runs) for t, runs in by(ran, "tenant").items()} == {
        "a": 1,
        "b": 1,
        "c": 1,
    }
    assert most_in_flight(ran) > 1
    all_succeeded_first_time(conn, 36)


def test_a_limit_per_payload_field_holds_each_value_apart(db_url, conn, tmp_path):
    log = tmp_path / "exec.log"
    limit(db_url, "--concurrency", "2", "--per", "payload:account")
    work(conn, 36)
    Hosts(db_url, log, 3, "--concurrency", "4").join()
    ran = executions(log)
    assert len(ran) == 36
    in_flight = {key: most_in_flight(runs) for key, runs in by(ran, "key").items()}
    assert sorted(in_flight) == ["acct-0", "acct-1", "acct-2"]
    assert max(in_flight.values()) == 2 and most_in_flight(ran) > 2
    all_succeeded_first_time(conn, 36)


def test_a_host_killed_mid_run_holds_its_place_only_until_its_lease_expires(db_url, conn, tmp_path):
    log = tmp_path / "exec.log"
    limit(db_url, "--concurrency", "1")
    work(conn, 8, seconds=0.5)
    hosts = Hosts(db_url, log, 3, "--concurrency", "2")
    started = wait_for(lambda: log.exists() and executions(log), "a run to start")
    victim = next(i for i, p in hosts.current.items() if p.pid == started[0].pid)
    killed_at = time.time()
    hosts.kill(victim)
    hosts.join()
    ran = executions(log)
    assert most_in_flight(ran, {started[0].pid: killed_at}) == 1
    # The killed run ran again, once its lease (2 s) had expired; everything finished.
    again = [r for r in ran if r.run_id == started[0].run_id and r.attempt == 2]
    assert again and again[0].start >= killed_at + 1.5
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status <> 'succeeded'") == 0


def test_a_changed_limit_holds_from_every_hosts_next_claim(db_url, conn, tmp_path):
    log = tmp_path / "exec.log"
    limit(db_url, "--concurrency", "1")
    work(conn, 40, seconds=0.2)
    hosts = Hosts(db_url, log, 3, "--concurrency", "4")
    wait_for(lambda: log.exists() and len(executions(log)) >= 5, "five runs to start")
    changed_at = time.time()
    limit(db_url, "--concurrency", "3")
    hosts.join()
    ran = executions(log)
    before = [r for r in ran if r.start < changed_at]
    assert most_in_flight(before) == 1
    assert most_in_flight(ran) == 3
    all_succeeded_first_time(conn, 40)


# -- rate -----------------------------------------------------------------------------
#
# A rate counts a start when a claim takes the run, by the database clock: the run's
# started_at. Its promise is about every span of one period, wherever it starts.


def started(conn: Any, **where: Any) -> list[datetime]:
    """When each run of flow.work (of the tenant given) was claimed, by the database clock."""
    tenant = where.get("tenant_id")
    rows = conn.execute(
        "SELECT started_at FROM job_runs WHERE job_type = 'flow.work'"
        " AND started_at IS NOT NULL AND (%s::text IS NULL OR tenant_id = %s) ORDER BY 1",
        (tenant, tenant),
    ).fetchall()
    return [row[0] for row in rows]


def most_in_any_span(starts: list[datetime], period: timedelta) -> int:
    """The most starts in one span [s, s + period), over every s."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_a_type_limited_to_five_starts_a_second_never_starts_more_across_three_hosts(
    db_url, conn, tmp_path
):
    log = tmp_path / "exec.log"
    limit(db_url, "--rate", "5/1s")
    work(conn, 30, seconds=0.01)
    Hosts(db_url, log, 3, "--concurrency", "4").join()
    assert len(executions(log)) == 30
    starts = started(conn)
    assert most_in_any_span(starts, timedelta(seconds=1)) <= 5
    # One start every fifth of a second, whichever host claims it: 30 take 5.8 s at least.
    # Held back, never failed, nothing charged.
    assert starts[-1] - starts[0] >= timedelta(seconds=5.8)
    all_succeeded_first_time(conn, 30)


def test_a_rate_per_tenant_holds_each_tenant_to_its_own_rate(db_url, conn, tmp_path):
    log = tmp_path / "exec.log"
    limit(db_url, "--rate", "3/1s", "--per", "tenant")
    for tenant in ("a", "b"):
        work(conn, 9, seconds=0.01, tenant_id=tenant)
    Hosts(db_url, log, 2, "--concurrency", "4").join()
    assert len(executions(log)) == 18
    for tenant in ("a", "b"):
        starts = started(conn, tenant_id=tenant)
        assert most_in_any_span(starts, timedelta(seconds=1)) <= 3, tenant
        # Nine starts at three a second take 8/3 s at least: never all at once.
        assert starts[-1] - starts[0] >= timedelta(seconds=8 / 3), tenant
    # The tenants do not share a key: each started while the other did.
    a, b = started(conn, tenant_id="a"), started(conn, tenant_id="b")
    assert max(a[0], b[0]) < min(a[-1], b[-1])
    all_succeeded_first_time(conn, 18)


def ticks_at(db_url: str, moments: list[datetime], **options: Any) -> None:
    """In-process ticks of flow.work, each with its clock pinned to one of `moments`: as many
    ticks as the test wants, when it chooses, by the database clock the claims read."""
    for at in moments:
        tick(db_url, "flow.work", now=at, **options)


def every(first: datetime, step: float, seconds: float) -> list[datetime]:
    return [first + timedelta(seconds=step * i) for i in range(round(seconds / step))]


def before_a_window_boundary(conn: Any, period: float, before: float) -> datetime:
    """A moment `before` seconds ahead of a multiple of `period` seconds since the epoch (where
    a window aligned to the epoch would end), a few seconds ahead of the database clock."""
    now = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0]
    boundary = (int((now + 5) // period) + 1) * period
    return datetime.fromtimestamp(boundary, UTC) - timedelta(seconds=before)


def test_a_rate_holds_over_every_span_of_its_period_across_what_was_a_window_boundary(db_url, conn):
    # 4/2s: windows aligned to the epoch let 4 start 0.31 s before a boundary and 4 more
    # at it, 8 within 0.31 s. Ticks a tenth of a second apart, from just before a boundary.
    limit(db_url, "--rate", "4/2s")
    work(conn, 40, seconds=0)
    first = before_a_window_boundary(conn, 2.0, 0.31)
    ticks_at(db_url, every(first, 0.1, 6))
    starts = started(conn)
    assert most_in_any_span(starts, timedelta(seconds=2)) == 4
    # The first four at once, and nothing more until a whole period after them.
    assert starts[:5] == [first] * 4 + [first + timedelta(seconds=2)]
    assert count(conn, "SELECT count(*) FROM job_runs WHERE attempts > 0") == len(starts)


def test_a_rate_holds_over_every_span_whenever_the_claims_come_and_whatever_they_take(db_url, conn):
    # Ticks at random moments (seeded), each taking at most a random few runs: a key that
    # was idle for part of a period may start some at once, never more than the period
    # allows, whichever span one looks at.
    limit(db_url, "--rate", "4/2s")
    work(conn, 200, seconds=0)
    chance = random.Random(39)
    at = before_a_window_boundary(conn, 2.0, 0.31)
    for _ in range(80):
        at += timedelta(microseconds=chance.randrange(0, 1_300_000))
        tick(db_url, "flow.work", now=at, batch_size=chance.randint(1, 6))
    starts = started(conn)
    assert most_in_any_span(starts, timedelta(seconds=2)) <= 4
    assert len(starts) > 30


def test_a_rate_still_reaches_its_full_rate_over_time(db_url, conn):
    limit(db_url, "--rate", "4/2s")
    work(conn, 40, seconds=0)
    first = before_a_window_boundary(conn, 2.0, 0.31)
    ticks_at(db_url, every(first, 0.1, 6))
    # Three periods, four starts each: four at once by a key idle until then, then one
    # every half second from a period after them.
    half = timedelta(seconds=0.5)
    assert started(conn) == [first] * 4 + [first + 4 * half + i * half for i in range(8)]
    # The others wait, queued, no attempt spent.
    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM job_runs WHERE started_at IS NULL GROUP BY 1, 2"
    ).fetchall()
    assert rows == [("queued", 0, 28)]


def test_a_tick_stays_for_the_starts_its_rate_spaces_out(db_url, conn):
    # One tick of a real process starts them all, at the rate, rather than those the key
    # may start at once and leave the rest to the next cron tick.
    limit(db_url, "--rate", "10/1s")
    work(conn, 25, seconds=0)
    process = jobrunner_process("tick", "--database-url", db_url, "--handlers", HANDLERS, "--json")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert json.loads(out)["claimed"] == 25
    starts = started(conn)
    assert most_in_any_span(starts, timedelta(seconds=1)) <= 10
    assert starts[-1] - starts[0] >= timedelta(seconds=1.5)
    all_succeeded_first_time(conn, 25)


# -- where limits live ---------------------------------------------------------------


def test_schedule_sync_applies_the_limits_of_a_file_and_prunes_only_with_prune(
    db_url, conn, tmp_path
):
    path = tmp_path / "jobs.toml"
    path.write_text(
        '[schedules.nightly]\ncron = "0 3 * * *"\ntype = "flow.work"\n\n'
        '[limits."flow.work"]\nconcurrency = 2\nper = "payload:account"\nrate = "500/1h"\n'
    )
    limit(db_url, "--concurrency", "9")  # replaced by the file's
    run_cli("limit", "other", "--rate", "1/1s", "--database-url", db_url)
    synced = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    assert synced.exit_code == 0, synced.stderr
    assert "limit     limit of flow.work" in synced.stdout
    assert "keep      limit of other" in synced.stdout
    rows = conn.execute(
        "SELECT job_type, concurrency, rate, rate_period, per, per_field FROM job_type_limits"
        " ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("flow.work", 2, 500, 3600.0, "payload", "account"),
        ("other", None, 1, 1.0, "type", None),
    ]
    again = run_cli("schedule", "sync", str(path), "--prune", "--database-url", db_url)
    assert "unchanged limit of flow.work" in again.stdout
    assert "unlimit   limit of other" in again.stdout
    assert count(conn, "SELECT count(*) FROM job_type_limits") == 1


def test_a_bad_limit_in_a_file_rejects_the_whole_file(db_url, conn, tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text(
        '[schedules.nightly]\ncron = "0 3 * * *"\ntype = "t"\n\n[limits.t]\nconcurrency = 0\n'
    )
    synced = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    assert synced.exit_code == 2
    assert "limit 't'" in synced.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
