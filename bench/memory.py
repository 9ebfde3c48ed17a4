"""Benchmark: peak memory of the commands that read input or rows of any size.

    python bench/memory.py                          # 10 MB and 1 GB of JSONL, 1,000 x 1 MB payloads
    python bench/memory.py --jsonl-mb 10,100 --list-runs 200

Creates a scratch database on the server of $JOBRUNNER_DATABASE_URL (or the embedded server),
measures each case once as a real `jobrunner` process, prints a table and drops the database.
Peak memory is the process's peak resident set size (`ru_maxrss`), read when it exits:

- `enqueue --jsonl -` of N megabytes of valid lines (4 KB payloads), streamed into stdin;
- `list --limit L` and `list --limit L --json` over L runs whose payloads are about 1 MB.

Bounded means the same few tens of MiB whatever N and L are. `measure(database_url, ...)`
runs the cases on an existing migrated database, for a harness to call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite.procs import PEAK_OF

REPO = Path(__file__).resolve().parent.parent
MB = 1_000_000
LINE_PAYLOAD = 4_000  # characters of payload per --jsonl line
LIST_PAYLOAD = 990_000  # just under the 1 MB a payload may hold


@dataclass(frozen=True)
class Case:
    name: str
    peak_mib: float
    seconds: float


def _jsonl(size: int) -> Iterator[bytes]:
    """About `size` bytes of valid --jsonl lines, in blocks."""
    blob = "x" * LINE_PAYLOAD
    written = 0
    number = 0
    while written < size:
        block = "".join(
            json.dumps({"type": "bench.memory", "payload": {"n": number + i, "blob": blob}}) + "\n"
            for i in range(256)
        ).encode()
        number += 256
        written += len(block)
        yield block


def peak_of(args: list[str], database_url: str, stdin: Iterator[bytes] | None = None) -> Case:
    """Run `jobrunner ARGS` to completion; its peak RSS and wall time."""
    import time

    env = {**os.environ, "JOBRUNNER_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    # Started by a fresh interpreter (PEAK_OF), which reports the command's own peak:
    # wait4() on a child forked from this harness would report at least the harness's.
    process = subprocess.Popen(
        [sys.executable, "-c", PEAK_OF, sys.executable, "-m", "cronjob", *args],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )

    def feed() -> None:
        assert process.stdin is not None
        try:
            for block in stdin or ():
                process.stdin.write(block)
        except BrokenPipeError:
            pass
        finally:
            process.stdin.close()

    feeder = threading.Thread(target=feed) if stdin is not None else None
    if feeder:
        feeder.start()
    assert process.stderr is not None and process.stdout is not None
    stderr = process.stderr.read()
    peak_kib = process.stdout.read()
    code = process.wait()
    if feeder:
        feeder.join()
    if code != 0:
        raise RuntimeError(f"jobrunner {' '.join(args)} exited {code}: {stderr.decode()[-500:]}")
    return Case(" ".join(args), int(peak_kib) / 1024, time.monotonic() - started)


def _fill_for_list(database_url: str, runs: int) -> None:
    import psycopg

    from cronjob.api import enqueue

    payload = {"blob": "x" * LIST_PAYLOAD}
    with psycopg.connect(database_url) as conn:
        conn.execute("TRUNCATE job_runs CASCADE")
        for _ in range(runs):
            enqueue(conn, "bench.memory.list", payload)
        conn.commit()


def measure(database_url: str, jsonl_mb: list[int], list_runs: int) -> list[Case]:
    """Every case on `database_url` (migrated; its job_runs are emptied between cases)."""
    import psycopg

    cases = []
    for size in jsonl_mb:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("TRUNCATE job_runs CASCADE")
        case = peak_of(["enqueue", "--jsonl", "-"], database_url, _jsonl(size * MB))
        cases.append(Case(f"enqueue --jsonl - ({size:,} MB)", case.peak_mib, case.seconds))
    _fill_for_list(database_url, list_runs)
    for extra in ([], ["--json"]):
        case = peak_of(["list", "--limit", str(list_runs), *extra], database_url)
        name = f"list --limit {list_runs}{' --json' if extra else ''} (1 MB payloads)"
        cases.append(Case(name, case.peak_mib, case.seconds))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE job_runs CASCADE")
    return cases


def _scratch_database() -> tuple[str, str]:
    import psycopg
    from psycopg import conninfo

    from cronjob import migrate
    from cronjob.location import resolve_url

    server, _ = resolve_url(None)
    name = f"jobrunner_bench_memory_{os.getpid()}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo.conninfo_to_dict(server)
    params["dbname"] = name
    url = conninfo.make_conninfo(**params)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
    return server, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/memory.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jsonl-mb", default="10,1000", help="input sizes in MB (default 10,1000)")
    parser.add_argument("--list-runs", type=int, default=1000, help="runs of 1 MB (default 1000)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.jsonl_mb.split(",") if size.strip()]
    import psycopg

    server, url = _scratch_database()
    try:
        cases = measure(url, sizes, args.list_runs)
    finally:
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    width = max(len(case.name) for case in cases)
    print(f"{'case':<{width}}  peak RSS   seconds")
    for case in cases:
        print(f"{case.name:<{width}}  {case.peak_mib:6.1f} MiB  {case.seconds:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
