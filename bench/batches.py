"""What a batch costs: draining a batch against the same runs without one, enqueueing a batch
against `enqueue_many`, and how long a callback waits after its batch's last member finished.

    python bench/batches.py                    # N=20,000, 3 repetitions
    python bench/batches.py --n 2000 --reps 1  # a quick look
    python bench/batches.py --only delays      # the callback delays alone

On one throwaway cluster (bench/suite/pgcluster.py, as bench/run.py uses), this tree only.

- `drain`: N no-op runs (`bench.noop_handlers`) enqueued by `enqueue_many`, or by
  `enqueue_batch` with a no-op callback; `VACUUM ANALYZE`, `CHECKPOINT`, then two
  `jobrunner tick` processes at once, timed until both have exited with every run finished.
  The two cases alternate, each repetition in the other order. Two ticks finalize members
  of the same batch side by side: a design that serialized them on one row would show here.
- `enqueue`: the same N runs enqueued in one transaction by `enqueue_many` and by
  `enqueue_batch`, alternated, on a fresh database each.
- `prune`: N finished runs a day old deleted by `prune_runs` (`jobrunner prune`, a tick's
  --prune-older-than), without dependencies and with N/2 rows of job_run_dependencies (half
  the runs each waited for one of the other half), which go by ON DELETE CASCADE.
- `callback delay`: B batches (default 200) of M members (10); for each batch, the
  callback's start (its claim) less its last member's finish, both by the database clock
  (p50, p99): with a listening tick, with a draining tick per batch, and when the callback
  is left for the next tick (callback_delays says how each case runs).

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


def drain(cluster, tmpl: str, n: int, *, batch: bool, ticks: int = 2) -> tuple[float, float, float]:
    """Jobs per second of `ticks` ticks at once draining `n` runs (and, as a batch, its
    callback); and the CPU seconds the server and the ticks used for it, which the other
    work of a shared host disturbs far less than the wall clock."""
    import resource

    import psycopg

    name = f"d{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        enqueue(url, n, batch=batch)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        cluster.checkpoint()
        server, children = cluster.cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        for process in [jobrunner(url, "tick", *TICK) for _ in range(ticks)]:
            finished(process)
        seconds = time.perf_counter() - started
        server = cluster.cpu_seconds() - server
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        tick_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
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
        return n / seconds, server, tick_cpu
    finally:
        cluster.dropdb(name)


def prune(cluster, tmpl: str, n: int, *, dependencies: bool) -> float:
    """Seconds `prune_runs` (as `jobrunner prune --older-than 1h` and a tick's
    --prune-older-than) takes to delete `n` finished runs, a day old; with `dependencies`,
    half of them each waited for one run of the other half (n/2 rows of
    job_run_dependencies, which go by their foreign keys' ON DELETE CASCADE)."""
    import psycopg

    from cronjob import enqueue_many, new_run
    from cronjob.prune import prune_runs

    name = f"p{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            with conn.transaction():
                half = n // 2
                parents = enqueue_many(conn, [new_run("noop", {"i": i}) for i in range(half)])
                after = [{"after": [p]} if dependencies else {} for p in parents]
                enqueue_many(conn, [new_run("noop", {"i": i}, **a) for i, a in enumerate(after)])
            conn.execute(
                "UPDATE job_runs SET status = 'succeeded', attempts = 1,"
                " finished_at = now() - interval '1 day'"
            )
            conn.execute("VACUUM ANALYZE")
            edges = conn.execute("SELECT count(*) FROM job_run_dependencies").fetchone()[0]
            assert edges == (half if dependencies else 0), edges
            cluster.checkpoint()
            started = time.perf_counter()
            report = prune_runs(conn, older_than=3600)
            seconds = time.perf_counter() - started
            assert report.total == n and not conn.execute("SELECT 1 FROM job_runs").fetchone()
            return seconds
    finally:
        cluster.dropdb(name)


# Each ratio of the summary: the median of one case over that of another.
RATIOS = {
    "drain, batch / no batch": (
        "drain jobs/s, two ticks, batch", "drain jobs/s, two ticks, no batch"
    ),
    "drain server CPU, batch / no batch": (
        "drain server CPU s, two ticks, batch", "drain server CPU s, two ticks, no batch"
    ),
    "drain ticks' CPU, batch / no batch": (
        "drain ticks' CPU s, two ticks, batch", "drain ticks' CPU s, two ticks, no batch"
    ),
    "enqueue, enqueue_batch / enqueue_many": (
        "enqueue runs/s, enqueue_batch", "enqueue runs/s, enqueue_many"
    ),
    "prune, with / without dependencies (time)": (
        "prune s, with dependencies", "prune s, without dependencies"
    ),
}  # fmt: skip

DELAY_SQL = """
SELECT extract(epoch FROM c.started_at - max(m.finished_at)) * 1000
FROM job_batches b JOIN job_runs c ON c.id = b.callback_run_id
JOIN job_runs m ON m.batch_id = b.id
GROUP BY b.id, c.started_at
"""


def _delays(url: str) -> list[float]:
    """Each batch's callback start less its last member's finish, in ms (database clock)."""
    import psycopg

    with psycopg.connect(url) as conn:
        return sorted(float(row[0]) for row in conn.execute(DELAY_SQL))


def _callback_finished(conn, batch_id: int) -> bool:
    row = conn.execute(
        "SELECT c.finished_at IS NOT NULL FROM job_batches b"
        " JOIN job_runs c ON c.id = b.callback_run_id WHERE b.id = %s",
        [batch_id],
    ).fetchone()
    return bool(row and row[0])


def _one_batch(conn, b: int, members: int) -> int:
    from cronjob import enqueue_batch, new_run

    runs = [new_run("noop", {"b": b, "i": i}) for i in range(members)]
    with conn.transaction():
        return enqueue_batch(conn, runs, then=new_run("noop", {"summary": b})).id


def callback_delays(cluster, tmpl: str, batches: int, members: int, *, case: str) -> list[float]:
    """Each of `batches` batches of `members` no-op runs, its callback's start less its last
    member's finish, in milliseconds.

    - `listening tick`: one `tick --listen` stays; the batches are enqueued one at a time,
      each once the callback of the one before has finished, so none waits behind another.
    - `draining tick`: the same, with a `jobrunner tick` started after each enqueue (as cron
      would start one), which drains the members and exits.
    - `next tick`: every batch at once, its callback of a type (`noop.summary`) the tick that
      drains the members has no handler for (`--types noop`); a second tick, started as soon
      as the first has exited, runs the callbacks: what happens when the tick that finished
      the last member does not take the callback, and nothing listens.
    """
    import psycopg

    from cronjob import enqueue_batch, new_run

    name = f"c{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        if case == "next tick":
            with psycopg.connect(url) as conn, conn.transaction():
                for b in range(batches):
                    runs = [new_run("noop", {"b": b, "i": i}) for i in range(members)]
                    enqueue_batch(conn, runs, then=new_run("noop.summary", {"summary": b}))
            finished(jobrunner(url, "tick", "--types", "noop", *TICK))
            finished(jobrunner(url, "tick", *TICK))
            return _delays(url)
        listening = None
        if case == "listening tick":
            listening = jobrunner(url, "tick", "--listen", *TICK[:-2], "--max-runtime", "900s")
        with psycopg.connect(url, autocommit=True) as conn:
            for b in range(batches):
                batch_id = _one_batch(conn, b, members)
                if listening is None:
                    finished(jobrunner(url, "tick", *TICK))
                while not _callback_finished(conn, batch_id):
                    time.sleep(0.005)  # pacing only: the delays are read from the database
        if listening is not None:
            listening.terminate()  # it exits 143, saying it was stopped while listening
            listening.communicate(timeout=60)
        return _delays(url)
    finally:
        cluster.dropdb(name)


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    from bench.suite.pgcluster import throwaway_cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument(
        "--only", default="drain,prune,enqueue,delays",
        help="comma-separated parts to run (default: drain,prune,enqueue,delays)",
    )  # fmt: skip
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
        parts = set(args.only.split(","))
        for rep in range(args.reps if parts - {"delays"} else 0):
            print(f"repetition {rep + 1}", flush=True)
            order = [False, True] if rep % 2 == 0 else [True, False]
            for batch in order if "drain" in parts else []:
                kind = "batch" if batch else "no batch"
                rate, server, ticks = drain(cluster, tmpl, args.n, batch=batch)
                note(f"drain jobs/s, two ticks, {kind}", rate)
                note(f"drain server CPU s, two ticks, {kind}", server)
                note(f"drain ticks' CPU s, two ticks, {kind}", ticks)
                if args.one_tick:
                    rate, _, _ = drain(cluster, tmpl, args.n, batch=batch, ticks=1)
                    note(f"drain jobs/s, one tick, {kind}", rate)
            for dependencies in order if "prune" in parts else []:
                kind = "with" if dependencies else "without"
                value = prune(cluster, tmpl, args.n, dependencies=dependencies)
                note(f"prune s, {kind} dependencies", value)
            for batch in order if "enqueue" in parts else []:
                kind = "enqueue_batch" if batch else "enqueue_many"
                name = f"e{time.monotonic_ns()}"
                copy = cluster.createdb(name, template=tmpl)
                try:
                    note(f"enqueue runs/s, {kind}", args.n / enqueue(copy, args.n, batch=batch))
                finally:
                    cluster.dropdb(name)
        delays = {
            case: callback_delays(cluster, tmpl, args.batches, args.members, case=case)
            for case in ("listening tick", "draining tick", "next tick")
            if "delays" in parts
        }
    medians = {case: statistics.median(values) for case, values in results.items()}
    summary: dict[str, object] = {"n": args.n, "reps": args.reps, "medians": medians}
    for ratio, (numerator, denominator) in RATIOS.items():
        if numerator in medians and denominator in medians:
            summary[ratio] = medians[numerator] / medians[denominator]
    summary["callback delay ms"] = {
        kind: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "batches": len(v)}
        for kind, v in delays.items()
    }
    print(json.dumps(summary, indent=2))
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
