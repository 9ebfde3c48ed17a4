"""What a batch costs: draining a batch against the same runs without one, enqueueing a batch
against `enqueue_many`, and how long a callback waits after its batch's last member finished.

    python bench/batches.py                    # N=20,000, 3 repetitions
    python bench/batches.py --n 2000 --reps 1  # a quick look

On one throwaway cluster (bench/suite/pgcluster.py, as bench/run.py uses), this tree only.

- `drain`: N no-op runs (`bench.noop_handlers`) enqueued by `enqueue_many`, or by
  `enqueue_batch` with a no-op callback; `VACUUM ANALYZE`, `CHECKPOINT`, then two
  `jobrunner tick` processes at once, timed until both have exited with every run finished.
  The two cases alternate, each repetition in the other order. Two ticks finalize members
  of the same batch side by side: a design that serialized them on one row would show here.
- `enqueue`: the same N runs enqueued in one transaction by `enqueue_many` and by
  `enqueue_batch`, alternated, on a fresh database each.
- `callback delay`: B batches of M members drained by one tick; for each batch, the
  callback's start less its last member's finish, both by the database clock (p50, p99).
  With `tick --listen` too, when this tree's tick has it.

Writes the medians and ratios to bench/batches-results.json (`--out`) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICK = ["--handlers", "bench.noop_handlers", "--log-level", "warning", "--max-runtime", "600s"]


def jobrunner(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBRUNNER_DATABASE_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "cronjob", *args], env=env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finished(process: subprocess.Popen[str]) -> None:
    _, stderr = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"jobrunner failed: {stderr[-2000:]}")


def enqueue(url: str, n: int, *, batch: bool) -> float:
    """Seconds to enqueue `n` no-op runs in one transaction, as a batch or not."""
    import psycopg

    from cronjob import enqueue_batch, enqueue_many, new_run

    runs = [new_run("noop", {"i": i}) for i in range(n)]
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        with conn.transaction():
            if batch:
                enqueue_batch(conn, runs, then=new_run("noop", {"summary": True}))
            else:
                enqueue_many(conn, runs)
        return time.perf_counter() - started


def drain(cluster, tmpl: str, n: int, *, batch: bool, ticks: int = 2) -> float:
    """Jobs per second of `ticks` ticks at once draining `n` runs (and, as a batch, its
    callback)."""
    import psycopg

    name = f"d{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        enqueue(url, n, batch=batch)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        cluster.checkpoint()
        started = time.perf_counter()
        for process in [jobrunner(url, "tick", *TICK) for _ in range(ticks)]:
            finished(process)
        seconds = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            left = conn.execute(
                "SELECT job_type, status, payload ? 'summary', count(*) FROM job_runs"
                " WHERE status <> 'succeeded' GROUP BY 1, 2, 3"
            ).fetchall()
            assert not left, f"the ticks left runs undone: {left}"
            if batch:
                called = conn.execute(
                    "SELECT count(*) FROM job_batches WHERE callback_run_id IS NOT NULL"
                )
                assert called.fetchone()[0] == 1, "the batch did not call back once"
        return n / seconds
    finally:
        cluster.dropdb(name)


def callback_delays(cluster, tmpl: str, batches: int, members: int, *, listen: bool) -> list[float]:
    """Each batch's callback start less its last member's finish, in milliseconds."""
    import psycopg

    from cronjob import enqueue_batch, new_run

    name = f"c{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        with psycopg.connect(url) as conn, conn.transaction():
            for b in range(batches):
                runs = [new_run("noop", {"b": b, "i": i}) for i in range(members)]
                enqueue_batch(conn, runs, then=new_run("noop", {"summary": b}))
        args = ["tick", *TICK]
        if listen:
            args = ["tick", "--listen", *TICK[:-2], "--max-runtime", "20s"]
        finished(jobrunner(url, *args))
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                """SELECT extract(epoch FROM c.started_at - max(m.finished_at)) * 1000
                   FROM job_batches b JOIN job_runs c ON c.id = b.callback_run_id
                   JOIN job_runs m ON m.batch_id = b.id
                   GROUP BY b.id, c.started_at"""
            ).fetchall()
        return sorted(float(r[0]) for r in rows)
    finally:
        cluster.dropdb(name)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def has_listen() -> bool:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    help_text = subprocess.run(
        [sys.executable, "-m", "cronjob", "tick", "--help"], env=env, capture_output=True,
        text=True, cwd=ROOT,
    ).stdout  # fmt: skip
    return "--listen" in help_text


def main(argv: list[str] | None = None) -> int:
    from bench.suite.pgcluster import throwaway_cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--one-tick", action="store_true", help="also drain with one tick")
    parser.add_argument("--out", default=str(ROOT / "bench" / "batches-results.json"))
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {}

    def note(case: str, value: float) -> None:
        results.setdefault(case, []).append(value)
        print(f"  {case}: {value:,.3f}", flush=True)

    with throwaway_cluster() as cluster:
        tmpl = "tmpl_batches"
        url = cluster.createdb(tmpl)
        finished(jobrunner(url, "migrate"))
        for rep in range(args.reps):
            print(f"repetition {rep + 1}", flush=True)
            order = [False, True] if rep % 2 == 0 else [True, False]
            for batch in order:
                kind = "batch" if batch else "no batch"
                note(f"drain jobs/s, two ticks, {kind}", drain(cluster, tmpl, args.n, batch=batch))
                if args.one_tick:
                    value = drain(cluster, tmpl, args.n, batch=batch, ticks=1)
                    note(f"drain jobs/s, one tick, {kind}", value)
            for batch in order:
                kind = "enqueue_batch" if batch else "enqueue_many"
                name = f"e{time.monotonic_ns()}"
                copy = cluster.createdb(name, template=tmpl)
                try:
                    note(f"enqueue runs/s, {kind}", args.n / enqueue(copy, args.n, batch=batch))
                finally:
                    cluster.dropdb(name)
        delays = {
            "draining tick": callback_delays(
                cluster, tmpl, args.batches, args.members, listen=False
            )
        }
        if has_listen():
            delays["listening tick"] = callback_delays(
                cluster, tmpl, args.batches, args.members, listen=True
            )
    medians = {case: statistics.median(values) for case, values in results.items()}
    summary: dict[str, object] = {
        "n": args.n,
        "reps": args.reps,
        "medians": medians,
        "drain, batch / no batch": medians["drain jobs/s, two ticks, batch"]
        / medians["drain jobs/s, two ticks, no batch"],
        "enqueue, enqueue_batch / enqueue_many": medians["enqueue runs/s, enqueue_batch"]
        / medians["enqueue runs/s, enqueue_many"],
        "callback delay ms": {
            kind: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "batches": len(v)}
            for kind, v in delays.items()
        },
    }
    if "listening tick" not in delays:
        summary["listening tick"] = "not measured: this tree's tick has no --listen"
    print(json.dumps(summary, indent=2))
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
