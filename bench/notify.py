"""What notifications cost enqueuers: 8 processes enqueueing one run a transaction at once,
with jobrunner's trigger that notifies (migration 0028) enabled and disabled, nothing else
changed. Run by bench/latency.py, or alone:

    python bench/notify.py --seconds 5 --rounds 3

PostgreSQL serializes the commits of transactions that notify, and the trigger notifies only
while a tick sleeps; so the cost depends on who listens. Each case is measured with the
trigger on and off (`ALTER TABLE job_runs DISABLE TRIGGER job_runs_wake_ticks`), in turns,
`--rounds` times, on a cluster that keeps initdb's durability settings; the table is emptied
before each measurement. Cases:

    no tick               nobody listens: the trigger only tries a lock
    a tick of other types a `tick --listen` that handles none of the runs: it is woken, finds
                          nothing, and lingers when woken at once again and again
    a tick running them   a `tick --listen` that runs them as they come (with the trigger off
                          it never learns of them: its row compares with "no tick", off)
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


def _flood(url: str, seconds: float, job_type: str) -> float:
    """Runs enqueued per second by ENQUEUERS processes at once."""
    start = time.time() + 1.5  # every process started and connected
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "bench" / "peers" / "latency" / "flood.py"), url, job_type]
    procs = [
        subprocess.Popen(
            [*argv, str(start), str(seconds)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(ENQUEUERS)
    ]
    return sum(int(p.communicate(timeout=600)[0]) for p in procs) / seconds


def measure(url: str, *, seconds: float, rounds: int, work: Path) -> dict[str, Any]:
    """Per case, the enqueue throughput with the trigger off and on (medians) and on/off."""
    import psycopg

    found: dict[str, dict[str, list[float]]] = {c: {"off": [], "on": []} for c in CASES}
    with psycopg.connect(url, autocommit=True) as admin:
        for r in range(rounds):
            for case in CASES:
                with _listener(url, case, work):
                    job_type = "latency.probe"
                    for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                        admin.execute("TRUNCATE job_runs CASCADE")
                        toggle = "ENABLE" if mode == "on" else "DISABLE"
                        admin.execute(f"ALTER TABLE job_runs {toggle} TRIGGER job_runs_wake_ticks")
                        rate = _flood(url, seconds, job_type)
                        found[case][mode].append(rate)
                        line = f"  notify: {case:24} trigger {mode:3} {rate:8.0f} runs/s"
                        print(line, flush=True)
        admin.execute("ALTER TABLE job_runs ENABLE TRIGGER job_runs_wake_ticks")
    results = {}
    for case, modes in found.items():
        off, on = statistics.median(modes["off"]), statistics.median(modes["on"])
        results[case] = {"off": off, "on": on, "ratio": on / off, "rounds": modes}
    return results


def main() -> None:
    import tempfile

    import psycopg

    from bench.suite.pgcluster import throwaway_cluster
    from cronjob import migrate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with throwaway_cluster() as cluster, tempfile.TemporaryDirectory() as work:
        url = cluster.createdb("notify")
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.apply(conn)
        results = measure(url, seconds=args.seconds, rounds=args.rounds, work=Path(work))
    for case, r in results.items():
        print(f"{case:24} off {r['off']:8.0f}  on {r['on']:8.0f}  {r['ratio']:.3f}x")


if __name__ == "__main__":
    main()
