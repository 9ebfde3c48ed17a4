"""What every benchmarked system provides.

A system is one job queue (a peer, the raw-SQL ceiling, or jobrunner itself).
The harness only ever calls these methods, in this order:

    unavailable() -> None or a reason it cannot run here
    install()                      once per run (venvs, npm prefix)
    versions()                     for RESULTS.md
    setup(dburl)                   schema into a fresh database (used as a template)
    enqueue(dburl, n)              n no-op jobs, not timed
    drain(dburl, variant, timeout) timed: until every job is finished
    unfinished(dburl)              jobs not yet finished, to verify a drain
    idle_command(dburl)            one one-shot invocation that finds nothing to do
"""

from __future__ import annotations

import contextlib
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


@dataclass(frozen=True)
class Variant:
    """One way of running a system's workers: a name, the settings a reader
    needs to reproduce it, and how many worker processes run side by side."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    processes: int = 1
    # Drain at most this many jobs (None: --n). For variants slow enough that a
    # full --n drain would push a full run past its time budget; their jobs/s is
    # already flat at this size. Lifted by --no-cap.
    max_n: int | None = None


@dataclass(frozen=True)
class Drain:
    seconds: float
    peak_rss_kb: int  # largest single worker process


class NotRun(Exception):
    """A measurement that could not be taken here; the message says why."""


class System:
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
        pass

    def versions(self) -> dict[str, str]:
        return {}

    def setup(self, dburl: str) -> None:
        raise NotImplementedError

    def enqueue(self, dburl: str, n: int) -> None:
        raise NotImplementedError

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        raise NotImplementedError

    def drain(self, dburl: str, variant: Variant, timeout: float) -> Drain:
        tag = f"{self.name}-{variant.name}-drain".replace(" ", "_")
        exits = run_together(self.drain_commands(dburl, variant), timeout, self.ctx.logdir, tag)
        for result in exits:
            if result.returncode != 0:
                raise CommandFailed(f"{tag}: worker exited {result.returncode}\n{tail(result.log)}")
        return Drain(max(e.seconds for e in exits), max(e.max_rss_kb for e in exits))

    def unfinished(self, dburl: str) -> int:
        raise NotImplementedError

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
