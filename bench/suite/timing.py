"""Timing one short command many times: hyperfine when installed, else a plain loop."""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.suite.procs import Command, CommandFailed

WARMUP = 2
PER_RUN_TIMEOUT = 120


@dataclass(frozen=True)
class Timings:
    times: list[float]  # seconds, one per run
    tool: str

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0


def hyperfine_version() -> str | None:
    exe = shutil.which("hyperfine")
    if not exe:
        return None
    out = subprocess.run(
        [exe, "--version"], check=False, capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip().removeprefix("hyperfine ") or None


def time_command(cmd: Command, runs: int, warmup: int = WARMUP) -> Timings:
    exe = shutil.which("hyperfine")
    if exe:
        return _hyperfine(exe, cmd, runs, warmup)
    return _loop(cmd, runs, warmup)


def _hyperfine(exe: str, cmd: Command, runs: int, warmup: int) -> Timings:
    with tempfile.NamedTemporaryFile(suffix=".json") as export:
        proc = subprocess.run(
            [
                exe,
                "--shell=none",
                "--warmup",
                str(warmup),
                "--runs",
                str(runs),
                "--style",
                "none",
                "--export-json",
                export.name,
                shlex.join(cmd.argv),
            ],
            env=cmd.full_env(),
            cwd=cmd.cwd,
            check=False,
            capture_output=True,
            text=True,
            timeout=PER_RUN_TIMEOUT * (runs + warmup),
        )
        if proc.returncode != 0:
            raise CommandFailed(f"hyperfine: {proc.stderr.strip()[-600:]}")
        result = json.loads(Path(export.name).read_text())["results"][0]
    return Timings([float(t) for t in result["times"]], "hyperfine")


def _loop(cmd: Command, runs: int, warmup: int) -> Timings:
    times: list[float] = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        proc = subprocess.run(
            cmd.argv,
            check=False,
            env=cmd.full_env(),
            cwd=cmd.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=PER_RUN_TIMEOUT,
        )
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise CommandFailed(f"exit {proc.returncode}: {proc.stderr.decode()[-600:]}")
        if i >= warmup:
            times.append(elapsed)
    return Timings(times, "subprocess loop")
