"""Tables on stdout, bench/RESULTS.md and bench/results.json from a finished Bench."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.suite import profile_section, ratios
from bench.suite.procs import GNU_TIME
from bench.suite.results import Row, find
from bench.suite.sections import IDLE_ROUND
from bench.suite.systems import REGISTRY, System, Variant
from bench.suite.timing import WARMUP, hyperfine_version

Table = tuple[list[str], list[list[str]]]
KINDS = {cls.name: cls.kind for cls in REGISTRY}  # peer, ceiling or subject


# -- facts about the run ---------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _git_commit(repo: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def load_average() -> str:
    """1/5/15-minute load: other work on a shared machine shows up here."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine(repo: Path) -> dict[str, str]:
    node = shutil.which("node")
    node_version = ""
    if node:
        out = subprocess.run(
            [node, "--version"], check=False, capture_output=True, text=True, timeout=30
        )
        node_version = out.stdout.strip().lstrip("v")
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": _memory(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "node": node_version or "not installed",
        "hyperfine": hyperfine_version() or "not installed (subprocess loop used)",
        "repository commit": _git_commit(repo),
    }


@dataclass
class Report:
    command: str
    date: str
    machine: dict[str, str]
    server: dict[str, str]
    options: dict[str, Any]
    sections: list[str]
    systems: list[System]
    versions: dict[str, dict[str, str]]
    skipped: dict[str, str]
    rows: list[Row] = field(default_factory=list)


# -- formatting --------------------------------------------------------------------------
def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def _median_or_status(row: Row, digits: int = 0) -> str:
    return _num(row.median, digits) if row.ok else row.status


def _range(row: Row, digits: int = 0) -> str:
    if not row.ok or len(row.samples) < 2:
        return "-"
    return f"{_num(min(row.samples), digits)}-{_num(max(row.samples), digits)}"


def _settings(settings: dict[str, Any]) -> str:
    return (
        ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in settings.items())
        or "-"
    )


def _section(rows: list[Row], section: str, order: list[System] | None = None) -> list[Row]:
    """The section's rows; with `order`, the floor first and then in registry order."""
    picked = [r for r in rows if r.section == section]
    if order:
        rank = {s.name: i for i, s in enumerate(order)}
        picked.sort(key=lambda r: -1 if r.system == "floor" else rank.get(r.system, len(rank)))
    return picked


def _median(row: Row | None) -> float | None:
    return row.median if row is not None and row.ok else None


# -- tables ------------------------------------------------------------------------------
def drain_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "drain", report.systems)
    kinds = KINDS
    top = ratios.ceiling(rows)
    headers = [
        "system",
        "variant",
        "procs",
        "N",
        "median jobs/s",
        "range",
        "reps",
        "vs graphile-worker tuned (same procs)",
        "vs best peer default (same procs)",
        "vs pgbench two-commit ceiling",
    ]
    body = []
    best_by_procs: dict[int, str] = {}
    for r in rows:
        procs = ratios.worker_processes(r, kinds)
        graphile = ratios.graphile_tuned(rows, procs) if procs else None
        peer = ratios.best_peer_default(rows, kinds, procs) if procs else None
        if procs and peer is not None:
            best_by_procs[procs] = peer.label
        body.append(
            [
                r.label,
                r.variant + (" *" if r.extra.get("extra") else ""),
                _procs(r, kinds),
                _num(r.extra.get("n")),
                _median_or_status(r),
                _range(r),
                str(len(r.samples)),
                _fraction(ratios.ratio(r, graphile)),
                _fraction(ratios.ratio(r, peer)),
                _fraction(ratios.ratio(r, top)),
            ]
        )
    best = ", ".join(f"{label} ({procs})" for procs, label in sorted(best_by_procs.items()))
    extras = "; ".join(
        f"{r.label} {r.variant}: {r.extra['extra']}" for r in rows if r.extra.get("extra")
    )
    legend = (
        f"N no-op jobs per drain (--n {report.options['n']:,}; variants too slow for that "
        "within the run's time budget drain fewer, shown in column N), enqueued before "
        "timing, then VACUUM ANALYZE; time = from starting the worker process(es) until the "
        "last one exits with the queue empty (start-up and shutdown included). Every "
        "worker logs at warning. Ratios divide the median jobs/s by the baseline's, "
        "measured with the same number of worker processes (procs): above 1.00x is faster. "
        f"Best peer default by procs: {best or '-'}. Rows marked * are extra rows, never "
        f"a baseline nor a target's figure: {extras or '-'}."
    )
    return (headers, body), legend


