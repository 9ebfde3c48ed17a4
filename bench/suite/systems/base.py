"""What every benchmarked system provides.

A system is one job queue (a peer, the raw-SQL ceiling, or jobrunner itself).
The harness only ever calls these methods, in this order:

    unavailable() -> None or a reason it cannot run here
    install()                      once per run (venvs, npm prefix)
    versions()                     for RESULTS.md
    setup(dburl)                   schema into a fresh database (used as a template)
    enqueue(dburl, n)              n no-op jobs, not timed
                                   (then VACUUM ANALYZE unless the variant is cold)
    drain(dburl, variant, timeout) timed: until every job is finished
    unfinished(dburl)              jobs not yet finished, to verify a drain
    idle_command(dburl)            one one-shot invocation that finds nothing to do
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.suite.pgcluster import Cluster
from bench.suite.procs import Command, CommandFailed, run_together, tail


@dataclass(frozen=True)
class Context:
    cluster: Cluster
    bench_dir: Path
    repo_dir: Path
    envs_dir: Path
    logdir: Path
    reinstall: bool = False

    @property
    def peers_dir(self) -> Path:
        return self.bench_dir / "peers"


# Every worker logs at this level unless its variant says otherwise: the peers'
# WARNING, and jobrunner's `--log-level warning`, its equivalent.
LOG_LEVEL = "warning"


@dataclass(frozen=True)
class Variant:
    """One way of running a system's workers: a name, the settings a reader
    needs to reproduce it, and how many worker processes run side by side."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    processes: int = 1
    log_level: str = LOG_LEVEL
    # VACUUM ANALYZE after enqueueing, as autovacuum would have done by the time a
    # queue is in its steady state. False: the drain starts on never-analyzed tables.
    analyze: bool = True
    # An extra row (cold tables, another log level, a reduced client), with the reason:
    # shown, but never a baseline or a target's figure.
    extra: str = ""
    # Drain at most this many jobs (None: --n). For variants slow enough that a
    # full --n drain would push a full run past its time budget; their jobs/s is
    # already flat at this size. Lifted by --no-cap.
    max_n: int | None = None


PROCESS_COUNTS = (1, 2)


def side_by_side(variants: tuple[Variant, ...]) -> tuple[Variant, ...]:
    """Each variant with 1 and with 2 worker processes on the one queue ("tuned x2"):
    the report compares systems at equal process counts."""
    return tuple(
        dataclasses.replace(v, name=v.name if procs == 1 else f"{v.name} x{procs}", processes=procs)
        for v in variants
        for procs in PROCESS_COUNTS
    )


def base_name(variant: str) -> str:
    """The variant's name without its process count: "tuned x2" -> "tuned"."""
    head, _, count = variant.rpartition(" x")
    return head if head and count.isdigit() else variant


@dataclass(frozen=True)
class Drain:
    seconds: float
    peak_rss_kb: int  # largest single worker process


class NotRun(Exception):
    """A measurement that could not be taken here; the message says why."""


class System(abc.ABC):
    name = ""  # key for --systems and results.json
    label = ""  # shown in tables
    kind = "peer"  # "peer" | "ceiling" | "subject"
    variants: tuple[Variant, ...] = ()
    how_run = ""  # one line for RESULTS.md: how its workers were started
    idle_how = ""  # one line: what the idle one-shot invocation is

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- lifecycle ------------------------------------------------------------------
    def unavailable(self) -> str | None:
        return None

    def install(self) -> None:
        return None

    def versions(self) -> dict[str, str]:
        return {}

    @abc.abstractmethod
    def setup(self, dburl: str) -> None: ...

    @abc.abstractmethod
    def enqueue(self, dburl: str, n: int) -> None: ...

    @abc.abstractmethod
    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]: ...

    def drain(self, dburl: str, variant: Variant, timeout: float) -> Drain:
        tag = f"{self.name}-{variant.name}-drain".replace(" ", "_")
        exits = run_together(self.drain_commands(dburl, variant), timeout, self.ctx.logdir, tag)
        for result in exits:
            if result.returncode != 0:
                raise CommandFailed(f"{tag}: worker exited {result.returncode}\n{tail(result.log)}")
        return Drain(max(e.seconds for e in exits), max(e.max_rss_kb for e in exits))

    @abc.abstractmethod
    def unfinished(self, dburl: str) -> int: ...

    def idle_command(self, dburl: str) -> Command | None:
        return None

    # -- helpers ---------------------------------------------------------------------
    @staticmethod
    @contextlib.contextmanager
    def connect(dburl: str) -> Iterator[psycopg.Connection]:
        with psycopg.connect(dburl, autocommit=True) as conn:
            yield conn

    def count(self, dburl: str, query: str) -> int:
        with self.connect(dburl) as conn:
            row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0
