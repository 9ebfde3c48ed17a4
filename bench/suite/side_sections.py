"""The sections beside the drains: bulk enqueue, peak RSS, schedules, memory, async handlers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from bench.suite import async_drains, schedules
from bench.suite.common import MEASUREMENT_ERRORS, first_line, log
from bench.suite.procs import Command, run_checked
from bench.suite.results import Row
from bench.suite.systems import NotRun, System
from bench.suite.systems.jobrunner import JobrunnerSystem, jsonl


class SideSections:
    """A part of Bench: its state (rows, options, cluster, systems) is Bench's own."""

    rows: list[Row]
    opts: Any
    cluster: Any
    ctx: Any
    skipped: dict[str, str]

    # -- enqueue --jsonl ---------------------------------------------------------------
    def enqueue(self) -> None:
        count = self.opts.enqueue_n
        data = jsonl(count)

        def jobrunner_cmd(s: System, url: str) -> Command:
            assert isinstance(s, JobrunnerSystem)
            return s.command(url, "enqueue", "--jsonl", "-", stdin=data)

        def copy_cmd(s: System, url: str) -> Command:
            return Command(
                [sys.executable, "-m", "bench.suite.copy_client", url],
                env={"PYTHONPATH": str(self.ctx.repo_dir)},
                cwd=str(self.ctx.repo_dir),
                stdin=data,
            )

        subjects: list[tuple[str, str, Callable[[System, str], Command]]] = [
            ("jobrunner", "enqueue --jsonl -", jobrunner_cmd),
            ("raw-sql", "COPY from the same JSONL", copy_cmd),
        ]
        for name, variant, make in subjects:
            s = self.system(name)
            row = Row(
                "enqueue", name, s.label if s else name, variant, "runs/s", settings={"runs": count}
            )
            self.rows.append(row)
            if s is None:
                row.status = f"not run: {self.skipped.get(name, 'not selected')}"
                continue
            for rep in range(self.opts.reps):
                db, url = self.fresh_db(s, "enqueue", f"r{rep}")
                try:
                    result = run_checked(
                        make(s, url), 60 + count / 100, self.ctx.logdir, f"{name}-enqueue-jsonl"
                    )
                    queued = s.unfinished(url)
                    if queued != count:
                        raise RuntimeError(f"{queued} runs queued, expected {count}")
                except MEASUREMENT_ERRORS as exc:
                    row.status = f"failed: {first_line(exc)}"
                    log(f"enqueue {name}: FAILED\n{exc}")
                    break
                finally:
                    self.cluster.dropdb(db)
                row.samples.append(count / result.seconds)
                log(f"enqueue {name} rep {rep + 1}: {count / result.seconds:,.0f} runs/s")

    # -- peak RSS ----------------------------------------------------------------------
    def rss(self) -> None:
        """Peak RSS of one worker process during the drains (needs the drain section)."""
        drains = [r for r in self.rows if r.section == "drain"]
        if not drains:
            self.rows.append(
                Row("rss", "-", "-", "-", "MiB", status="not run: needs the drain section")
            )
            return
        for d in drains:
            row = Row(
                "rss",
                d.system,
                d.label,
                d.variant,
                "MiB",
                status=d.status,
                settings=d.settings,
                extra={"n": d.extra.get("n")},
            )
            row.samples = [kb / 1024 for kb in d.extra.get("peak_rss_kb", [])]
            self.rows.append(row)

    # -- schedules ---------------------------------------------------------------------
    def schedules(self) -> None:
        s = self.system("jobrunner")
        for hook in schedules.HOOKS:
            row = Row("schedules", "jobrunner", "jobrunner", hook.variant, hook.metric)
            if s is None:
                row.status = f"not run: {self.skipped.get('jobrunner', 'not selected')}"
            else:
                try:
                    row.samples = hook.measure(self, s)
                except NotRun as exc:
                    row.status = f"not run: {exc}"
                except MEASUREMENT_ERRORS as exc:
                    row.status = f"failed: {first_line(exc)}"
            self.rows.append(row)

    # -- memory ------------------------------------------------------------------------
    def memory(self) -> None:
        """Peak RSS of `enqueue --jsonl` and `list` over inputs and rows of growing size."""
        s = self.system("jobrunner")
        if s is None:
            why = self.skipped.get("jobrunner", "not selected")
            self.rows.append(
                Row("memory", "jobrunner", "jobrunner", "-", "MiB", status=f"not run: {why}")
            )
            return
        from bench.memory import measure

        rows: dict[str, Row] = {}
        for rep in range(self.opts.reps):
            name, url = self.fresh_db(s, "memory", f"r{rep}")
            try:
                cases = measure(url, list(self.opts.memory_jsonl_mb), self.opts.memory_list_runs)
            except MEASUREMENT_ERRORS as exc:
                self.rows.append(
                    Row(
                        "memory",
                        "jobrunner",
                        "jobrunner",
                        "-",
                        "MiB",
                        status=f"failed: {first_line(exc)}",
                    )
                )
                log(f"memory: FAILED\n{exc}")
                return
            finally:
                self.cluster.dropdb(name)
            for case in cases:
                row = rows.setdefault(
                    case.name, Row("memory", "jobrunner", "jobrunner", case.name, "MiB")
                )
                row.samples.append(case.peak_mib)
        self.rows.extend(rows.values())

    # -- async handlers ----------------------------------------------------------------
    def async_(self) -> None:
        """`async def` handlers against plain ones, each drained by one real tick."""
        s = self.system("jobrunner")
        if s is None:
            why = self.skipped.get("jobrunner", "not selected")
            self.rows.append(
                Row("async", "jobrunner", "jobrunner", "-", "seconds", status=f"not run: {why}")
            )
            return
        self.rows.extend(async_drains.measure(self, s, MEASUREMENT_ERRORS))