def _procs(row: Row, kinds: dict[str, str]) -> str:
    """Worker processes; for the ceiling, its clients (pgbench's are threads)."""
    if kinds.get(row.system) == "ceiling" and "clients" in row.settings:
        return f"{row.settings['clients']} clients"
    return str(row.extra.get("processes", "-"))


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def targets_table(report: Report) -> tuple[Table, str]:
    kinds = KINDS
    headers = ["target", "rows divided", "ratio", "needed", "verdict"]
    body = [
        [
            t.goal,
            t.figure,
            _fraction(t.ratio),
            f"{'under' if t.below else 'at least'} {t.need:.2f}x",
            t.verdict,
        ]
        for t in ratios.targets(report.rows, kinds)
    ]
    legend = (
        "Issue 17's targets, each a ratio of two medians from this run (the drain and idle "
        "tables above). jobrunner's figure is its fastest drain row with the stated process "
        "count (its best flags or its defaults, whichever drained faster), extra rows "
        "excluded."
    )
    return (headers, body), legend


def idle_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "idle", report.systems)
    floor = _median(find(rows, "idle", "floor", "one-shot"))
    headers = ["system", "command", "median ms", "mean ms", "stdev ms", "runs", "vs floor"]
    body = []
    for r in rows:
        body.append(
            [
                r.label,
                r.settings.get("command", "-"),
                _median_or_status(r, 1),
                _num(r.extra.get("mean_ms"), 1),
                _num(r.extra.get("stdev_ms"), 1),
                str(r.extra.get("runs", "-")),
                _ratio(_median(r), floor),
            ]
        )
    tool = next((r.extra["tool"] for r in rows if r.extra.get("tool")), "-")
    legend = (
        "One invocation of each system's exit-when-empty mode against a migrated, warm, "
        f"empty database ({tool}; {WARMUP} warm-up runs, then rounds of "
        f"{IDLE_ROUND} timed runs of each command in turn). vs floor = median / floor "
        "median: how many times the bare cost of starting Python and opening one "
        "connection."
    )
    return (headers, body), legend


def growth_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "growth", report.systems)
    history = report.options["history_rows"]
    hist = f"{history:,} finished"
    headers = ["system", "metric", "empty table", f"with {hist} runs", "history / empty"]
    body = []
    seen: set[tuple[str, str]] = set()
    for r in rows:
        if (r.system, r.metric) in seen:
            continue
        seen.add((r.system, r.metric))
        if r.variant == "-":
            body.append([r.label, r.metric, r.status, "-", "-"])
            continue
        empty = find(rows, "growth", r.system, "empty", r.metric)
        full = find(rows, "growth", r.system, hist, r.metric)
        digits = 2 if r.metric == "claim ms" else 0
        body.append(
            [
                r.label,
                r.metric,
                _median_or_status(empty, digits) if empty else "-",
                _median_or_status(full, digits) if full else "-",
                _ratio(_median(full), _median(empty)),
            ]
        )
    legend = (
        f"claim ms: median latency of jobrunner's claim statement (batch of 100) over "
        f"{report.options['claim_probes']} claims; jobs/s: drain of N jobs (raw-SQL: 2 "
        "clients; jobrunner: one `tick`, default flags). The history is inserted with "
        "one INSERT ... SELECT generate_series, then VACUUM ANALYZE."
    )
    return (headers, body), legend


def enqueue_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "enqueue", report.systems)
    copy = _median(find(rows, "enqueue", "raw-sql", "COPY from the same JSONL"))
    headers = ["system", "how", "runs", "median runs/s", "range", "vs raw COPY"]
    body = [
        [
            r.label,
            r.variant,
            _num(r.settings.get("runs")),
            _median_or_status(r),
            _range(r),
            _ratio(_median(r), copy),
        ]
        for r in rows
    ]
    legend = (
        'Bulk enqueue of one JSONL stream of `{"type":"noop","payload":{}}` lines, '
        "timed as the whole process (start-up included)."
    )
    return (headers, body), legend


