"""How soon a run starts after its enqueue commits: jobrunner's `tick --listen` side by side
with graphile-worker, Procrastinate and PgQueuer, in one run on one throwaway cluster.

    python bench/latency.py                 # about 6 minutes on 2 cores
    python bench/latency.py --quick         # fewer jobs, a 10 s idle measurement
    python bench/latency.py --only jobrunner,graphile-worker --no-write

Each system runs its own worker, listening as it does by default (jobrunner `tick --listen`,
graphile-worker with its defaults, Procrastinate's worker with listen_notify, PgQueuer's
`pgq run`), on a database of its own in one cluster that keeps initdb's durability settings
(bench/suite/pgcluster.py). An enqueuer process (bench/peers/latency/driver.py, in the
system's own Python, through its own client: jobrunner's `enqueue_async`, graphile-worker's
`add_job`, Procrastinate's `defer_async`, PgQueuer's `Queries.enqueue`) enqueues one job a
transaction at a steady rate, and notes when each enqueue returned, its commit done; the
worker's handler notes when it started (bench/latency_handlers.py and the peers' apps in
bench/peers/latency/). The latency of a job is the second minus the first, both from the one
machine's clock. Scenarios:

    10/s, 100/s, 1000/s   jobs one a transaction at that rate (over 1, 2 and 4 connections)
    burst 1000            1000 jobs in one transaction; each job from that commit
    delayed               jobs due 2 s after their enqueue: start minus the due time

Then (jobrunner alone) what a listening tick costs while it waits: the CPU of the tick's
process and of its server backend over --idle-seconds, and its connections; and
bench/notify.py's measure of what notifications cost 8 concurrent enqueuers.

It prints the tables and writes bench/LATENCY-RESULTS.md, bench/latency-results.json and the
table of docs/guides/starting-promptly.md between its `latency:begin` and `latency:end`
markers (--no-write: none).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.suite.pgcluster import Cluster, throwaway_cluster  # noqa: E402

PEERS = ROOT / "bench" / "peers" / "latency"
ENVS = ROOT / "bench" / ".envs"
SLEEPING = 29958816149106292  # a sleeping tick's advisory lock (migration 0027)

SCENARIOS: list[tuple[str, dict[str, Any]]] = [
    ("10/s", {"kind": "rate", "rate": 10, "count": 100, "connections": 1}),
    ("100/s", {"kind": "rate", "rate": 100, "count": 1000, "connections": 2}),
    ("1000/s", {"kind": "rate", "rate": 1000, "count": 3000, "connections": 4}),
    ("burst 1000", {"kind": "burst", "count": 1000}),
    ("delayed", {"kind": "rate", "rate": 20, "count": 100, "connections": 1, "delay": 2}),
]
QUICK = {"10/s": 30, "100/s": 300, "1000/s": 1000, "burst 1000": 1000, "delayed": 40}
WARM_UP = {"kind": "rate", "rate": 20, "count": 20, "connections": 1}
STARTED_TIMEOUT = 120.0  # seconds a scenario's jobs may take to start before they are missing


@dataclass
class System:
    """One system as this benchmark runs it."""

    name: str
    python: str  # the interpreter the enqueuer runs with
    client: str  # its client module in bench/peers/latency
    setup: Callable[[str], None]
    worker: Callable[[str, Path], tuple[list[str], dict[str, str], Path]]
    how: str
    env: dict[str, str] = field(default_factory=dict)

    def available(self) -> str | None:
        return None if Path(self.python).exists() else f"{self.python} is missing"


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> None:
    done = subprocess.run(
        argv,
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {done.stderr[-2000:] or done.stdout[-2000:]}")


def _jobrunner() -> System:
    def setup(url: str) -> None:
        import psycopg

        from cronjob import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv = [
            sys.executable,
            "-m",
            "cronjob",
            "tick",
            "--listen",
            "--max-runtime",
            "3600s",
            "--handlers",
            "bench.latency_handlers",
            "--log-level",
            "warning",
        ]
        env = {"JOBRUNNER_DATABASE_URL": url, "LATENCY_LOG": str(log), "PYTHONPATH": str(ROOT)}
        return argv, env, ROOT

    return System(
        "jobrunner",
        sys.executable,
        "latency_jobrunner",
        setup,
        worker,
        "`jobrunner tick --listen` (default flags: 4 handler threads), a plain `def` handler; "
        "enqueued with `enqueue_async`, a burst with `enqueue_many`",
        env={"PYTHONPATH": str(ROOT)},
    )


GRAPHILE_PRESET = """\
const {{ Logger, consoleLogFactory }} = require("graphile-worker");
const logger = new Logger((scope) => {{
  const log = consoleLogFactory(scope);
  return (level, message, meta) => {{
    if (level === "error" || level === "warning") log(level, message, meta);
  }};
}});
module.exports = {{ worker: {{ taskDirectory: {tasks}, logger }} }};
"""


def _graphile() -> System:
    prefix = ENVS / "graphile-worker"
    cli = prefix / "node_modules" / "graphile-worker" / "dist" / "cli.js"
    preset = prefix / "latency.config.js"

    def command(url: str, *args: str) -> list[str]:
        if not preset.exists():
            preset.write_text(GRAPHILE_PRESET.format(tasks=json.dumps(str(PEERS / "graphile"))))
        return ["node", str(cli), "--connection", url, "--config", str(preset), *args]

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        return command(url), {"LATENCY_LOG": str(log)}, prefix

    return System(
        "graphile-worker",
        sys.executable,
        "latency_graphile",
        lambda url: _run(command(url, "--schema-only"), {}, prefix),
        worker,
        "graphile-worker's defaults (one job at a time, LISTEN/NOTIFY), an async task; "
        "enqueued with graphile_worker.add_job, a burst with add_jobs",
    )


def _procrastinate() -> System:
    venv = ENVS / "procrastinate" / "bin"

    def cli(url: str, *args: str) -> tuple[list[str], dict[str, str]]:
        argv = [
            str(venv / "procrastinate"),
            "--log-level",
            "warning",
            "--app",
            "latency_procrastinate.app",
            *args,
        ]
        return argv, {"BENCH_DATABASE_URL": url, "PYTHONPATH": str(PEERS)}

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv, env = cli(url, "worker")
        return argv, {**env, "LATENCY_LOG": str(log)}, PEERS

    return System(
        "procrastinate",
        str(venv / "python"),
        "latency_procrastinate",
        lambda url: _run(*cli(url, "schema", "--apply"), PEERS),
        worker,
        "`procrastinate worker` with its defaults (concurrency 1, listen_notify), an async "
        "task; enqueued with `defer_async`, a burst with `batch_defer_async`",
    )


def _pgqueuer() -> System:
    venv = ENVS / "pgqueuer" / "bin"

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv = [str(venv / "pgq"), "run", "latency_pgqueuer:main", "--log-level", "WARNING"]
        env = {"BENCH_DATABASE_URL": url, "PGDSN": url, "LATENCY_LOG": str(log)}
        return argv, {**env, "PYTHONPATH": str(PEERS)}, PEERS

    return System(
        "pgqueuer",
        str(venv / "python"),
        "latency_pgqueuer",
        lambda url: _run([str(venv / "pgq"), "install"], {"PGDSN": url}, PEERS),
        worker,
        "`pgq run` with its defaults (asyncpg driver, LISTEN/NOTIFY), an async entrypoint; "
        "enqueued with `Queries.enqueue`, one job or a batch",
    )


SYSTEMS = {s.name: s for s in (_jobrunner(), _graphile(), _procrastinate(), _pgqueuer())}


# -- measuring --------------------------------------------------------------------------


class Starts:
    """The worker's log of starts, read as it grows: k -> start time."""

    def __init__(self, path: Path) -> None:
        self.path, self.seen, self._offset = path, {}, 0

    def read(self) -> dict[int, float]:
        if self.path.exists():
            with self.path.open() as log:
                log.seek(self._offset)
                chunk = log.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self._offset += len(complete)
            for line in complete.splitlines():
                k, started = line.split()
                self.seen[int(k)] = float(started)
        return self.seen

    def wait(self, ks: list[int], timeout: float, worker: subprocess.Popen[str]) -> None:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            if all(k in self.read() for k in ks):
                return
            if worker.poll() is not None:
                raise RuntimeError(f"the worker ended: {worker.stderr.read()[-2000:]}")
            time.sleep(0.05)


