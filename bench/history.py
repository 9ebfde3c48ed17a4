"""`status`, `metrics` and `check` with a long history of finished runs, against none.

    python bench/history.py                       # 10,000,000 finished runs, 10,000 queued
    python bench/history.py --finished 2000000    # a size the machine can load quickly

Two databases on one server, loaded alike but for the history: both hold `--queued` due
runs spread over 20 job types; one also holds `--finished` finished runs (succeeded,
dead and cancelled, finished over the last 30 days). Then, round-robin over the two, each
command's queries are timed in-process (the statements the command runs, through the same
library calls), and `jobrunner tick --metrics-textfile` is timed as a process with nothing
due. Prints medians and each ratio to its no-history figure; exits 1 if a ratio is over
1.5 or the tick's difference is over 50 ms.

The server is the embedded one (the `embedded` extra) unless `--database-url` names
another; the two databases are created on it and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = 20


def _urls(server: str) -> tuple[str, str]:
    from psycopg import conninfo

    def named(name: str) -> str:
        params = conninfo.conninfo_to_dict(server)
        params["dbname"] = name
        return conninfo.make_conninfo(**params)

    return named("jrbench_history_none"), named("jrbench_history_full")


def _create(server: str, url: str) -> None:
    import psycopg
    from psycopg import conninfo

    from cronjob import migrate

    name = conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)


def _drop(server: str, url: str) -> None:
    import psycopg
    from psycopg import conninfo

    name = conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _load(url: str, *, queued: int, finished: int) -> float:
    """Fill one database; returns the seconds the history took to load."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job_runs (job_type, run_at)"
            " SELECT 'type_' || (i %% %s), now() - make_interval(secs => i %% 600)"
            " FROM generate_series(1, %s) AS i",
            [TYPES, queued],
        )
        started = time.monotonic()
        chunk = 1_000_000
        for first in range(1, finished + 1, chunk):
            last = min(first + chunk - 1, finished)
            # Loaded as a restore would be: the tally is counted once afterwards, as
            # migration 0010 counts an existing table.
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute(
                    "INSERT INTO job_runs (job_type, status, attempts, max_attempts,"
                    " started_at, finished_at, run_at, created_at, updated_at)"
                    " SELECT 'type_' || (i %% %s),"
                    "  CASE WHEN i %% 50 = 0 THEN 'dead' WHEN i %% 97 = 0 THEN 'cancelled'"
                    "       ELSE 'succeeded' END,"
                    "  1, 3, t - interval '1 second', t, t, t, t"
                    " FROM generate_series(%s::bigint, %s::bigint) AS i,"
                    " LATERAL (SELECT now() - interval '2 hours'"
                    "  - make_interval(secs => (i * 2592000.0) / %s)) AS"
                    " f(t)",
                    [TYPES, first, last, max(finished, 1)],
                )
            print(f"  loaded {last:,} finished runs", file=sys.stderr, flush=True)
        conn.execute(
            "INSERT INTO job_run_tally (job_type, status, runs, last_started_at)"
            " SELECT job_type, status, count(*), max(started_at) FROM job_runs"
            " WHERE status IN ('succeeded', 'dead', 'cancelled') GROUP BY 1, 2"
        )
        loaded = time.monotonic() - started
        conn.execute("VACUUM ANALYZE job_runs")
    return loaded


def _commands(url: str) -> dict[str, Callable[[], Any]]:
    import psycopg

    from cronjob import metrics, store
    from cronjob.health import Thresholds, evaluate, summarize

    conn = psycopg.connect(url, autocommit=True)

    def status() -> Any:
        overview = summarize(store.runs_snapshot(conn), tuple(store.job_type_pauses_list(conn)))
        return overview, store.definitions_list_schedules(conn)

    def check() -> Any:
        overview = summarize(store.runs_snapshot(conn), tuple(store.job_type_pauses_list(conn)))
        return evaluate(overview, Thresholds(600.0, 0, 0))

    return {"status": status, "metrics": lambda: metrics.collect(conn), "check": check}


