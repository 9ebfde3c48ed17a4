"""jobrunner itself: `jobrunner migrate`, `enqueue --jsonl -`, `tick` until nothing is due.

Skipped, with the reason in the report, until the `cronjob` package is
importable and the `jobrunner` command exists for the harness's Python.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.suite.procs import Command, run_checked
from bench.suite.statements import UNFINISHED
from bench.suite.systems.base import LOG_LEVEL, PROCESS_COUNTS, System, Variant, base_name

HANDLERS = "bench.noop_handlers"
MAX_RUNTIME = "600s"

# `jobrunner tick` flag sets. Edit "best" as jobrunner's tuning settles; every
# flag set is run with 1 and with 2 tick processes side by side.
FLAG_SETS: dict[str, list[str]] = {
    "default": [],
    "best": ["--concurrency", "1", "--batch-size", "1000"],
}
COLD = "default, cold tables"
INFO = "default, log info"


def _variant(name: str, procs: int = 1, **kwargs: Any) -> Variant:
    flags = FLAG_SETS[name.split(",")[0]]
    return Variant(
        name if procs == 1 else f"{name} x{procs}",
        {"flags": " ".join(flags) or "(none)", "processes": procs},
        procs,
        **kwargs,
    )


VARIANTS = (
    *(_variant(name, procs) for name in FLAG_SETS for procs in PROCESS_COUNTS),
    _variant(COLD, analyze=False, extra="tables never analyzed: no VACUUM ANALYZE after loading"),
    _variant(INFO, log_level="info", extra="jobrunner's default log level, info"),
)


def jsonl(n: int) -> bytes:
    return b'{"type":"noop","payload":{}}\n' * n


def executable() -> str | None:
    beside = Path(sys.executable).parent / "jobrunner"
    return str(beside) if beside.exists() else shutil.which("jobrunner")


class JobrunnerSystem(System):
    name = "jobrunner"
    label = "jobrunner"
    kind = "subject"
    variants = VARIANTS
    how_run = (
        f"`jobrunner migrate`; `jobrunner enqueue --jsonl -`; "
        f"`jobrunner tick --handlers {HANDLERS} --max-runtime {MAX_RUNTIME} <flags> "
        f"--log-level {LOG_LEVEL}` (a tick exits when nothing is due); sync no-op handler; "
        f"log level {LOG_LEVEL} (succeeded runs write no line), the extra row "
        f"`{INFO}` at info (one line per run)"
    )
    idle_how = (
        f"jobrunner tick --handlers {HANDLERS} --max-runtime {MAX_RUNTIME} --log-level {LOG_LEVEL}"
    )

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("cronjob") is None:
            return "the cronjob package is not importable by this Python (pip install -e .)"
        exe = executable()
        if exe is None:
            return "the jobrunner command is not installed for this Python"
        probe = subprocess.run(
            [exe, "--help"], check=False, capture_output=True, text=True, timeout=60
        )
        if probe.returncode != 0:
            return f"`jobrunner --help` exited {probe.returncode}: {probe.stderr.strip()[-200:]}"
        return None

    def versions(self) -> dict[str, str]:
        try:
            version = importlib.metadata.version("pg-jobrunner")
        except importlib.metadata.PackageNotFoundError:
            version = "not installed (source tree)"
        return {"jobrunner": version}

    def command(self, dburl: str, *args: str, stdin: bytes | None = None) -> Command:
        exe = executable() or "jobrunner"
        return Command(
            [exe, *args],
            env={"JOBRUNNER_DATABASE_URL": dburl, "PYTHONPATH": str(self.ctx.repo_dir)},
            cwd=str(self.ctx.repo_dir),
            stdin=stdin,
        )

    def tick(self, dburl: str, flags: list[str]) -> Command:
        return self.command(
            dburl, "tick", "--handlers", HANDLERS, "--max-runtime", MAX_RUNTIME, *flags
        )

    def setup(self, dburl: str) -> None:
        run_checked(self.command(dburl, "migrate"), 300, self.ctx.logdir, "jobrunner-migrate")

    def enqueue(self, dburl: str, n: int) -> None:
        cmd = self.command(dburl, "enqueue", "--jsonl", "-", stdin=jsonl(n))
        run_checked(cmd, 900, self.ctx.logdir, "jobrunner-enqueue")

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        flags = [*FLAG_SETS[base_name(variant.name).split(",")[0]]]
        flags += ["--log-level", variant.log_level]
        return [self.tick(dburl, flags) for _ in range(variant.processes)]

    def unfinished(self, dburl: str) -> int:
        return self.count(dburl, UNFINISHED)

    def idle_command(self, dburl: str) -> Command | None:
        return self.tick(dburl, [*FLAG_SETS["default"], "--log-level", LOG_LEVEL])
