"""The growth section: claim latency and drain throughput with a long history, against none."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.suite.common import MEASUREMENT_ERRORS, dbname, first_line, log
from bench.suite.results import Row
from bench.suite.statements import (
    CLAIM,
    CLAIM_PLAN_OPTIONS,
    ENQUEUE,
    FINISH,
    HISTORY,
    UNFINISHED,
)
from bench.suite.systems import System, Variant

CLAIM_BATCH = 100


class GrowthSection:
    """A part of Bench: its state (rows, options, cluster, systems) is Bench's own."""

    rows: list[Row]
    opts: Any
    cluster: Any
    skipped: dict[str, str]
    templates: dict[str, str]

    def growth(self) -> None:
        history = self.opts.history_rows
        hist_label = f"{history:,} finished"
        # (system, the drain variant used on both tables)
        for name, wanted in (("jobrunner", "default"), ("raw-sql", "psycopg core")):
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
