"""Time (or profile) `jobrunner tick` draining no-op runs, alternating source trees.

A standalone helper for A/B measurements of the tick's per-run cost: each
`--tree NAME=DIR` is a checkout of jobrunner (DIR/cronjob), run with this
Python; the trees take turns, A B A B, on one throwaway cluster, every drain on
a fresh database that was loaded and then `VACUUM ANALYZE`d. Prints jobs/s per
drain and the median per tree.

    python bench/profile_tick.py --tree main=/tmp/base --tree new=. --n 50000 --reps 3 \
        -- --concurrency 1 --batch-size 1000
    python bench/profile_tick.py --tree new=. --n 50000 --reps 1 \
        --py-spy "record --format speedscope -o /tmp/tick.json" -- --concurrency 1

Arguments after `--` are the tick's flags; `--log-level warning` is added.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from bench.suite.pgcluster import throwaway_cluster

HANDLERS = "bench.noop_handlers"
MAIN = "from cronjob.cli import main; main()"
BENCH_DIR = Path(__file__).resolve().parent


def jobrunner(
    tree: Path, url: str, *args: str, stdin: bytes | None = None, prefix: Sequence[str] = ()
) -> list[Any]:
    """argv, environment and stdin of `jobrunner ARGS` run from `tree`."""
    env = dict(
        os.environ, JOBRUNNER_DATABASE_URL=url, PYTHONPATH=f"{tree}{os.pathsep}{BENCH_DIR.parent}"
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # JRPROFILE_MAIN: a script to run instead of the command line (it calls cronjob.cli.main).
    script = os.environ.get("JRPROFILE_MAIN") if args[0] == "tick" else None
    # -P: the working directory (or the script's) is not put first on sys.path, so the
    # tree's cronjob is the one imported, whatever directory this runs from.
    argv = [*prefix, sys.executable, "-P", *([script] if script else ["-c", MAIN]), *args]
    return [argv, env, stdin]


def run(cmd: list[Any], timeout: float = 900) -> None:
    argv, env, stdin = cmd
    subprocess.run(
        argv, env=env, input=stdin, check=True, timeout=timeout, stdout=subprocess.DEVNULL
    )


def drain(cluster: Any, name: str, tree: Path, args: argparse.Namespace, i: int) -> float:
    db = f"p_{name}_{i}".lower()
    url = cluster.createdb(db)
    try:
        run(jobrunner(tree, url, "migrate"))
        run(
            jobrunner(
                tree,
                url,
                "enqueue",
                "--jsonl",
                "-",
                stdin=b'{"type":"noop","payload":{}}\n' * args.n,
            )
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        cluster.checkpoint()
        prefix = shlex.split(args.wrap)
        if args.py_spy:
            prefix += [str(Path(sys.executable).parent / "py-spy"), *shlex.split(args.py_spy), "--"]
        tick = [
            "tick",
            "--handlers",
            HANDLERS,
            "--max-runtime",
            "600s",
            "--log-level",
            "warning",
            *args.flags,
        ]
        started, server = time.monotonic(), cluster.cpu_seconds()
        client = os.times()
        procs = [
            subprocess.Popen(c[0], env=c[1], stdout=subprocess.DEVNULL)
            for c in [jobrunner(tree, url, *tick, prefix=prefix) for _ in range(args.procs)]
        ]
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise SystemExit(f"tick exited {p.returncode}")
        elapsed = time.monotonic() - started
        server = cluster.cpu_seconds() - server
        after = os.times()
        client = (
            after.children_user
            + after.children_system
            - client.children_user
            - client.children_system
        )
        print(
            f"  per run: {elapsed / args.n * 1e6:.1f} us wall, {client / args.n * 1e6:.1f} us"
            f" tick CPU, {server / args.n * 1e6:.1f} us server CPU",
            flush=True,
        )
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM job_runs WHERE status <> 'succeeded'")
            if (count := left.fetchone()[0]) != 0:
                raise SystemExit(f"{count} runs not succeeded")
        return args.n / elapsed
    finally:
        cluster.dropdb(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--py-spy", default="", help="py-spy arguments, e.g. 'top' or 'record ...'")
    parser.add_argument("--wrap", default="", help="a command line to run the tick under")
    parser.add_argument("flags", nargs="*")
    args = parser.parse_args()
    trees = [(n, Path(d).resolve()) for n, d in (t.split("=", 1) for t in args.tree)]
    rates: dict[str, list[float]] = {name: [] for name, _ in trees}
    with throwaway_cluster() as cluster:
        for i in range(args.reps):
            for name, tree in trees:
                rate = drain(cluster, name, tree, args, i)
                rates[name].append(rate)
                print(f"{name:>10} rep {i}: {rate:8.0f} jobs/s", flush=True)
    for name, values in rates.items():
        print(
            f"{name:>10} median {statistics.median(values):8.0f} jobs/s  "
            f"({' '.join(f'{v:.0f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
