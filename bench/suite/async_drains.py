"""The async section: `async def` handlers drained by real `jobrunner tick` processes.

Every case gets a fresh database, its runs enqueued with `jobrunner enqueue --jsonl -`
(not timed) and the table analyzed, then one tick with `--handlers bench.async_handlers`
is timed from start to exit with the queue empty. All cases load the same handler
module and run at the tick's default log level, output to a file. Repetitions go
round-robin over the cases so that load from elsewhere hits all of them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.suite.procs import CommandFailed, run_checked
from bench.suite.results import Row
from bench.suite.systems.base import System

if TYPE_CHECKING:
    from bench.suite.sections import Bench

HANDLERS = "bench.async_handlers"
MAX_RUNTIME = "600s"
SLEEP_RUNS = 2_000
# At 4 threads 100 ms sleeps drain at 40 runs/s: 2,000 would take 50 s a repetition
# for a figure that is flat after a few seconds.
DEFAULT_THREADS_RUNS = 200

SUCCEEDED = "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FROM job_runs"


@dataclass(frozen=True)
class Case:
    name: str
    job_type: str
    flags: tuple[str, ...]
    runs: int | None  # None: --n
    short: str  # how a ratio names this case
    compare: tuple[str, ...] = ()  # cases whose jobs/s this one's is divided by
    target_seconds: float | None = None
    note: str = ""

    def n(self, bench: Bench) -> int:
        return self.runs if self.runs is not None else bench.opts.n


ASYNC_SLEEP_1 = "async sleep(1), --async-concurrency 200"
SYNC_SLEEP_256 = "sync sleep(0.1), --concurrency 256"
SYNC_SLEEP_4 = "sync sleep(0.1), --concurrency 4 (default)"
ASYNC_SLEEP_01 = "async sleep(0.1), --async-concurrency 200"
SYNC_NOOP = "sync no-op, default flags"
ASYNC_NOOP = "async no-op, default flags"

CASES: tuple[Case, ...] = (
    Case(
        ASYNC_SLEEP_1,
        "async_sleep_1",
        ("--async-concurrency", "200"),
        SLEEP_RUNS,
        "async 1 s",
        target_seconds=15.0,
    ),
    Case(SYNC_SLEEP_256, "sleep_0_1", ("--concurrency", "256"), SLEEP_RUNS, "256 threads"),
    Case(
        SYNC_SLEEP_4,
        "sleep_0_1",
        (),
        DEFAULT_THREADS_RUNS,
        "4 threads",
        note=f"capped at {DEFAULT_THREADS_RUNS} runs",
    ),
    Case(
        ASYNC_SLEEP_01,
        "async_sleep_0_1",
        ("--async-concurrency", "200"),
        SLEEP_RUNS,
        "async",
        compare=(SYNC_SLEEP_256, SYNC_SLEEP_4),
    ),
    Case(SYNC_NOOP, "noop", (), None, "sync no-op"),
    Case(ASYNC_NOOP, "async_noop", (), None, "async no-op", compare=(SYNC_NOOP,)),
)


def jsonl(job_type: str, n: int) -> bytes:
    return f'{{"type":"{job_type}","payload":{{}}}}\n'.encode() * n


def drain_once(bench: Bench, s: System, case: Case, tag: str) -> float:
    """Seconds from starting one tick until it exits, every run succeeded."""
    from bench.suite.systems.jobrunner import JobrunnerSystem

    assert isinstance(s, JobrunnerSystem)
    n = case.n(bench)
    name, url = bench.fresh_db(s, "async", case.job_type, tag)
    try:
        enqueue = s.command(url, "enqueue", "--jsonl", "-", stdin=jsonl(case.job_type, n))
        run_checked(enqueue, 900, bench.ctx.logdir, "jobrunner-async-enqueue")
        with s.connect(url) as conn:
            conn.execute("ANALYZE job_runs")
        bench.cluster.checkpoint()
        tick = s.command(
            url, "tick", "--handlers", HANDLERS, "--max-runtime", MAX_RUNTIME, *case.flags
        )
        tag = f"jobrunner-async-{case.job_type}-{'_'.join(case.flags) or 'default'}"
        result = run_checked(tick, bench.drain_timeout(n), bench.ctx.logdir, tag)
        with s.connect(url) as conn:
            row = conn.execute(SUCCEEDED).fetchone()
        succeeded, total = (row[0], row[1]) if row else (0, 0)
        if (succeeded, total) != (n, n):
            raise CommandFailed(f"{case.name}: {succeeded} of {total} runs succeeded, expected {n}")
        return result.seconds
    finally:
        bench.cluster.dropdb(name)


def rows_for(bench: Bench) -> dict[str, Row]:
    return {
        c.name: Row(
            "async",
            "jobrunner",
            "jobrunner",
            c.name,
            "seconds",
            settings={"flags": " ".join(c.flags) or "(none)", "handlers": HANDLERS},
            extra={
                "n": c.n(bench),
                "job_type": c.job_type,
                "short": c.short,
                "compare": list(c.compare),
                "target_seconds": c.target_seconds,
                "note": c.note,
            },
        )
        for c in CASES
    }


def measure(bench: Bench, s: System, errors: tuple[type[BaseException], ...]) -> list[Row]:
    """Every case, `bench.opts.reps` times, round-robin; a case that fails stops there."""
    from bench.suite.sections import first_line, log

    rows = rows_for(bench)
    for rep in range(bench.opts.reps):
        for case in CASES:
            row = rows[case.name]
            if row.status != "ok":
                continue
            try:
                seconds = drain_once(bench, s, case, f"r{rep}")
            except errors as exc:
                row.status = f"failed: {first_line(exc)}"
                log(f"async {case.name}: FAILED\n{exc}")
                continue
            row.samples.append(seconds)
            n = case.n(bench)
            log(
                f"async {case.name} rep {rep + 1}/{bench.opts.reps}: "
                f"{seconds:.2f}s, {n / seconds:,.0f} jobs/s"
            )
    return list(rows.values())
