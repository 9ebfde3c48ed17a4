"""What notifications cost enqueuers: 8 clients enqueueing one run a transaction at once,
with jobrunner's trigger that notifies (migration 0027) enabled and disabled, nothing else
changed. Run by bench/latency.py, or alone:

    python bench/notify.py --seconds 5 --rounds 3

PostgreSQL serializes the commits of transactions that notify, and the trigger notifies only
while a tick sleeps; so the cost depends on who listens. The clients are pgbench's (C, 8
clients on 2 threads): Python enqueuers would be what limits the rate on a small machine,
hiding what the commits cost. Each case is measured with the
trigger on and off (`ALTER TABLE job_runs DISABLE TRIGGER job_runs_wake_ticks`), side by side
in `--rounds` pairs (which goes first alternates), on a cluster that keeps initdb's durability
settings; the table is emptied before each measurement. The ratio is the median of the
pairs' ratios: on a shared machine the load from elsewhere sways a pair less than the medians
of either side. Cases:

    no tick               nobody listens: the trigger only tries a lock
    a tick of other types a `tick --listen` that handles none of the runs: it is woken, finds
                          nothing, and lingers when woken at once again and again
    a tick running them   a `tick --listen` that runs them as they come; with the trigger off,
                          a session of the harness's own notifies every 2 ms instead (as often
                          as a lingering tick polls), so that it drains as much, on the same
                          2 cores, while the enqueuers notify nothing
    a sleeper, never woken a session that holds the sleeper's lock and never reads: every
                          enqueue notifies (the bound no tick stays at: it wakes and lingers)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ENQUEUERS = 8
WAKE_EVERY = 0.002  # "a tick running them", trigger off: as often as a lingering tick polls
CASES = ("no tick", "a tick of other types", "a tick running them", "a sleeper, never woken")


@contextmanager
def _listener(url: str, case: str, work: Path) -> Iterator[None]:
    """What listens in `case`, for the length of the block."""
    import psycopg

    if case == "no tick":
        yield
        return
    if case == "a sleeper, never woken":
        from cronjob import store

        with psycopg.connect(url, autocommit=True) as session:
            store.tick_listen(session)
            store.tick_sleep(session)
            yield
            store.tick_wake(session)  # now: a closed session's locks go when its backend exits
        return
    types = "latency.probe" if case == "a tick running them" else "latency.other"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATENCY_LOG": str(work / "notify.starts")}
    tick = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cronjob",
            "tick",
            "--listen",
            "--max-runtime",
            "600s",
            "--handlers",
            "bench.latency_handlers",
            "--types",
            types,
            "--log-level",
            "warning",
            "--database-url",
            url,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.5)  # started and asleep
        yield
    finally:
        tick.terminate()
        tick.wait(timeout=60)


@contextmanager
def _waking(url: str, *, enabled: bool) -> Iterator[None]:
    """While the block runs, a notification every WAKE_EVERY seconds from a session of the
    harness's own: the tick that runs the runs is woken as often as it polls when it lingers,
    while the enqueuers notify nothing (the trigger is off), so that it drains as it would."""
    import threading

    import psycopg

    if not enabled:
        yield
        return
    stop = threading.Event()

    def notify() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.wait(WAKE_EVERY):
                conn.execute("SELECT pg_notify('jobrunner', '')")

    thread = threading.Thread(target=notify, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def _counting(url: str) -> Iterator[list[int]]:
    """Counts the notifications sent while the block runs (a session that listens and does not
    sleep: it makes nobody notify). Yields a list whose one item is the count, once done."""
    import threading

    import psycopg

    counted = [0]
    stop = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN jobrunner")

        def count() -> None:
            while not stop.is_set():
                counted[0] += sum(1 for _ in conn.notifies(timeout=0.1))

        thread = threading.Thread(target=count, daemon=True)
        thread.start()
        try:
            yield counted
        finally:
            stop.set()
            thread.join()


def _flood(url: str, seconds: float, job_type: str, work: Path) -> float:
    """Runs enqueued per second by ENQUEUERS clients at once: pgbench, so that the clients are
    not what limits the rate on a small machine, each inserting one run a transaction (what an
    enqueue of one run writes)."""
    from bench.suite.pgcluster import PG_BIN

    script = work / "enqueue.sql"
    script.write_text(f"INSERT INTO job_runs (job_type, payload) VALUES ('{job_type}', '{{}}');\n")
    argv = [
        str(PG_BIN / "pgbench"),
        "-n",
        "-c",
        str(ENQUEUERS),
        "-j",
        "2",
        "-T",
        f"{seconds:g}",
        "-f",
        str(script),
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=True)
    tps = [line for line in done.stdout.splitlines() if line.startswith("tps = ")]
    return float(tps[-1].split()[2])


def measure(url: str, *, seconds: float, rounds: int, work: Path) -> dict[str, Any]:
    """Per case, `rounds` pairs of measurements, the trigger off and on side by side (which
    goes first alternates): the medians of each, and the median of the pairs' on/off ratios,
    which load from elsewhere on a shared machine sways less than either."""
    import psycopg

    found: dict[str, dict[str, list[float]]] = {c: {"off": [], "on": []} for c in CASES}
    notified: dict[str, list[float]] = {c: [] for c in CASES}  # notifications per run, on
    with psycopg.connect(url, autocommit=True) as admin:
        for case in CASES:
            with _listener(url, case, work):
                for r in range(rounds):
                    for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                        rate, sent = _measure_once(admin, url, case, mode, seconds, work)
                        found[case][mode].append(rate)
                        if mode == "on":
                            notified[case].append(sent / (rate * seconds))
        admin.execute("ALTER TABLE job_runs ENABLE TRIGGER job_runs_wake_ticks")
    results = {}
    for case, modes in found.items():
        ratios = [on / off for on, off in zip(modes["on"], modes["off"], strict=True)]
        results[case] = {
            "off": statistics.median(modes["off"]),
            "on": statistics.median(modes["on"]),
            "ratio": statistics.median(ratios),
            "notified": statistics.median(notified[case]),
            "rounds": modes,
        }
    return results


def _measure_once(
    admin: Any, url: str, case: str, mode: str, seconds: float, work: Path
) -> tuple[float, int]:
    """One measurement on an empty table: runs enqueued per second, notifications sent."""
    admin.execute("TRUNCATE job_runs CASCADE")
    toggle = "ENABLE" if mode == "on" else "DISABLE"
    admin.execute(f"ALTER TABLE job_runs {toggle} TRIGGER job_runs_wake_ticks")
    wakes = case == "a tick running them" and mode == "off"
    with _waking(url, enabled=wakes), _counting(url) as sent:
        rate = _flood(url, seconds, "latency.probe", work)
    line = f"  notify: {case:24} trigger {mode:3} {rate:8.0f} runs/s"
    print(line + (f", {sent[0]} notified" if mode == "on" else ""), flush=True)
    return rate, sent[0]


def main() -> None:
    import tempfile

    import psycopg

    from bench.suite.pgcluster import throwaway_cluster
    from cronjob import migrate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=2, help="per measurement")
    parser.add_argument("--rounds", type=int, default=10, help="pairs of measurements per case")
    args = parser.parse_args()
    with throwaway_cluster() as cluster, tempfile.TemporaryDirectory() as work:
        url = cluster.createdb("notify")
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)
        results = measure(url, seconds=args.seconds, rounds=args.rounds, work=Path(work))
    for case, r in results.items():
        print(
            f"{case:24} off {r['off']:8.0f}  on {r['on']:8.0f}  {r['ratio']:.3f}x"
            f"  {100 * r['notified']:.1f}% of enqueues notified"
        )


if __name__ == "__main__":
    main()
