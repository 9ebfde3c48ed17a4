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
README's table between its `latency:begin` and `latency:end` markers (--no-write: none).
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
SLEEPING = 29958816149106292  # a sleeping tick's advisory lock (migration 0028)

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
    done = subprocess.run(argv, env={**os.environ, **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {done.stderr[-2000:] or done.stdout[-2000:]}")


def _jobrunner() -> System:
    def setup(url: str) -> None:
        import psycopg

        from cronjob import migrate

        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv = [sys.executable, "-m", "cronjob", "tick", "--listen", "--max-runtime", "3600s",
                "--handlers", "bench.latency_handlers", "--log-level", "warning"]  # fmt: skip
        env = {"JOBRUNNER_DATABASE_URL": url, "LATENCY_LOG": str(log), "PYTHONPATH": str(ROOT)}
        return argv, env, ROOT

    return System(
        "jobrunner", sys.executable, "latency_jobrunner", setup, worker,
        "`jobrunner tick --listen` (default flags: 4 handler threads), a plain `def` handler; "
        "enqueued with `enqueue_async`, a burst with `enqueue_many`",
        env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip


GRAPHILE_PRESET = """\
const {{ Logger, consoleLogFactory }} = require("graphile-worker");
const logger = new Logger((scope) => {{
  const log = consoleLogFactory(scope);
  return (level, message, meta) => {{ if (level === "error" || level === "warning") log(level, message, meta); }};
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
        "graphile-worker", sys.executable, "latency_graphile",
        lambda url: _run(command(url, "--schema-only"), {}, prefix), worker,
        "graphile-worker's defaults (one job at a time, LISTEN/NOTIFY), an async task; "
        "enqueued with graphile_worker.add_job, a burst with add_jobs",
        env={"BENCH_DATABASE_URL": ""},
    )  # fmt: skip


def _procrastinate() -> System:
    venv = ENVS / "procrastinate" / "bin"

    def cli(url: str, *args: str) -> tuple[list[str], dict[str, str]]:
        argv = [str(venv / "procrastinate"), "--log-level", "warning",
                "--app", "latency_procrastinate.app", *args]  # fmt: skip
        return argv, {"BENCH_DATABASE_URL": url, "PYTHONPATH": str(PEERS)}

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv, env = cli(url, "worker")
        return argv, {**env, "LATENCY_LOG": str(log)}, PEERS

    return System(
        "procrastinate", str(venv / "python"), "latency_procrastinate",
        lambda url: _run(*cli(url, "schema", "--apply"), PEERS), worker,
        "`procrastinate worker` with its defaults (concurrency 1, listen_notify), an async "
        "task; enqueued with `defer_async`, a burst with `batch_defer_async`",
    )  # fmt: skip


def _pgqueuer() -> System:
    venv = ENVS / "pgqueuer" / "bin"

    def worker(url: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
        argv = [str(venv / "pgq"), "run", "latency_pgqueuer:main", "--log-level", "WARNING"]
        env = {"BENCH_DATABASE_URL": url, "PGDSN": url, "LATENCY_LOG": str(log)}
        return argv, {**env, "PYTHONPATH": str(PEERS)}, PEERS

    return System(
        "pgqueuer", str(venv / "python"), "latency_pgqueuer",
        lambda url: _run([str(venv / "pgq"), "install"], {"PGDSN": url}, PEERS), worker,
        "`pgq run` with its defaults (asyncpg driver, LISTEN/NOTIFY), an async entrypoint; "
        "enqueued with `Queries.enqueue`, one job or a batch",
    )  # fmt: skip


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


def measure(cluster: Cluster, system: System, scenarios: list, work: Path, idle: float) -> dict:
    url = cluster.createdb(f"latency_{system.name.replace('-', '_')}")
    system.setup(url)
    log = work / f"{system.name}.starts"
    argv, env, cwd = system.worker(url, log)
    worker = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    starts, results = Starts(log), {}
    try:
        next_k = 1_000_000
        warm = _drive(system, url, {**WARM_UP, "start_k": next_k}, work)
        starts.wait([k for k, *_ in warm], STARTED_TIMEOUT, worker)
        for label, scenario in scenarios:
            next_k += 100_000
            jobs = _drive(system, url, {**scenario, "start_k": next_k}, work)
            starts.wait([k for k, *_ in jobs], STARTED_TIMEOUT, worker)
            seen = starts.read()
            waited = [
                (seen[k] - (due if due is not None else committed)) * 1000
                for k, committed, due in jobs
                if k in seen
            ]
            results[label] = {
                **percentiles(waited),
                "jobs": len(jobs),
                "missing": sum(k not in seen for k, *_ in jobs),
            }
            print(f"  {system.name:16} {label:11} {_row(results[label])}", flush=True)
        if idle and system.name == "jobrunner":
            results["idle"] = _idle_cost(url, worker.pid, idle)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        cluster.dropdb(url.rsplit("/", 1)[1])
    return results


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
