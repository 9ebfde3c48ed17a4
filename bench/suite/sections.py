"""The measurements. Each section appends Rows; nothing here formats output."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

import psycopg

from bench.suite.common import MEASUREMENT_ERRORS, dbname, first_line, log
from bench.suite.growth_section import GrowthSection
from bench.suite.pgcluster import Cluster
from bench.suite.procs import Command
from bench.suite.profile_section import ProfileSection
from bench.suite.results import Row
from bench.suite.side_sections import SideSections
from bench.suite.systems import Context, System, Variant
from bench.suite.timing import WARMUP, time_command

SECTIONS = ("drain", "idle", "profile", "growth", "enqueue", "rss", "schedules", "memory", "async")

FLOOR_CODE = "import sys, psycopg; psycopg.connect(sys.argv[1]).execute('select 1')"
FLOOR_HOW = "python -c 'import psycopg; psycopg.connect(URL).execute(\"select 1\")'"
IDLE_ROUND = 5  # idle runs of one command before moving on to the next


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
    profile_n: int = 100_000  # runs drained by the profiled tick (twice: plain, sampled)


def steady_state(url: str) -> None:
    """What autovacuum would have done to freshly loaded tables by the time a queue runs
    steadily: visibility map set, planner statistics that know the queued rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


class Bench(GrowthSection, ProfileSection, SideSections):
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
                        "log_level": v.log_level,
                        "analyzed": v.analyze,
                        "extra": v.extra,
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
            if v.analyze:
                steady_state(url)
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

    # -- running the sections ------------------------------------------------------------
    def run(self, sections: list[str]) -> None:
        for section in SECTIONS:
            if section in sections:
                log(f"== {section}")
                # `async` is a keyword: its method is `async_`.
                getattr(self, "async_" if section == "async" else section)()


__all__ = ["SECTIONS", "Bench", "Options", "log"]
