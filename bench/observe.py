"""What watching a tick costs: tracing and run logs, drain against drain.

    python bench/observe.py --n 20000 --reps 5

Each case is one `jobrunner tick` draining N runs of one handler
(bench/observe_handlers.py) on a fresh database of one throwaway cluster, loaded, then
`VACUUM ANALYZE`d and checkpointed, at `--log-level warning`; the cases take turns, one
drain each per round, each round starting with the next case, so load from elsewhere hits
them alike. Per case: the median jobs/s and the median CPU the tick process spent per run
(all its threads); a ratio is of the medians, this case's cost over its baseline's.

| case            | tick                                                   | baseline        |
|-----------------|--------------------------------------------------------|-----------------|
| no otel extra   | no-op handler, from a venv without the `otel` extra    |                 |
| otel off        | no-op handler, the extra installed, no OTEL_* settings | no otel extra   |
| otel traced     | no-op handler, spans batch-exported to a local OTLP/HTTP | otel off      |
|                 | collector (a process of its own that reads and answers),|                |
|                 | its queue large enough that no span is dropped         |                 |
| logs kept       | a handler logging one line a run, its run log kept     | logs not kept   |
| logs not kept   | the same, `capture_logs=False`                         |                 |

Targets: otel off within 2% of no otel extra; traced under 15% more; logs kept under 10%
more. The venv without the extra is made once under bench/.envs/observe-no-otel. The
table, every drain's figures and the machine's load go to bench/OBSERVE-RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench.suite.pgcluster import throwaway_cluster

ROOT = Path(__file__).resolve().parent.parent
NO_OTEL = ROOT / "bench" / ".envs" / "observe-no-otel"
MAIN = "from cronjob.cli import main; main()"
RESULTS = ROOT / "bench" / "OBSERVE-RESULTS.md"

# name: (job type, whether its python is the venv without the extra, traced, baseline)
CASES: dict[str, tuple[str, bool, bool, str | None]] = {
    "no otel extra": ("noop", True, False, None),
    "otel off": ("noop", False, False, "no otel extra"),
    "otel traced": ("noop", False, True, "otel off"),
    "logs not kept": ("log_one_uncaptured", False, False, None),
    "logs kept": ("log_one", False, False, "logs not kept"),
}
TARGETS = {"otel off": 0.02, "otel traced": 0.15, "logs kept": 0.10}

# The collector: answers every export at once, after reading it whole, as a collector
# that batches does; in a process of its own, as a collector is.
COLLECTOR = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def no_otel_python() -> str:
    """A venv with jobrunner's dependencies and none of the otel extra's."""
    python = NO_OTEL / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(NO_OTEL)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(ROOT)], check=True)
    found = subprocess.run([str(python), "-c", "import opentelemetry"], capture_output=True)
    if found.returncode == 0:
        raise SystemExit(f"{NO_OTEL} has OpenTelemetry installed: remove it and run again")
    return str(python)


@contextmanager
def collector() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, "-c", COLLECTOR], stdout=subprocess.PIPE, text=True)
    try:
        port = process.stdout.readline().strip()  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait()


def jobrunner(python: str, url: str, *args: str, env: dict[str, str] | None = None) -> list[Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update(JOBRUNNER_DATABASE_URL=url, PYTHONPATH=str(ROOT), **(env or {}))
    return [[python, "-P", "-c", MAIN, *args], full]


def drain(
    cluster: Any, case: str, python: str, endpoint: str, n: int, i: int
) -> tuple[float, float]:
    """One drain of `case`: jobs/s, and the tick's CPU microseconds per run."""
    job_type, _, traced, _ = CASES[case]
    db = f"o_{i}_{abs(hash(case)) % 10**6}"
    url = cluster.createdb(db)
    try:
        for args, stdin in (
            (["migrate"], None),
            (["enqueue", "--jsonl", "-"], f'{{"type":"{job_type}"}}\n'.encode() * n),
        ):
            argv, env = jobrunner(python, url, *args)
            subprocess.run(
                argv,
                env=env,
                input=stdin,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        cluster.checkpoint()
        env = {}
        if traced:
            # A queue that holds every span of the drain: a dropped span costs nothing.
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_SERVICE_NAME": "bench",
                "OTEL_BSP_MAX_QUEUE_SIZE": str(n + 10_000),
            }
        tick = ["tick", "--handlers", "bench.observe_handlers", "--max-runtime", "600s"]
        argv, env = jobrunner(python, url, *tick, "--log-level", "warning", env=env)
        with tempfile.TemporaryFile() as err:
            before, started = os.times(), time.monotonic()
            subprocess.run(
                argv,
                env=env,
                check=True,
                timeout=900,
                stdout=subprocess.DEVNULL,
                stderr=err if traced else subprocess.DEVNULL,
            )
            elapsed, after = time.monotonic() - started, os.times()
            err.seek(0)
            if b"Queue full" in err.read():
                raise SystemExit(f"{case}: the tick dropped spans")
        cpu = (after.children_user + after.children_system) - (
            before.children_user + before.children_system
        )
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM job_runs WHERE status <> 'succeeded'")
            if (count := left.fetchone()[0]) != 0:
                raise SystemExit(f"{case}: {count} runs not succeeded")
        return n / elapsed, cpu / n * 1e6
    finally:
        cluster.dropdb(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or c in args.only.split(",")]
    pythons = {True: no_otel_python(), False: sys.executable}
    rates: dict[str, list[float]] = {c: [] for c in cases}
    cpus: dict[str, list[float]] = {c: [] for c in cases}
    load_before = os.getloadavg()
    with throwaway_cluster() as cluster, collector() as endpoint:
        for i in range(args.reps):
            # Each round starts with another case, so that none always drains first.
            for case in cases[i % len(cases) :] + cases[: i % len(cases)]:
                rate, cpu = drain(cluster, case, pythons[CASES[case][1]], endpoint, args.n, i)
                rates[case].append(rate)
                cpus[case].append(cpu)
                print(f"{case:>15} rep {i}: {rate:8.0f} jobs/s {cpu:6.1f} us CPU/run", flush=True)
    table = report(cases, rates, cpus)
    print("\n" + table)
    loads = f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    RESULTS.write_text(
        f"# What watching a tick costs (bench/observe.py)\n\n"
        f"`python bench/observe.py --n {args.n} --reps {args.reps}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"1-minute load average {loads}. Medians of {args.reps} drains of {args.n:,} runs "
        f"per case; cost is the baseline's jobs/s over this case's, less 1 (more is slower); "
        f"CPU is this case's CPU per run over the baseline's, less 1.\n\n{table}\n\n"
        f"Every drain, in the order run (jobs/s, CPU microseconds per run):\n\n"
        + "\n".join(
            f"- {case}: "
            + ", ".join(f"{r:,.0f}/{c:.1f}" for r, c in zip(rates[case], cpus[case], strict=True))
            for case in cases
        )
        + "\n"
    )
    print(f"written to {RESULTS.relative_to(ROOT)}")


def report(cases: list[str], rates: dict[str, list[float]], cpus: dict[str, list[float]]) -> str:
    """The table of medians, each case against its baseline and its target."""
    lines = [
        "| case | jobs/s | CPU/run | vs | cost | CPU | target | on jobs/s | on CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        rate, cpu = statistics.median(rates[case]), statistics.median(cpus[case])
        line = f"| {case} | {rate:,.0f} | {cpu:.1f} us |"
        baseline = CASES[case][3]
        if baseline in rates:
            cost = statistics.median(rates[baseline]) / rate - 1
            cpu_cost = cpu / statistics.median(cpus[baseline]) - 1
            limit = TARGETS[case]
            verdicts = ["met" if c < limit else "missed" for c in (cost, cpu_cost)]
            line += f" {baseline} | {cost:+.1%} | {cpu_cost:+.1%} | under {limit:.0%} |"
            line += f" {verdicts[0]} | {verdicts[1]} |"
        else:
            line += " | | | | | |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