def _drive(system: System, url: str, scenario: dict[str, Any], work: Path) -> list[tuple]:
    """Enqueue `scenario` with the system's client; its jobs as (k, commit time, due time)."""
    out = work / "driven.txt"
    env = {**system.env, "BENCH_DATABASE_URL": url}
    argv = [system.python, str(PEERS / "driver.py"), system.client, json.dumps(scenario), str(out)]
    _run(argv, env, PEERS, timeout=600)
    rows = []
    for line in out.read_text().splitlines():
        k, committed, *due = line.split(" ")
        rows.append((int(k), float(committed), float(due[0]) if due and due[0] else None))
    return rows


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max, nearest rank, in milliseconds."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"p50": rank(0.5), "p95": rank(0.95), "p99": rank(0.99), "max": ordered[-1]}


@dataclass
class Running:
    """A system's worker, started on a database of its own, and what it has started."""

    system: System
    url: str
    worker: subprocess.Popen[str]
    starts: Starts
    samples: dict[str, list[float]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)


def start(cluster: Cluster, system: System, work: Path) -> Running:
    url = cluster.createdb(f"latency_{system.name.replace('-', '_')}")
    system.setup(url)
    log = work / f"{system.name}.starts"
    argv, env, cwd = system.worker(url, log)
    worker = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        cwd=cwd,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    running = Running(system, url, worker, Starts(log))
    warm = _drive(system, url, {**WARM_UP, "start_k": 1_000_000}, work)
    running.starts.wait([k for k, *_ in warm], STARTED_TIMEOUT, worker)
    return running