def rss_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "rss", report.systems)
    headers = ["system", "variant", "N", "median peak RSS MiB", "range"]
    body = [
        [r.label, r.variant, _num(r.extra.get("n")), _median_or_status(r, 1), _range(r, 1)]
        for r in rows
    ]
    source = (
        "GNU time's %M for each worker process"
        if os.access(GNU_TIME, os.X_OK)
        else "wait4() of each worker process, which cannot read below the harness's own RSS"
    )
    legend = (
        f"Peak resident set size of the largest worker process while draining N jobs ({source})."
    )
    return (headers, body), legend


def schedules_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "schedules", report.systems)
    headers = ["system", "benchmark", "metric", "median", "range", "target"]
    body = [
        [r.label, r.variant, r.metric, _median_or_status(r, 2), _range(r, 2), "under 2 s"]
        for r in rows
    ]
    legend = (
        "Seconds of one materialize pass (bench/schedules.py, called from "
        "bench/suite/schedules.py), on a fresh database per repetition."
    )
    return (headers, body), legend


def memory_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "memory", report.systems)
    headers = ["system", "command", "metric", "median", "range"]
    body = [[r.label, r.variant, r.metric, _median_or_status(r, 1), _range(r, 1)] for r in rows]
    legend = (
        "Peak resident set size of one `jobrunner` process (bench/memory.py): bounded means "
        "the same whatever the size of the input or of the rows read."
    )
    return (headers, body), legend


def _jobs_per_second(row: Row | None) -> float | None:
    if row is None or not row.ok or not row.median:
        return None
    return row.extra["n"] / row.median


def _async_vs(row: Row, rows: list[Row]) -> str:
    """This case's jobs/s over each compared case's, e.g. `2.10x vs 4 threads`."""
    mine = _jobs_per_second(row)
    parts = []
    for name in row.extra.get("compare", []):
        base = next((r for r in rows if r.variant == name), None)
        short = base.extra.get("short", name) if base else name
        parts.append(f"{_ratio(mine, _jobs_per_second(base))} vs {short}")
    return "; ".join(parts) or "-"


def _async_target(row: Row) -> str:
    target = row.extra.get("target_seconds")
    if target is None:
        return "-"
    verdict = "-" if not row.ok else "pass" if row.median < target else "FAIL"
    return f"under {target:g} s: {verdict}"


def async_table(report: Report) -> tuple[Table, str]:
    rows = _section(report.rows, "async", report.systems)
    headers = ["handler, flags", "runs", "median s", "range s", "jobs/s", "ratio", "target"]
    body = [
        [
            r.variant,
            f"{r.extra['n']:,}" + (f" ({r.extra['note']})" if r.extra.get("note") else ""),
            _median_or_status(r, 2),
            _range(r, 2),
            _num(_jobs_per_second(r)),
            _async_vs(r, rows),
            _async_target(r),
        ]
        for r in rows
        if r.extra.get("n") is not None
    ] + [[r.variant, "-", r.status, "-", "-", "-", "-"] for r in rows if "n" not in r.extra]
    legend = (
        "One `jobrunner tick --handlers bench.async_handlers` process per drain "
        "(bench/suite/async_drains.py), timed from start to exit with every run succeeded; "
        "runs enqueued untimed, then ANALYZE and CHECKPOINT. Ratio: this row's jobs/s over the "
        "named row's (above 1.00x is faster)."
    )
    return (headers, body), legend


def profile_table(report: Report) -> tuple[Table, str]:
    rows = {r.variant: r for r in _section(report.rows, "profile") if r.ok}
    headers = ["what, per run", "us", "share of the lock's time"]
    gil = _median(rows.get(profile_section.GIL))
    body = []
    for what in profile_section.ORDER:
        if what not in rows:
            continue
        value = _median(rows[what])
        lock_time = what not in (
            profile_section.WALL,
            profile_section.TICK_CPU,
            profile_section.SERVER_CPU,
        )
        share = f"{value / gil:.0%}" if lock_time and gil and value is not None else "-"
        part = lock_time and what != profile_section.GIL
        body.append([f"· {what}" if part else what, _num(value, 1), share])
    not_run = [r.status for r in _section(report.rows, "profile") if not r.ok]
    if not_run:
        body.append(["-", not_run[0], "-"])
    return (headers, body), _profile_legend(report, rows)


