"""Schedule benchmarks: hooks the harness calls, not yet implemented.

Each hook is a Hook(variant, metric, measure). `measure(bench, jobrunner)` gets
the running Bench (its cluster, options, fresh_db() and logdir) and the jobrunner
System (a JobrunnerSystem: .tick(url, flags), .command(url, *args)), and returns
one sample per repetition (bench.opts.reps) in the hook's metric, or raises
NotRun("why"). The harness turns the samples into a median and a report row; a
hook only runs when jobrunner itself is available.

To plug a measurement in, replace the body of a function below, e.g.:

    def materialize_due(bench, jobrunner):
        samples = []
        for rep in range(bench.opts.reps):
            name, url = bench.fresh_db(jobrunner, "sched", f"r{rep}")
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    ...  # DUE_DEFINITIONS definitions, all due now, of a job type
                         # no handler exists for, so the tick only materializes
                result = run_checked(jobrunner.tick(url, []), 600, bench.ctx.logdir, "sched")
                with psycopg.connect(url) as conn:
                    made = conn.execute("SELECT count(*) FROM job_runs").fetchone()[0]
                if made != DUE_DEFINITIONS:
                    raise RuntimeError(f"materialized {made} runs")
                samples.append(made / result.seconds)  # runs materialized per second
            finally:
                bench.cluster.dropdb(name)
        return samples

(run_checked is bench.suite.procs.run_checked; result.seconds is the wall time of
the tick process, start-up included, like every other process timing here.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.suite.systems.base import NotRun, System

if TYPE_CHECKING:
    from bench.suite.sections import Bench

DUE_DEFINITIONS = 10_000
TENANTS = 100_000


def materialize_due(bench: Bench, jobrunner: System) -> list[float]:
    """One tick materializing runs for DUE_DEFINITIONS global definitions that are all
    due (metric: runs materialized per second)."""
    raise NotRun("hook not implemented yet (bench/suite/schedules.py: materialize_due)")


def tenant_fanout(bench: Bench, jobrunner: System) -> list[float]:
    """One tenant-scoped definition firing over TENANTS tenants from --tenants-sql
    (metric: runs materialized per second)."""
    raise NotRun("hook not implemented yet (bench/suite/schedules.py: tenant_fanout)")


@dataclass(frozen=True)
class Hook:
    variant: str
    metric: str
    measure: Callable[[Bench, System], list[float]]


HOOKS: tuple[Hook, ...] = (
    Hook(f"materialize {DUE_DEFINITIONS:,} due definitions", "runs/s", materialize_due),
    Hook(f"1 tenant definition x {TENANTS:,} tenants", "runs/s", tenant_fanout),
)