def scenario_once(running: Running, label: str, scenario: dict, start_k: int, work: Path) -> None:
    """One scenario on one system: its latencies join the system's samples of `label`."""
    jobs = _drive(running.system, running.url, {**scenario, "start_k": start_k}, work)
    running.starts.wait([k for k, *_ in jobs], STARTED_TIMEOUT, running.worker)
    seen = running.starts.read()
    running.samples.setdefault(label, []).extend(
        (seen[k] - (due if due is not None else committed)) * 1000
        for k, committed, due in jobs
        if k in seen
    )
    running.jobs[label] = running.jobs.get(label, 0) + len(jobs)
    running.missing[label] = running.missing.get(label, 0) + sum(k not in seen for k, *_ in jobs)


def stop(cluster: Cluster, running: Running) -> None:
    running.worker.send_signal(signal.SIGTERM)
    try:
        running.worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        running.worker.kill()
        running.worker.wait()
    cluster.dropdb(running.url.rsplit("/", 1)[1])


def measure(
    cluster: Cluster, systems: list[System], scenarios: list, work: Path, *, reps: int, idle: float
) -> dict[str, dict]:
    """Every scenario on every system, the systems taking turns scenario by scenario (each
    round led by the next), so that load from elsewhere on the machine hits all alike."""
    results: dict[str, dict] = {}
    started: list[Running] = []
    try:
        for system in systems:
            try:
                started.append(start(cluster, system, work))
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                results[system.name] = {"error": str(exc)[-500:]}
        next_k = 2_000_000
        for rep in range(reps):
            for label, scenario in scenarios:
                turn = started[rep % len(started) :] + started[: rep % len(started)]
                for running in turn:
                    next_k += 100_000
                    scenario_once(running, label, scenario, next_k, work)
                    print(
                        f"  {running.system.name:16} {label:11} {_row(_stats(running, label))}",
                        flush=True,
                    )
        for running in started:
            results[running.system.name] = {label: _stats(running, label) for label, _ in scenarios}
            if idle and running.system.name == "jobrunner":
                results["jobrunner"]["idle"] = _idle_cost(running.url, running.worker.pid, idle)
    finally:
        for running in started:
            stop(cluster, running)
    return results


