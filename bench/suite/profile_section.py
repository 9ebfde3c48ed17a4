"""The profile section: where one tick's time goes, per run.

One `jobrunner tick` with the best flags drains `profile_n` no-op runs twice, each time
on a freshly loaded and analyzed database:

- plain, timed: wall time, the tick's CPU (every thread) and the server's (the
  postmaster's children: backends, WAL writer, autovacuum);
- under `py-spy record --gil`, which samples whichever thread holds the interpreter
  lock; each sample is put under what its stack shows the tick doing (CATEGORIES).
  py-spy slows the tick down, so these rows are read as shares of the lock's time.

The report divides the machine's cores by the CPU a run costs: the most runs a second
this machine could give, whatever the code does with its cores.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.suite.common import MEASUREMENT_ERRORS, first_line, log
from bench.suite.envs import pip_env
from bench.suite.procs import Command
from bench.suite.results import Row
from bench.suite.systems import System

PY_SPY = "py-spy==0.4.3"
RATE = 500  # samples a second
PROFILED = "best"  # the flag set profiled: jobrunner's fastest for one process

WALL, TICK_CPU, SERVER_CPU = "wall time", "tick CPU, all threads", "server CPU"
GIL = "Python holding the interpreter lock"
START_UP = "start-up, and the steps before and after the drain"
REST = "the drain loop, and the rest"

# What a sampled stack was doing: the first category with a mark found in the stack's
# frames ("function (file:line)", outermost first). A main-thread stack (from the
# script's <module>) outside the drain that none claims is START_UP; anything else left,
# stacks py-spy could not read whole among them, is REST.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decoding the claimed rows", ("_claimed_runs",)),
    ("the claim: parameters, send, receive", ("runs_claim_many", "runs_finalize_and_claim_many")),
    ("writing outcomes: parameters, send, receive", ("runs_finalize_many",)),
    ("calling the handler", ("(cronjob/tick/execute.py",)),
    (
        "handing runs to the worker thread and back",
        ("(cronjob/tick/pool.py", "(cronjob/tick/workers.py"),
    ),
    (
        "deciding and recording outcomes",
        ("(cronjob/transitions.py", "(cronjob/tick/tally.py", "Drain._record"),
    ),
)
ORDER = [WALL, TICK_CPU, SERVER_CPU, GIL, START_UP, *(c for c, _ in CATEGORIES), REST]


def category(stack: str) -> str:
    for name, marks in CATEGORIES:
        if any(mark in stack for mark in marks):
            return name
    if stack.startswith("<module>") and "Drain.run" not in stack:
        return START_UP
    return REST


def gil_per_run(raw: str, rate: float, runs: int) -> dict[str, float]:
    """Microseconds of lock-holding time per run, by category, from py-spy's raw output
    (one "frame;frame;... count" line per distinct stack)."""
    samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples[category(stack)] += int(count)
    per_sample = 1e6 / rate / runs
    out = {name: samples[name] * per_sample for name in ORDER if name in samples}
    out[GIL] = sum(samples.values()) * per_sample
    return out


class ProfileSection:
    """A part of Bench: its state (rows, options, cluster, systems) is Bench's own."""

    rows: list[Row]
    opts: Any
    ctx: Any
    cluster: Any
    skipped: dict[str, str]

    def profile(self) -> None:
        s = self.system("jobrunner")
        if s is None:
            why = self.skipped.get("jobrunner", "not selected")
            self.rows.append(
                Row("profile", "jobrunner", "jobrunner", "-", "us/run", status=f"not run: {why}")
            )
            return
        n = self.opts.profile_n
        from bench.suite.systems.jobrunner import FLAG_SETS

        meta = {"flags": " ".join(FLAG_SETS[PROFILED]), "n": n, "rate": RATE, "py-spy": PY_SPY}
        try:
            figures = self._plain(s, n)
            py_spy = pip_env(self.ctx.envs_dir, "py-spy", [PY_SPY], self.ctx.reinstall)
            figures.update(self._sampled(s, n, py_spy / "bin" / "py-spy"))
        except MEASUREMENT_ERRORS as exc:
            log(f"profile: FAILED\n{exc}")
            self.rows.append(
                Row("profile", s.name, s.label, "-", "us/run", status=f"failed: {first_line(exc)}")
            )
            return
        for what in (w for w in ORDER if w in figures):
            value = [round(figures[what], 2)]
            self.rows.append(Row("profile", s.name, s.label, what, "us/run", value, settings=meta))
        log("profile: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))

    def _loaded(self, s: System, n: int, tag: str) -> tuple[str, str]:
        from bench.suite.sections import steady_state

        name, url = self.fresh_db(s, "profile", tag)
        s.enqueue(url, n)
        steady_state(url)
        self.cluster.checkpoint()
        return name, url

    def _tick(self, s: System, url: str) -> Command:
        from bench.suite.systems.jobrunner import FLAG_SETS

        return s.tick(url, [*FLAG_SETS[PROFILED], "--log-level", "warning"])

    def _plain(self, s: System, n: int) -> dict[str, float]:
        name, url = self._loaded(s, n, "plain")
        try:
            cmd = self._tick(s, url)
            server, client, started = self.cluster.cpu_seconds(), os.times(), time.monotonic()
            _run(cmd.argv, cmd, self.drain_timeout(n))
            wall = time.monotonic() - started
            after = os.times()
            server = self.cluster.cpu_seconds() - server
            _require_drained(s, url)
        finally:
            self.cluster.dropdb(name)
        tick = after.children_user + after.children_system
        tick -= client.children_user + client.children_system
        return {WALL: wall / n * 1e6, TICK_CPU: tick / n * 1e6, SERVER_CPU: server / n * 1e6}

    def _sampled(self, s: System, n: int, py_spy: Path) -> dict[str, float]:
        name, url = self._loaded(s, n, "sampled")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "raw.txt"
                cmd = self._tick(s, url)
                spy = [
                    str(py_spy),
                    "record",
                    "--format",
                    "raw",
                    "--gil",
                    "--rate",
                    str(RATE),
                    "--nonblocking",
                    "-o",
                    str(out),
                    "--",
                ]
                _run([*spy, *cmd.argv], cmd, 2 * self.drain_timeout(n))
                _require_drained(s, url)
                return gil_per_run(out.read_text(), RATE, n)
        finally:
            self.cluster.dropdb(name)


def _run(argv: list[str], cmd: Command, timeout: float) -> None:
    done = subprocess.run(
        argv, env=cmd.full_env(), cwd=cmd.cwd, timeout=timeout, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.decode()[-500:]}")


def _require_drained(s: System, url: str) -> None:
    if left := s.unfinished(url):
        raise RuntimeError(f"{left} runs still unfinished after the drain")