def _profile_legend(report: Report, rows: dict[str, Row]) -> str:
    first = next(iter(rows.values()), None)
    n, flags = (first.settings.get(k) for k in ("n", "flags")) if first else (None, None)
    legend = (
        f"One `jobrunner tick {flags}` (the best flags), 1 process, draining {_num(n)} no-op "
        "runs on analyzed tables, twice. Wall time, the tick's CPU (all its threads) and the "
        "server's (backends, WAL writer, autovacuum) are from the plain drain, start-up "
        "included; the interpreter-lock rows from the second, under `py-spy record --gil "
        f"--rate {profile_section.RATE}`, each sample put under what its stack shows "
        "(bench/suite/profile_section.py). py-spy slows the tick, so read those as shares."
    )
    tick, server = (
        _median(rows.get(k)) for k in (profile_section.TICK_CPU, profile_section.SERVER_CPU)
    )
    cores = int(report.machine.get("cores") or 0)
    if not (tick and server and cores):
        return legend
    bound = ratios.machine_bound(cores, tick + server)
    legend += (
        f" Bound: {tick + server:.1f} us of CPU a run (start-up included) on {cores} cores "
        f"allows at most {bound:,.0f} runs/s with every core busy, at that cost a run."
    )
    for needed in ratios.needed_rates(report.rows):
        word = {1: "one-process", 2: "two-process"}.get(needed.processes, "")
        once = needed.once_running
        legend += f" The {word} target asks for {needed.overall:,.0f} runs/s over the timed drain"
        if once is None:
            legend += "."
        elif once == float("inf"):
            legend += "; start-up alone (the idle tick's time) takes longer than that allows."
        else:
            where = "above" if once > bound else "within"
            legend += f"; less the idle tick's time, {once:,.0f} runs/s once running"
            legend += f" ({where} the bound)."
    return legend


TABLES = {
    "drain": ("Drain throughput", drain_table),
    "idle": ("Idle one-shot", idle_table),
    "profile": ("Where a tick's time goes", profile_table),
    "growth": ("Growth: finished history vs empty table", growth_table),
    "enqueue": ("Bulk enqueue", enqueue_table),
    "rss": ("Peak RSS while draining", rss_table),
    "schedules": ("Schedules", schedules_table),
    "memory": ("Peak memory of enqueue --jsonl and list", memory_table),
    "async": ("Async handlers", async_table),
}


METHOD = """\
- Equal process counts: jobrunner, graphile-worker, PgQueuer and Procrastinate each
  drain with 1 and with 2 worker processes on the one queue (variants named `x2`), and
  each ratio divides by the baseline measured with the same number of processes.
- Steady state: after the jobs are enqueued (not timed) and before the timed drain,
  `VACUUM ANALYZE` runs on the system's database, as autovacuum would have done by the
  time a queue runs steadily; every system alike. One extra row, jobrunner `default, cold
  tables`, drains on never-analyzed tables. (A tick's claim still plans with bitmap and
  sequential scans off, queries.runs.RUNS_CLAIM_MANY_PLAN, whatever the statistics.)
- One log level: every worker logs at warning. graphile-worker through its preset's
  `logger` (it has no level setting), PgQueuer with `pgq run --log-level WARNING`,
  Procrastinate with `procrastinate --log-level warning`, jobrunner with
  `tick --log-level warning` (failed runs logged, succeeded ones not). One extra row,
  jobrunner `default, log info`, runs at jobrunner's default level, info.
- The ceiling is pgbench running the tick's own claim and finalize statements, read from
  cronjob.queries.runs at run time, 2 clients, batch 100, with the planner settings of the
  tick's claim: `pgbench two-commit` (claim, commit; finalize, commit) is the baseline of
  the ceiling ratio, `pgbench one-commit` (finalize the previous batch and claim the next
  in one transaction, as a busy tick does) is shown beside it. The psycopg client running
  the statements' core is an extra row, not the ceiling.
- Extra rows are never a baseline nor a target's figure."""