def _stats(running: Running, label: str) -> dict[str, Any]:
    return {
        **percentiles(running.samples.get(label, [])),
        "jobs": running.jobs.get(label, 0),
        "missing": running.missing.get(label, 0),
    }


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cost(url: str, tick_pid: int, seconds: float) -> dict[str, Any]:
    """CPU of the listening tick and of its backend while nothing comes, and its sessions."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        backend = None
        until = time.monotonic() + 30
        while backend is None and time.monotonic() < until:
            row = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
                " AND ((classid::bigint << 32) | objid::bigint) = %s",
                [SLEEPING],
            ).fetchone()
            backend = row[0] if row else None
            time.sleep(0.1)
        time.sleep(1.0)  # past the linger of the last scenario
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobrunner'"
            " AND datname = current_database()"
        ).fetchone()[0]
        before = (_cpu_seconds(tick_pid), _cpu_seconds(backend) if backend else 0.0)
        time.sleep(seconds)
        after = (_cpu_seconds(tick_pid), _cpu_seconds(backend) if backend else 0.0)
    return {
        "seconds": seconds,
        "tick_cpu_percent": 100 * (after[0] - before[0]) / seconds,
        "backend_cpu_percent": 100 * (after[1] - before[1]) / seconds,
        "connections": sessions,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _row(stats: dict[str, Any]) -> str:
    missing = f", {stats['missing']} missing" if stats["missing"] else ""
    return (
        f"p50 {_ms(stats['p50'])}  p95 {_ms(stats['p95'])}  p99 {_ms(stats['p99'])}  "
        f"max {_ms(stats['max'])} ms ({stats['jobs']} jobs{missing})"
    )


# -- the report ---------------------------------------------------------------------------

README_BEGIN, README_END = "<!-- latency:begin -->", "<!-- latency:end -->"


def _targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Each target of issue 40, what was measured, and whether it is met (None: not run)."""
    ours = results["systems"].get("jobrunner", {})
    theirs = results["systems"].get("graphile-worker", {})
    rows: list[tuple[str, str, bool | None]] = []
    for label in ("10/s", "100/s", "1000/s", "burst 1000"):
        a, b = ours.get(label, {}).get("p50"), theirs.get(label, {}).get("p50")
        met = None if a is None or b is None else a <= b
        rows.append(
            (f"p50 at {label} at or below graphile-worker's", f"{_ms(a)} vs {_ms(b)} ms", met)
        )
    for label, what in (("100/s", "p99 at 100/s"), ("delayed", "delayed runs: start - run_at p99")):
        p99 = ours.get(label, {}).get("p99")
        rows.append((f"{what} <= 50 ms", f"{_ms(p99)} ms", None if p99 is None else p99 <= 50))
    idle = ours.get("idle")
    if idle:
        cpu = idle["tick_cpu_percent"] + idle["backend_cpu_percent"]
        rows.append(
            (
                "idle minute: under 1% of a core, one connection",
                f"{cpu:.2f}% ({idle['tick_cpu_percent']:.2f}% tick, "
                f"{idle['backend_cpu_percent']:.2f}% backend), {idle['connections']} "
                "connection(s)",
                cpu < 1 and idle["connections"] == 1,
            )
        )
    for case, r in (results.get("notify") or {}).items():
        if case in ("no tick", "a tick of other types", "a tick running them"):
            rows.append(
                (
                    f"8 enqueuers, {case}: >= 0.95x without NOTIFY",
                    f"{r['ratio']:.3f}x",
                    r["ratio"] >= 0.95,
                )
            )
    return rows


