"""Long work on a terminal shows its progress on stderr and stops cleanly on Ctrl-C or
SIGTERM; piped, it prints what it always printed.

Real `jobrunner` processes on a real pseudo-terminal (tests/terminal.py), against tables
filled in one statement each; and the library's side, a Progress that stops the work.

Nothing here races the machine's speed: a bar that must show is asked for from the first
step (JOBRUNNER_PROGRESS_DELAY=0), and work stopped by a signal is held at a lock another
session holds (`held`) until the signal is in, then let go.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Iterator

import psycopg
import pytest

from cronjob import incident
from cronjob.models import Selection
from cronjob.progress import Progress, Stopped
from tests.conftest import count, jobrunner_process, run_cli, wait_for
from tests.factories import insert_runs, now
from tests.terminal import OnTerminal

# The bar from the work's first step: what a test of the bar sees does not depend on how long
# the work takes.
AT_ONCE = {"JOBRUNNER_PROGRESS_DELAY": "0"}
RUNS = 200_000
# A refresh of the bar that has counted some of the work: "12,000/200,000 runs".
COUNTED = r"\r[^\r\n]*? (\d[\d,]*)/{total} {unit}"
# What `prune --older-than 1d` prints when it has pruned every run, as it always has.
PRUNED_ALL = (
    "pruned 200000 run(s) finished more than 1d ago (succeeded 200000, dead 0, cancelled 0)\n"
)


def refreshes(screen: str, total: int, unit: str = "runs") -> list[int]:
    """The counts the bar showed, in the order it showed them."""
    pattern = COUNTED.format(total=f"{total:,}", unit=unit)
    return [int(n.replace(",", "")) for n in re.findall(pattern, screen)]


def finished(conn, runs: int) -> None:
    """`runs` runs that succeeded two days ago, in a table its statistics describe (as
    autovacuum keeps them)."""
    insert_runs(conn, runs, status="succeeded", finished_at=now("-2 days"))
    conn.execute("ANALYZE job_runs")


@pytest.fixture
def finished_history(conn):
    finished(conn, RUNS)
    return conn


@contextlib.contextmanager
def held(db_url: str, table: str, terminal: OnTerminal) -> Iterator[None]:
    """`table` locked (SHARE) by another session until the block ends, and the block entered
    once the command's work waits for that lock: a signal sent in the block reaches the work
    in the middle of its step, however fast the machine."""
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as watcher:
        holder.execute(f"LOCK TABLE {table} IN SHARE MODE")

        def waiting() -> bool:
            if terminal.process.poll() is not None:
                raise AssertionError(f"the command ended before it waited:\n{terminal.screen}")
            return watcher.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks"
                " WHERE NOT granted AND relation = %s::regclass)",
                [table],
            ).fetchone()[0]

        wait_for(waiting, f"the command to wait for its lock on {table}")
        yield
        holder.rollback()


def ctrl_c(terminal: OnTerminal) -> None:
    """Ctrl-C typed, and echoed: the terminal has sent its SIGINT by then."""
    terminal.type(b"\x03")
    terminal.wait_for(r"\^C")


def audited(db_url: str, command: str) -> int:
    """The runs `jobrunner audit` says `command` changed, over all its entries."""
    entries = json.loads(run_cli("audit", "--json", "--database-url", db_url).stdout)
    return sum(entry["changed"] for entry in entries if entry["command"] == command)


def test_a_prune_of_many_runs_shows_its_progress_on_the_terminal(db_url, finished_history):
    args = ("prune", "--older-than", "1d", "--database-url", db_url)
    with OnTerminal(*args, env=AT_ONCE) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    shown = refreshes(terminal.screen, RUNS)
    assert len(set(shown)) > 1, terminal.screen
    assert shown == sorted(shown) and shown[-1] == RUNS
    assert re.search(r"[\d,]+ runs/s", terminal.screen)
    assert stdout == PRUNED_ALL


def test_a_piped_prune_prints_what_it_always_printed(db_url, finished_history):
    process = jobrunner_process("prune", "--older-than", "1d", "--database-url", db_url)
    stdout, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, stderr
    assert (stdout, stderr) == (PRUNED_ALL, "")


def test_a_prune_stopped_by_ctrl_c_keeps_what_it_did_and_the_next_one_does_the_rest(
    db_url, finished_history
):
    conn = finished_history
    args = ("prune", "--older-than", "1d", "--database-url", db_url)
    with OnTerminal(*args, "--batch-size", "100") as terminal:
        with held(db_url, "job_audit", terminal):  # the first batch's audit entry
            ctrl_c(terminal)
        code, stdout = terminal.finish()

    assert code == 130, terminal.screen
    told = terminal.wait_for(r"jobrunner: stopped by SIGINT: pruned (\d+) run\(s\); the rest")
    pruned = int(told.group(1))
    left = count(conn, "SELECT count(*) FROM job_runs")
    assert pruned == 100  # the batch under way, and no other
    assert pruned == RUNS - left
    assert audited(db_url, "prune") == pruned
    assert stdout == ""

    again = run_cli(*args)

    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith(f"pruned {left} run(s) ")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert audited(db_url, "prune") == RUNS


def test_a_prune_stopped_by_sigterm_exits_143_saying_what_it_did(db_url, conn):
    runs = 20_000
    finished(conn, runs)
    with OnTerminal(
        "prune", "--older-than", "1d", "--batch-size", "50", "--database-url", db_url
    ) as terminal:
        with held(db_url, "job_audit", terminal):
            terminal.process.send_signal(signal.SIGTERM)
        code, _ = terminal.finish()

    assert code == 143, terminal.screen
    told = terminal.wait_for(r"stopped by SIGTERM: pruned (\d+) run\(s\)")
    assert int(told.group(1)) == 50
    assert int(told.group(1)) == runs - count(conn, "SELECT count(*) FROM job_runs")


def test_a_bulk_retry_by_filter_shows_its_progress_on_the_terminal(db_url, conn):
    dead = 40_000
    insert_runs(
        conn,
        dead,
        "send_email",
        status="dead",
        attempts=3,
        max_attempts=3,
        error_type="SMTPServerDisconnected",
        last_error="gone",
    )
    conn.execute("ANALYZE job_runs")
    with OnTerminal(
        "retry",
        "--status",
        "dead",
        "--type",
        "send_email",
        "--error-type",
        "SMTPServerDisconnected",
        "--yes",
        "--database-url",
        db_url,
        env=AT_ONCE,
    ) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    shown = refreshes(terminal.screen, dead)
    assert len(set(shown)) > 1, terminal.screen
    assert shown[-1] == dead
    assert stdout == f"retried {dead} run(s) (dead {dead}) in 41 batch(es); audit #1\n"


def test_an_enqueue_of_a_large_jsonl_file_shows_its_progress_on_the_terminal(
    db_url, conn, tmp_path
):
    lines = 100_000
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(f'{{"type": "t", "payload": {{"n": {i}}}}}\n' for i in range(lines)))
    args = ("enqueue", "--jsonl", str(path), "--database-url", db_url)
    with OnTerminal(*args, env=AT_ONCE) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    shown = refreshes(terminal.screen, lines)
    assert len(set(shown)) > 1, terminal.screen
    assert shown[-1] == lines
    assert len(stdout.split()) == lines
    assert count(conn, "SELECT count(*) FROM job_runs") == lines


def test_an_enqueue_stopped_by_ctrl_c_enqueues_nothing(db_url, conn, tmp_path):
    lines = 100_000
    path = tmp_path / "runs.jsonl"
    path.write_text('{"type": "t"}\n' * lines)
    with OnTerminal("enqueue", "--jsonl", str(path), "--database-url", db_url) as terminal:
        with held(db_url, "job_runs", terminal):  # the first chunk's insert
            ctrl_c(terminal)
        code, stdout = terminal.finish()

    assert code == 130, terminal.screen
    assert "stopped by SIGINT: nothing enqueued" in terminal.screen
    assert stdout == ""
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_json_output_shows_no_progress_on_the_terminal(db_url, conn):
    runs = 20_000
    finished(conn, runs)
    with OnTerminal(
        "prune", "--older-than", "1d", "--batch-size", "50", "--json", "--database-url", db_url
    ) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    assert terminal.screen == ""
    assert json.loads(stdout)["total"] == runs


def test_quick_work_shows_no_progress(db_url, conn):
    insert_runs(conn, 10, status="succeeded", finished_at=now("-2 days"))
    with OnTerminal("prune", "--older-than", "1d", "--database-url", db_url) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    assert terminal.screen == ""
    assert stdout.startswith("pruned 10 run(s)")


def test_the_bar_waits_for_the_delay_the_environment_gives(db_url, conn):
    # Two batches, far shorter than an hour however slow the machine: no bar.
    finished(conn, 2_000)
    args = ("prune", "--older-than", "1d", "--batch-size", "1000", "--database-url", db_url)
    with OnTerminal(*args, env={"JOBRUNNER_PROGRESS_DELAY": "1h"}) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    assert terminal.screen == ""
    assert stdout.startswith("pruned 2000 run(s)")


def test_a_bad_progress_delay_on_a_terminal_is_one_line_and_exit_2(db_url, conn):
    finished(conn, 2_000)
    args = ("prune", "--older-than", "1d", "--batch-size", "1000", "--database-url", db_url)
    with OnTerminal(*args, env={"JOBRUNNER_PROGRESS_DELAY": "soon"}) as terminal:
        code, stdout = terminal.finish()

    assert code == 2, terminal.screen
    assert terminal.screen.splitlines() == [
        "jobrunner: error: invalid JOBRUNNER_PROGRESS_DELAY 'soon': expected a number with an"
        " optional unit ms, s, m, h or d (e.g. 90s, 5m, 2h, 1d)"
    ]
    assert stdout == ""
    assert count(conn, "SELECT count(*) FROM job_runs") == 2_000


def schedules_file(path, count: int):
    path.write_text(
        "".join(
            f'[schedules.job-{i}]\ncron = "{i % 60} * * * *"\ntype = "t"\n\n' for i in range(count)
        )
    )
    return path


def test_a_sync_of_a_large_schedule_file_shows_its_progress_on_the_terminal(db_url, conn, tmp_path):
    schedules = 5_000
    path = schedules_file(tmp_path / "schedules.toml", schedules)
    args = ("schedule", "sync", str(path), "--database-url", db_url)
    with OnTerminal(*args, env=AT_ONCE) as terminal:
        code, stdout = terminal.finish()

    assert code == 0, terminal.screen
    shown = refreshes(terminal.screen, schedules, unit="schedules")
    assert len(set(shown)) > 1, terminal.screen
    assert stdout.endswith(f"synced: {schedules} added, 0 changed, 0 unchanged, 0 removed\n")


def test_a_sync_stopped_by_ctrl_c_writes_nothing(db_url, conn, tmp_path):
    schedules = 5_000
    path = schedules_file(tmp_path / "schedules.toml", schedules)
    args = ("schedule", "sync", str(path), "--database-url", db_url)
    with OnTerminal(*args, env=AT_ONCE) as terminal:
        with held(db_url, "job_definitions", terminal):  # the first schedule's insert
            terminal.wait_for(COUNTED.format(total=f"{schedules:,}", unit="schedules"))
            ctrl_c(terminal)
        code, stdout = terminal.finish()

    assert code == 130, terminal.screen
    assert "stopped by SIGINT: nothing written" in terminal.screen
    assert stdout == ""
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


class StopAfter(Progress):
    """Stops the work once `batches` batches have committed; keeps what each one did."""

    def __init__(self, batches: int) -> None:
        self.batches = batches
        self.committed: list[int] = []

    def advance(self, done: int) -> None:
        self.committed.append(done)

    def checkpoint(self) -> None:
        if len(self.committed) >= self.batches:
            raise Stopped


def test_work_on_a_selection_stopped_between_batches_keeps_and_audits_what_committed(db_url, conn):
    insert_runs(conn, 1000, status="dead", attempts=1, max_attempts=1)
    stop = StopAfter(3)

    with pytest.raises(Stopped):
        incident.apply(
            conn,
            incident.action("retry"),
            Selection(statuses=("dead",)),
            actor="tests",
            reason=None,
            batch_size=100,
            progress=stop,
        )

    assert stop.committed == [100, 100, 100]
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 300
    assert audited(db_url, "retry") == 300
