"""The measurements. Each section appends Rows; nothing here formats output."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bench.suite import async_drains, schedules
from bench.suite.pgcluster import Cluster
from bench.suite.procs import Command, CommandFailed, run_checked
from bench.suite.results import Row
from bench.suite.statements import (
    CLAIM,
    CLAIM_PLAN_OPTIONS,
    ENQUEUE,
    FINISH,
    HISTORY,
    UNFINISHED,
)
from bench.suite.systems import Context, NotRun, System, Variant
from bench.suite.systems.jobrunner import JobrunnerSystem, jsonl
from bench.suite.timing import WARMUP, time_command

SECTIONS = ("drain", "idle", "growth", "enqueue", "rss", "schedules", "memory", "async")

FLOOR_CODE = "import sys, psycopg; psycopg.connect(sys.argv[1]).execute('select 1')"
FLOOR_HOW = "python -c 'import psycopg; psycopg.connect(URL).execute(\"select 1\")'"
IDLE_ROUND = 5  # idle runs of one command before moving on to the next
CLAIM_BATCH = 100

# What a failed measurement may raise; anything else is a bug in the harness.
MEASUREMENT_ERRORS = (
    CommandFailed,
    psycopg.Error,
    RuntimeError,
    OSError,
    subprocess.SubprocessError,
)


@dataclass(frozen=True)
class Options:
    n: int = 20_000
    reps: int = 3
    idle_runs: int = 10
    history_rows: int = 1_000_000
    enqueue_n: int = 100_000
    claim_probes: int = 50
    cap: bool = True  # honour Variant.max_n
    cap_scale: float = 1.0  # --quick shrinks the caps along with N
    memory_jsonl_mb: tuple[int, ...] = (10, 1000)  # --jsonl inputs whose peak RSS is measured
    memory_list_runs: int = 1000  # runs of 1 MB payloads that `list --limit` reads


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def dbname(*parts: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", "_".join(parts).lower())


class Bench:
    def __init__(self, ctx: Context, opts: Options, systems: list[System]) -> None:
        self.ctx = ctx
        self.opts = opts
        self.systems = systems
        self.rows: list[Row] = []
        self.skipped: dict[str, str] = {}  # system name -> why it is not measured
        self.versions: dict[str, dict[str, str]] = {}
        self.templates: dict[str, str] = {}

    @property
    def cluster(self) -> Cluster:
        return self.ctx.cluster

    def ready(self) -> list[System]:
        return [s for s in self.systems if s.name not in self.skipped]

    def system(self, name: str) -> System | None:
        return next((s for s in self.ready() if s.name == name), None)

    # -- preparation -------------------------------------------------------------------
    def prepare(self) -> None:
        """Install each system and build its template database (schema only)."""
        for s in self.systems:
            reason = s.unavailable()
            if reason:
                self.skipped[s.name] = reason
                log(f"{s.label}: not run: {reason}")
                continue
            try:
                log(f"{s.label}: installing")
                s.install()
                self.versions[s.name] = s.versions()
                template = dbname("tpl", s.name)
                url = self.cluster.createdb(template)
                s.setup(url)
                self.templates[s.name] = template
                log(f"{s.label}: ready {self.versions[s.name]}")
            except MEASUREMENT_ERRORS as exc:
                self.skipped[s.name] = f"setup failed: {first_line(exc)}"
                log(f"{s.label}: setup failed:\n{exc}")

    def fresh_db(self, s: System, *tag: str, template: str | None = None) -> tuple[str, str]:
        name = dbname("b", s.name, *tag)
        self.cluster.dropdb(name)
        big = template is not None
        url = self.cluster.createdb(name, template or self.templates[s.name], file_copy=big)
        return name, url

    def _not_run_rows(self, section: str, metric: str) -> None:
        for s in self.systems:
            if s.name in self.skipped:
                self.rows.append(
                    Row(
                        section,
                        s.name,
                        s.label,
                        "-",
                        metric,
                        status=f"not run: {self.skipped[s.name]}",
                    )
                )

    def drain_timeout(self, n: int) -> float:
        # Generous (a floor of 20 jobs/s): it only ends a worker that hangs.
        return 120 + n / 20

    # -- drain throughput --------------------------------------------------------------
    def jobs_for(self, v: Variant) -> int:
        if self.opts.cap and v.max_n is not None:
            return min(self.opts.n, max(1, int(v.max_n * self.opts.cap_scale)))
        return self.opts.n

    def drain(self) -> None:
        rows: dict[tuple[str, str], Row] = {}
        for s in self.ready():
            for v in s.variants:
                rows[s.name, v.name] = Row(
                    "drain",
                    s.name,
                    s.label,
                    v.name,
                    "jobs/s",
                    settings=dict(v.settings),
                    extra={
                        "processes": v.processes,
                        "n": self.jobs_for(v),
                        "seconds": [],
                        "peak_rss_kb": [],
                    },
                )
        self._not_run_rows("drain", "jobs/s")
        for rep in range(self.opts.reps):
            # Round-robin over systems so slow drifts on a shared machine hit all alike.
            for s in self.ready():
                for v in s.variants:
                    row = rows[s.name, v.name]
                    if row.status != "ok":
                        continue
                    n = row.extra["n"]
                    try:
                        seconds, rss_kb = self.drain_once(s, v, n, f"r{rep}")
                    except MEASUREMENT_ERRORS as exc:
                        row.status = f"failed: {first_line(exc)}"
                        log(f"drain {s.label} {v.name}: FAILED\n{exc}")
                        continue
                    row.samples.append(n / seconds)
                    row.extra["seconds"].append(round(seconds, 4))
                    row.extra["peak_rss_kb"].append(rss_kb)
                    log(
                        f"drain {s.label} {v.name} rep {rep + 1}/{self.opts.reps}: "
                        f"{n / seconds:,.0f} jobs/s ({seconds:.2f}s)"
                    )
        self.rows.extend(rows.values())

    def drain_once(
        self, s: System, v: Variant, n: int, tag: str, template: str | None = None
    ) -> tuple[float, int]:
        name, url = self.fresh_db(s, v.name, tag, template=template)
        try:
            before = s.unfinished(url)
            s.enqueue(url, n)
            queued = s.unfinished(url) - before
            if queued != n:
                raise RuntimeError(f"enqueue left {queued} unfinished jobs, expected {n}")
            self.cluster.checkpoint()
            result = s.drain(url, v, self.drain_timeout(n))
            left = s.unfinished(url)
            if left:
                raise RuntimeError(f"{left} of {n} jobs still unfinished after the drain")
            return result.seconds, result.peak_rss_kb
        finally:
            self.cluster.dropdb(name)

    # -- idle one-shot -----------------------------------------------------------------
    def idle(self) -> None:
        """Each system's exit-when-empty invocation against a warm, empty database.

        The runs go in rounds (a few of each command, then the next command) so a
        load change on a shared machine lands on every command alike.
        """
        floor_db = dbname("b", "idle_floor")
        self.cluster.dropdb(floor_db)
        floor_url = self.cluster.createdb(floor_db)
        subjects: list[tuple[Row, Command]] = [
            (
                Row(
                    "idle",
                    "floor",
                    "floor (python -c psycopg connect + select 1)",
                    "one-shot",
                    "ms",
                    settings={"command": FLOOR_HOW},
                ),
                Command([sys.executable, "-c", FLOOR_CODE, floor_url]),
            )
        ]
        dbs = [floor_db]
        for s in self.ready():
            row = Row("idle", s.name, s.label, "one-shot", "ms", settings={"command": s.idle_how})
            name, url = self.fresh_db(s, "idle")
            dbs.append(name)
            cmd = s.idle_command(url)
            if cmd is None:
                row.status = "not run: no exit-when-empty mode"
                self.rows.append(row)
                continue
            subjects.append((row, cmd))
        try:
            runs = self.opts.idle_runs
            rounds = -(-runs // IDLE_ROUND)
            for round_no in range(rounds):
                batch = min(IDLE_ROUND, runs - round_no * IDLE_ROUND)
                for row, cmd in subjects:
                    if row.status != "ok":
                        continue
                    try:
                        timings = time_command(cmd, batch, warmup=WARMUP if round_no == 0 else 0)
                    except MEASUREMENT_ERRORS as exc:
                        row.status = f"failed: {first_line(exc)}"
                        log(f"idle {row.label}: FAILED\n{exc}")
                        continue
                    row.samples += [t * 1000 for t in timings.times]
                    row.extra["tool"] = timings.tool
            for row, _ in subjects:
                if row.ok:
                    row.extra.update(
                        mean_ms=statistics.fmean(row.samples),
                        stdev_ms=statistics.pstdev(row.samples),
                        runs=len(row.samples),
                    )
                    log(f"idle {row.label}: median {row.median:.0f} ms over {len(row.samples)}")
                self.rows.append(row)
            self._not_run_rows("idle", "ms")
        finally:
            for name in dbs:
                self.cluster.dropdb(name)

    # -- growth: 1,000,000 finished rows vs an empty table -----------------------------
    def growth(self) -> None:
        history = self.opts.history_rows
        hist_label = f"{history:,} finished"
        # (system, the drain variant used on both tables)
        for name, wanted in (("jobrunner", "default"), ("raw-sql", "psycopg")):
            s = self.system(name)
            if s is None:
                why = self.skipped.get(name, "not selected")
                for metric in ("claim ms", "jobs/s"):
                    self.rows.append(
                        Row("growth", name, name, "-", metric, status=f"not run: {why}")
                    )
                continue
            variant = next(v for v in s.variants if v.name == wanted)
            self._growth_for(s, variant, history, hist_label)

    def _growth_for(self, s: System, variant: Variant, history: int, hist_label: str) -> None:
        rows = {
            (case, metric): Row(
                "growth",
                s.name,
                s.label,
                case,
                metric,
                settings={"drain": variant.name, "history_rows": history},
                extra={"processes": variant.processes},
            )
            for case in ("empty", hist_label)
            for metric in ("claim ms", "jobs/s")
        }
        template = dbname("tpl", s.name, "history")
        try:
            log(f"growth {s.label}: building a template with {history:,} finished runs")
            self.cluster.dropdb(template)
            url = self.cluster.createdb(template, self.templates[s.name])
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(HISTORY, [history])
                conn.execute("VACUUM ANALYZE job_runs")
        except MEASUREMENT_ERRORS as exc:
            for row in rows.values():
                row.status = f"failed: {first_line(exc)}"
            self.rows.extend(rows.values())
            return
        n = self.opts.n
        try:
            for rep in range(self.opts.reps):
                for case, tpl in (("empty", None), (hist_label, template)):
                    claim_row, drain_row = rows[case, "claim ms"], rows[case, "jobs/s"]
                    if drain_row.status != "ok":
                        continue
                    try:
                        latency = self._claim_latency(s, case, f"r{rep}", tpl)
                        claim_row.samples.append(latency)
                        seconds, _ = self.drain_once(s, variant, n, f"g{rep}", template=tpl)
                    except MEASUREMENT_ERRORS as exc:
                        claim_row.status = drain_row.status = f"failed: {first_line(exc)}"
                        log(f"growth {s.label} {case}: FAILED\n{exc}")
                        continue
                    drain_row.samples.append(n / seconds)
                    log(
                        f"growth {s.label} {case} rep {rep + 1}: claim {latency:.2f} ms, "
                        f"drain {n / seconds:,.0f} jobs/s"
                    )
        finally:
            self.cluster.dropdb(template)
        self.rows.extend(rows.values())

    def _claim_latency(self, s: System, case: str, tag: str, template: str | None) -> float:
        """Median time of jobrunner's claim statement (batch of 100) over the probes."""
        probes = self.opts.claim_probes
        name, url = self.fresh_db(s, "claim", case, tag, template=template)
        try:
            times: list[float] = []
            with psycopg.connect(url, autocommit=True, options=CLAIM_PLAN_OPTIONS) as conn:
                conn.execute(ENQUEUE, [probes * CLAIM_BATCH])
                # Fresh statistics in both cases, so the planner sees the queued rows the
                # way autovacuum would soon show them, not an empty (never analyzed) table.
                conn.execute("ANALYZE job_runs")
                params = {"types": ["noop"], "limit": CLAIM_BATCH, "worker": "probe"}
                for _ in range(probes):
                    start = time.perf_counter()
                    claimed = conn.execute(CLAIM, params).fetchall()
                    times.append((time.perf_counter() - start) * 1000)
                    conn.execute(
                        FINISH, {"ids": [r[0] for r in claimed], "tokens": [r[1] for r in claimed]}
                    )
                left = conn.execute(UNFINISHED).fetchone()
            if left and left[0]:
                raise RuntimeError(f"claim probes left {left[0]} runs unfinished")
            times.sort()
            return times[len(times) // 2]
        finally:
            self.cluster.dropdb(name)

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
                self.rows.append(Row("memory", "jobrunner", "jobrunner", "-", "MiB",
                                     status=f"failed: {first_line(exc)}"))  # fmt: skip
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

    def run(self, sections: list[str]) -> None:
        for section in SECTIONS:
            if section in sections:
                log(f"== {section}")
                # `async` is a keyword: its method is `async_`.
                getattr(self, "async_" if section == "async" else section)()


__all__ = ["SECTIONS", "Bench", "Options", "log"]