# -- renderers ---------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Table) -> str:
    headers, body = table
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def text_table(table: Table, max_width: int = 48) -> str:
    headers, body = table
    clipped = [
        [c if len(c) <= max_width else c[: max_width - 1] + "~" for c in row]
        for row in [headers, *body]
    ]
    widths = [max(len(row[i]) for row in clipped) for i in range(len(headers))]
    out = []
    for n, row in enumerate(clipped):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _tables(report: Report) -> list[tuple[str, Table, str]]:
    """(title, table, legend) of each section run, then the targets after the drain
    and idle tables they are read from."""
    out = []
    for key in report.sections:
        title, build = TABLES[key]
        out.append((title, *build(report)))
    if "drain" in report.sections or "idle" in report.sections:
        out.append(("Targets", *targets_table(report)))
    return out


def print_tables(report: Report) -> None:
    for title, table, _ in _tables(report):
        print(f"\n{title}\n{text_table(table)}")
    sys.stdout.flush()


def _variant(v: Variant) -> str:
    plural = "es" if v.processes > 1 else ""
    tables = "tables analyzed" if v.analyze else "tables never analyzed"
    extra = f"; extra row: {v.extra}" if v.extra else ""
    return (
        f"{_settings(v.settings)} ({v.processes} process{plural}; log level {v.log_level}; "
        f"{tables}{extra})"
    )


def _bullets(items: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in items)


def write_markdown(report: Report, path: Path) -> None:
    parts = [
        "# jobrunner benchmark results",
        "",
        (
            "Generated by `bench/run.py`; see bench/README.md for what each section measures. "
            "Absolute numbers depend on this machine and whatever else ran on it: read the "
            "ratios, which compare systems measured in the same run."
        ),
        "",
        f"- Command: `{report.command}`",
        f"- Date: {report.date}",
        f"- Options: {_settings(report.options)}",
        "",
        "## Method",
        "",
        METHOD,
        "",
        "## Machine",
        "",
        _bullets(report.machine.items()),
        "",
        "## PostgreSQL server",
        "",
        (
            "A throwaway cluster made by initdb for this run; every system gets its own "
            "freshly created database on it. Settings are initdb's defaults (durability "
            "untouched):"
        ),
        "",
        _bullets(report.server.items()),
        "",
        "## Systems",
        "",
    ]
    for s in report.systems:
        versions = report.versions.get(s.name, {})
        parts.append(f"### {s.label}")
        parts.append("")
        if s.name in report.skipped:
            parts.append(f"Not run: {report.skipped[s.name]}.")
            parts.append("")
            continue
        parts.append(
            _bullets(
                [
                    ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "-"),
                    ("how it was run", s.how_run),
                    ("idle one-shot", f"`{s.idle_how}`"),
                    *[(f"variant `{v.name}`", _variant(v)) for v in s.variants],
                ]
            )
        )
        parts.append("")
    for title, table, legend in _tables(report):
        parts += [f"## {title}", "", legend, "", markdown_table(table), ""]
    path.write_text("\n".join(parts))


def write_json(report: Report, path: Path) -> None:
    data = {
        "command": report.command,
        "date": report.date,
        "machine": report.machine,
        "server": report.server,
        "options": report.options,
        "sections": report.sections,
        "systems": {
            s.name: {
                "label": s.label,
                "kind": s.kind,
                "versions": report.versions.get(s.name, {}),
                "skipped": report.skipped.get(s.name),
                "how_run": s.how_run,
                "idle": s.idle_how,
                "variants": [
                    {
                        "name": v.name,
                        "settings": v.settings,
                        "processes": v.processes,
                        "log_level": v.log_level,
                        "analyze": v.analyze,
                        "extra": v.extra,
                    }
                    for v in s.variants
                ],
            }
            for s in report.systems
        },
        "rows": [r.to_json() for r in report.rows],
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