def readme_table(results: dict[str, Any]) -> str:
    """The README's rows: p50 / p99 in ms of each system, per scenario."""
    systems = [s for s in results["systems"] if "error" not in results["systems"][s]]
    header = "| scenario | " + " | ".join(systems) + " |"
    lines = [header, "|---" * (len(systems) + 1) + "|"]
    for label, _ in SCENARIOS:
        cells = []
        for name in systems:
            stats = results["systems"][name].get(label)
            cells.append("-" if not stats else f"{_ms(stats['p50'])} / {_ms(stats['p99'])}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    out = [
        "# Latency: enqueue commit to handler start",
        "",
        f"`{results['command']}` at commit `{results['commit']}`, {results['started']}; "
        f"{os.cpu_count()} cores. What is measured, and how: the docstring of bench/latency.py. "
        "Milliseconds; a job that had not started "
        f"{STARTED_TIMEOUT:g} s after its scenario is counted as missing.",
        "",
        "Server: " + ", ".join(f"{k}={v}" for k, v in results["settings"].items()),
        "",
    ]
    for name, found in results["systems"].items():
        out += [f"## {name}", "", SYSTEMS[name].how, ""]
        if "error" in found:
            out += [f"Not measured: {found['error']}", ""]
            continue
        out += ["| scenario | p50 | p95 | p99 | max | jobs | missing |", "|---" * 7 + "|"]
        for label, _ in SCENARIOS:
            s = found.get(label)
            if s:
                out.append(
                    f"| {label} | {_ms(s['p50'])} | {_ms(s['p95'])} | {_ms(s['p99'])} | "
                    f"{_ms(s['max'])} | {s['jobs']} | {s['missing']} |"
                )
        out.append("")
    out += ["## p50 / p99 side by side", "", readme_table(results), ""]
    if results.get("notify"):
        out += [
            "## What notifications cost 8 concurrent enqueuers (bench/notify.py)",
            "",
            "Runs enqueued per second by 8 pgbench clients at once, one run a transaction, "
            "medians of each side; `off`: the trigger that notifies disabled; on/off: the "
            "median of the ratios of pairs measured side by side. The cases: "
            "bench/notify.py's docstring. The last column counts the notifications a session "
            "that listens saw, per run enqueued.",
            "",
            "| case | off | on | on/off | enqueues that notified (on) |",
            "|---|---|---|---|---|",
        ]
        for case, r in results["notify"].items():
            out.append(
                f"| {case} | {r['off']:.0f} | {r['on']:.0f} | {r['ratio']:.3f}x | "
                f"{100 * r['notified']:.1f}% |"
            )
        out.append("")
    out += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for what, measured, met in _targets(results):
        out.append(f"| {what} | {measured} | {'-' if met is None else 'yes' if met else 'NO'} |")
    return "\n".join(out) + "\n"


def _update_readme(results: dict[str, Any]) -> None:
    readme = ROOT / "docs" / "guides" / "starting-promptly.md"
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        print(f"{readme} has no latency markers: its table is left as it is", file=sys.stderr)
        return
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    table = readme_table(results)
    readme.write_text(f"{head}{README_BEGIN}\n{table}\n{README_END}{tail}")


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs, a 10 s idle minute")
    parser.add_argument("--only", help="systems, comma-separated: " + ", ".join(SYSTEMS))
    parser.add_argument("--idle-seconds", type=float, default=None, help="default 60 (quick 10)")
    parser.add_argument(
        "--reps", type=int, default=None, help="rounds of the scenarios: 2 (quick 1)"
    )
    parser.add_argument("--notify-seconds", type=int, default=2)
    parser.add_argument("--notify-rounds", type=int, default=10)
    parser.add_argument("--no-notify", action="store_true", help="skip bench/notify.py")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(SYSTEMS)
    scenarios = [
        (label, {**s, "count": QUICK[label]} if args.quick else s) for label, s in SCENARIOS
    ]
    idle = args.idle_seconds if args.idle_seconds is not None else (10 if args.quick else 60)
    results: dict[str, Any] = {
        "command": "python bench/latency.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "systems": {},
    }
    with throwaway_cluster() as cluster, tempfile.TemporaryDirectory() as work:
        results["settings"] = cluster.settings()
        systems = []
        for name in names:
            missing = SYSTEMS[name].available()
            if missing:
                results["systems"][name] = {"error": missing}
            else:
                systems.append(SYSTEMS[name])
        reps = args.reps or (1 if args.quick else 2)
        measured = measure(cluster, systems, scenarios, Path(work), reps=reps, idle=idle)
        results["systems"].update({s.name: measured[s.name] for s in systems})
        if not args.no_notify:
            import psycopg

            from bench import notify
            from cronjob import migrate

            url = cluster.createdb("notify")
            with psycopg.connect(url, autocommit=True) as conn:
                migrate.apply(conn)
            results["notify"] = notify.measure(
                url, seconds=args.notify_seconds, rounds=args.notify_rounds, work=Path(work)
            )
    report = render(results)
    print(report)
    if not args.no_write:
        (ROOT / "bench" / "LATENCY-RESULTS.md").write_text(report)
        (ROOT / "bench" / "latency-results.json").write_text(json.dumps(results, indent=2) + "\n")
        _update_readme(results)


if __name__ == "__main__":
    main()