def _tick(url: str, textfile: Path) -> float:
    """`jobrunner tick --metrics-textfile` as cron runs it: a process, nothing due."""
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cronjob",
            "tick",
            "--database-url",
            url,
            "--handlers",
            "bench.noop_handlers",
            "--metrics-textfile",
            str(textfile),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return time.monotonic() - started


def _tick_in_process(url: str, textfile: Path) -> Callable[[], Any]:
    """The same tick without the interpreter's start: what the table's size can change."""
    import bench.noop_handlers  # noqa: F401 - registers noop
    from cronjob import db
    from cronjob.handlers import registry
    from cronjob.tick import TickOptions, run_tick

    handlers = {"noop": registry()["noop"]}
    options = TickOptions(metrics_path=textfile, owns_process=False)

    def tick() -> Any:
        conn = db.connect(url)
        try:
            return run_tick(conn, handlers, database=db.Database(url), options=options)
        finally:
            conn.close()

    return tick


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--database-url", help="a server to create the two databases on")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    args = parser.parse_args(argv)

    if args.database_url:
        server = args.database_url
    else:
        from cronjob import embedded

        server = embedded.url()
    none_url, full_url = _urls(server)
    for url in (none_url, full_url):
        _create(server, url)
    try:
        _load(none_url, queued=args.queued, finished=0)
        load_seconds = _load(full_url, queued=args.queued, finished=args.finished)
        return _measure(args, none_url, full_url, load_seconds)
    finally:
        if not args.keep:
            for url in (none_url, full_url):
                _drop(server, url)


def _measure(args: Any, none_url: str, full_url: str, load_seconds: float) -> int:
    runs = {"none": _commands(none_url), "full": _commands(full_url)}
    timings: dict[tuple[str, str], list[float]] = {}
    # Interleaved finely, so that load from elsewhere on the machine hits both alike.
    with tempfile.TemporaryDirectory() as tmp:
        textfile = Path(tmp) / "jobrunner.prom"
        for which, url in (("none", none_url), ("full", full_url)):
            runs[which]["tick"] = _tick_in_process(url, textfile)
        for _ in range(args.reps * 2 + 1):
            for name in ("status", "metrics", "check", "tick"):
                for which in ("none", "full"):
                    started = time.perf_counter()
                    runs[which][name]()
                    timings.setdefault((name, which), []).append(time.perf_counter() - started)
        for _ in range(args.reps):
            for which, url in (("none", none_url), ("full", full_url)):
                timings.setdefault(("process", which), []).append(_tick(url, textfile))
    ok = True
    print(
        f"\n{args.finished:,} finished runs (loaded in {load_seconds:.0f}s) and "
        f"{args.queued:,} queued, vs the same queue with no history; medians of "
        f"{args.reps * 2 + 1} (the tick: of {args.reps})\n"
    )
    print(f"{'command':<28}{'no history':>12}{'history':>12}{'ratio':>8}  limit")
    for name in ("status", "metrics", "check"):
        none = statistics.median(timings[(name, "none")])
        full = statistics.median(timings[(name, "full")])
        ratio = full / none
        ok &= ratio <= 1.5
        print(f"{name:<28}{none * 1000:>10.1f}ms{full * 1000:>10.1f}ms{ratio:>8.2f}  1.5x")
    none = statistics.median(timings[("tick", "none")])
    full = statistics.median(timings[("tick", "full")])
    ok &= full - none <= 0.050
    print(
        f"{'tick --metrics-textfile':<28}{none * 1000:>10.1f}ms{full * 1000:>10.1f}ms"
        f"{(full - none) * 1000:>+7.1f}ms  +50ms"
    )
    pairs = zip(timings[("process", "none")], timings[("process", "full")], strict=True)
    difference = statistics.median(f - n for n, f in pairs)
    none = statistics.median(timings[("process", "none")])
    full = statistics.median(timings[("process", "full")])
    print(
        f"{'  the same, as a process':<28}{none * 1000:>10.1f}ms{full * 1000:>10.1f}ms"
        f"{difference * 1000:>+7.1f}ms  (median of paired differences; not gated: "
        "start-up noise)"
    )
    print("\nwithin the limits" if ok else "\nOVER A LIMIT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
