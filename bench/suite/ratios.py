"""Which measured row each drain figure is divided by, and the targets of issue 17.

Pure functions of the rows: the report formats what they return. Like is compared
with like: a row is divided by the baseline run with the same number of worker
processes, and extra rows (cold tables, another log level, a reduced client) are
never a baseline nor a target's figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.suite.results import Row
from bench.suite.systems.base import base_name

CEILING = ("raw-sql", "pgbench two-commit")
GRAPHILE = "graphile-worker"
SUBJECT = "jobrunner"


def main_rows(rows: list[Row], section: str = "drain") -> list[Row]:
    """Measured rows of the section that are not extra rows."""
    return [r for r in rows if r.section == section and r.ok and not r.extra.get("extra")]


def _procs(row: Row) -> int | None:
    return row.extra.get("processes")


def graphile_tuned(rows: list[Row], processes: int) -> Row | None:
    """graphile-worker with its documented high-throughput preset, `processes` of it."""
    return next(
        (
            r
            for r in main_rows(rows)
            if r.system == GRAPHILE and base_name(r.variant) == "tuned" and _procs(r) == processes
        ),
        None,
    )


def best_peer_default(rows: list[Row], kinds: dict[str, str], processes: int) -> Row | None:
    """The fastest peer with stock settings, `processes` of it."""
    defaults = [
        r
        for r in main_rows(rows)
        if kinds.get(r.system) == "peer"
        and base_name(r.variant) == "default"
        and _procs(r) == processes
    ]
    return max(defaults, key=lambda r: r.median or 0.0, default=None)


def ceiling(rows: list[Row]) -> Row | None:
    """pgbench running the tick's claim, then its finalize: two commits per batch."""
    system, variant = CEILING
    return next((r for r in main_rows(rows) if (r.system, r.variant) == (system, variant)), None)


def ratio(row: Row | None, base: Row | None) -> float | None:
    if row is None or base is None or not row.ok or not base.ok or not base.median:
        return None
    return (row.median or 0.0) / base.median


def worker_processes(row: Row, kinds: dict[str, str]) -> int | None:
    """The process count a row is compared at; None for the ceiling's rows, whose
    clients are not worker processes."""
    return None if kinds.get(row.system) == "ceiling" else _procs(row)


def fastest_subject(rows: list[Row], processes: int | None = None) -> Row | None:
    """jobrunner's fastest main drain row (with `processes` processes, if given)."""
    mine = [
        r
        for r in main_rows(rows)
        if r.system == SUBJECT and (processes is None or _procs(r) == processes)
    ]
    return max(mine, key=lambda r: r.median or 0.0, default=None)


@dataclass(frozen=True)
class Target:
    goal: str  # what the issue asks, in words
    figure: str  # which rows were divided
    ratio: float | None
    need: float
    below: bool = False  # the ratio must stay under `need` (a time), not reach it

    @property
    def met(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio < self.need if self.below else self.ratio >= self.need

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return "not measured"
        if self.met:
            return "met"
        if self.below:
            return f"missed: {self.ratio / self.need - 1:.0%} over the limit"
        more = self.need / self.ratio - 1 if self.ratio else float("inf")
        return f"missed by {self.need - self.ratio:.2f}x (needs {more:.0%} more)"


def _label(row: Row | None) -> str:
    if row is None:
        return "-"
    procs = _procs(row)
    count = f", {procs} process{'es' if procs and procs > 1 else ''}" if procs else ""
    return f"{row.label} {row.variant}{count}"


def _versus(row: Row | None, base: Row | None) -> str:
    return f"{_label(row)} / {_label(base)}"


def targets(rows: list[Row], kinds: dict[str, str]) -> list[Target]:
    """Issue 17's targets, each from this run's medians."""
    out = []
    for procs, word in ((1, "one tick process"), (2, "two tick processes")):
        mine, theirs = fastest_subject(rows, procs), graphile_tuned(rows, procs)
        out.append(
            Target(
                f"{word} >= 1.5x graphile-worker tuned with {procs} process"
                + ("es" if procs > 1 else ""),
                _versus(mine, theirs),
                ratio(mine, theirs),
                1.5,
            )
        )
    best, top = fastest_subject(rows), ceiling(rows)
    out.append(
        Target(
            "jobrunner's best >= 40% of the pgbench two-commit ceiling (batch 100, 2 clients)",
            _versus(best, top),
            ratio(best, top),
            0.40,
        )
    )
    idle = [r for r in rows if r.section == "idle" and r.ok]
    tick = next((r for r in idle if r.system == SUBJECT), None)
    once = next((r for r in idle if r.system == GRAPHILE), None)
    out.append(
        Target(
            "idle tick below graphile-worker --once (median ms)",
            f"{tick.label if tick else '-'} / {once.label if once else '-'}",
            ratio(tick, once),
            1.0,
            below=True,
        )
    )
    default = next(
        (r for r in main_rows(rows) if r.system == SUBJECT and r.variant == "default"), None
    )
    peer = best_peer_default(rows, kinds, 1)
    out.append(
        Target(
            "default flags >= 2x the best peer's default (1 process each)",
            _versus(default, peer),
            ratio(default, peer),
            2.0,
        )
    )
    return out


def machine_bound(cores: int, cpu_per_run_us: float) -> float:
    """Runs a second with every core busy, when a run costs `cpu_per_run_us` of CPU in all:
    no tick can go faster on this machine without costing less."""
    return cores * 1e6 / cpu_per_run_us


@dataclass(frozen=True)
class Needed:
    """What a per-process drain target asks of jobrunner in runs a second."""

    processes: int
    overall: float  # over the whole timed drain, start-up included
    # After start-up: inf when start-up alone takes longer than the target allows; None
    # when not known (no idle figure, or no N).
    once_running: float | None


def needed_rates(rows: list[Row], need: float = 1.5) -> list[Needed]:
    """The rate each per-process target asks for: `need` times graphile-worker tuned's
    over the same N, and, less the idle tick's time (the least a tick's start-up and
    exit cost), what that leaves once the tick runs."""
    idle = next((r for r in rows if r.section == "idle" and r.system == SUBJECT and r.ok), None)
    out = []
    for procs in (1, 2):
        theirs = graphile_tuned(rows, procs)
        if theirs is None or not theirs.median:
            continue
        overall, n = need * theirs.median, theirs.extra.get("n") or 0
        once: float | None = None
        if idle is not None and idle.median is not None and n:
            left = n / overall - idle.median / 1000
            once = n / left if left > 0 else float("inf")
        out.append(Needed(procs, overall, once))
    return out
