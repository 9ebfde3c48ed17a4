"""Schedule benchmarks: materialization timed by bench/schedules.py, once per repetition.

Each hook gets the running Bench and the jobrunner System, makes a fresh database
per repetition, runs every materialization case of `bench.schedules` there, and
reports the seconds of one pass for its own case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.suite.systems.base import NotRun, System

if TYPE_CHECKING:
    from bench.suite.sections import Bench

_CASE_SECONDS: dict[int, dict[str, float]] = {}


def _case_seconds(bench: Bench, jobrunner: System, case_prefix: str) -> list[float]:
    try:
        from bench.schedules import run_schedule_benchmarks
    except ImportError as exc:
        raise NotRun(f"cannot import bench.schedules: {exc}") from None
    samples = []
    for rep in range(bench.opts.reps):
        if rep not in _CASE_SECONDS:
            name, url = bench.fresh_db(jobrunner, "sched", f"r{rep}")
            try:
                _CASE_SECONDS[rep] = run_schedule_benchmarks(url)
            finally:
                bench.cluster.dropdb(name)
        samples.append(next(v for k, v in _CASE_SECONDS[rep].items() if k.startswith(case_prefix)))
    return samples


def materialize_due(bench: Bench, jobrunner: System) -> list[float]:
    """Seconds of one materialize pass over 10,000 due global definitions (50 shared schedules)."""
    return _case_seconds(bench, jobrunner, "10,000 due definitions, 50 shared")


def materialize_distinct(bench: Bench, jobrunner: System) -> list[float]:
    """Seconds of one pass over 10,000 due definitions whose schedules all differ."""
    return _case_seconds(bench, jobrunner, "10,000 due definitions, all schedules distinct")


def tenant_fanout(bench: Bench, jobrunner: System) -> list[float]:
    """Seconds of one pass of a tenant-scoped definition over 100,000 tenants."""
    return _case_seconds(bench, jobrunner, "1 tenant-scoped definition")


@dataclass(frozen=True)
class Hook:
    variant: str
    metric: str
    measure: Callable[[Bench, System], list[float]]


HOOKS: tuple[Hook, ...] = (
    Hook("materialize 10,000 due definitions (50 shared schedules)", "seconds", materialize_due),
    Hook("materialize 10,000 due definitions (all distinct)", "seconds", materialize_distinct),
    Hook("1 tenant definition x 100,000 tenants", "seconds", tenant_fanout),
)
