"""Flow control's cost: the drain with no limits against a baseline commit, a per-tenant
limit against no limit, and the idle tick against the baseline's.

    python bench/flow.py                   # N=20,000, 5 repetitions, baseline `main`
    python bench/flow.py --n 5000 --reps 3 --baseline HEAD~3

On one throwaway cluster (bench/suite/pgcluster.py, as bench/run.py uses). The baseline is
the tree of `--baseline` (git archive, into a temporary directory) run with this checkout's
Python and `PYTHONPATH` pointing at it; each side's databases are migrated by its own code.

- `unlimited drain`: N no-op runs (`bench.noop_handlers`), no tenant, no limit; inserted in
  SQL (not timed), `VACUUM ANALYZE`, `CHECKPOINT`, then one `jobrunner tick` with the drain
  bench's default flags and with its "best" ones, timed until it exits with the queue empty.
  Baseline and this tree alternate, each repetition in the other order (A/B, B/A, ...).
- `per-tenant limit`: this tree only, N runs over 50 tenants, drained with no limit and with
  `jobrunner limit noop --concurrency 2 --per tenant`, alternated the same way.
- `idle tick`: `jobrunner tick` on a migrated, empty database, baseline and this tree
  alternated, 20 times each a repetition.

Prints each case's median jobs/s (or seconds) and the ratios the README quotes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FLAGS = {"default": [], "best": ["--concurrency", "1", "--batch-size", "1000"]}
TENANTS = 50


@contextmanager
def baseline_tree(ref: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jrbench-flow-") as top:
        archive = Path(top) / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run(["git", "archive", ref], cwd=ROOT, stdout=out, check=True)
        tree = Path(top) / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        # The no-op handlers are this tree's: the same for both sides.
        (tree / "bench").mkdir(exist_ok=True)
        (tree / "bench" / "noop_handlers.py").write_text(
            (ROOT / "bench/noop_handlers.py").read_text()
        )
        (tree / "bench" / "__init__.py").touch()
        yield tree


def jobrunner(tree: Path, url: str, *args: str) -> float:
    """Run `jobrunner ARGS` from `tree`; returns its wall time in seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "JOBRUNNER_DATABASE_URL": url}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cronjob", *args],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"jobrunner {' '.join(args)} failed: {done.stderr[-2000:]}")
    return elapsed


def template(cluster, tree: Path, name: str) -> str:
    url = cluster.createdb(name)
    jobrunner(tree, url, "migrate")
    return name


def drain(
    cluster,
    tree: Path,
    tmpl: str,
    n: int,
    flags: list[str],
    *,
    tenants: int = 0,
    limit: list[str] | None = None,
) -> float:
    """Jobs per second of one tick draining `n` no-op runs on a fresh copy of `tmpl`."""
    import psycopg

    name = f"d{time.monotonic_ns()}"
    url = cluster.createdb(name, template=tmpl)
    try:
        tenant = f"'t' || (i % {tenants})" if tenants else "NULL"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO job_runs (job_type, tenant_id) SELECT 'noop', {tenant}"
                f" FROM generate_series(1, {n}) AS i"
            )
            conn.execute("VACUUM ANALYZE")
        if limit:
            jobrunner(tree, url, "limit", "noop", *limit)
        cluster.checkpoint()
        seconds = jobrunner(
            tree,
            url,
            "tick",
            "--handlers",
            "bench.noop_handlers",
            "--log-level",
            "warning",
            "--max-runtime",
            "600s",
            *flags,
        )
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM job_runs WHERE status <> 'succeeded'")
            assert left.fetchone()[0] == 0, "the tick left runs undone"
        return n / seconds
    finally:
        cluster.dropdb(name)


def main(argv: list[str] | None = None) -> int:
    from bench.suite.pgcluster import throwaway_cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline", default="main")
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {}

    def note(case: str, value: float) -> None:
        results.setdefault(case, []).append(value)
        print(f"  {case}: {value:,.1f}", flush=True)

    with baseline_tree(args.baseline) as base, throwaway_cluster() as cluster:
        sides = {
            "baseline": (base, template(cluster, base, "tmpl_base")),
            "this tree": (ROOT, template(cluster, ROOT, "tmpl_this")),
        }
        for rep in range(args.reps):
            print(f"repetition {rep + 1}", flush=True)
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for flags in FLAGS:
                for side in order:
                    tree, tmpl = sides[side]
                    note(
                        f"unlimited drain, {flags}, {side}",
                        drain(cluster, tree, tmpl, args.n, FLAGS[flags]),
                    )
            limited = ["--concurrency", "2", "--per", "tenant"]
            cases = [("no limit", None), ("concurrency 2 per tenant", limited)]
            for label, limit in cases if rep % 2 == 0 else reversed(cases):
                value = drain(
                    cluster, ROOT, sides["this tree"][1], args.n, [], tenants=TENANTS, limit=limit
                )
                note(f"{TENANTS} tenants, {label}", value)
            for side in order:
                tree, _ = sides[side]
                url = cluster.createdb(f"idle{rep}{side[0]}", template=sides[side][1])
                times = [
                    jobrunner(tree, url, "tick", "--handlers", "bench.noop_handlers")
                    for _ in range(20)
                ]
                note(f"idle tick ms, {side}", 1000 * statistics.median(times))
    print("\nmedians")
    medians = {case: statistics.median(values) for case, values in results.items()}
    for case, value in medians.items():
        print(f"  {case}: {value:,.1f}")
    for flags in FLAGS:
        ratio = (
            medians[f"unlimited drain, {flags}, this tree"]
            / medians[f"unlimited drain, {flags}, baseline"]
        )
        print(f"unlimited drain ({flags} flags), this tree / baseline: {ratio:.3f}")
    ratio = (
        medians[f"{TENANTS} tenants, concurrency 2 per tenant"]
        / medians[f"{TENANTS} tenants, no limit"]
    )
    print(f"per-tenant limit / no limit: {ratio:.3f}")
    ratio = medians["idle tick ms, this tree"] / medians["idle tick ms, baseline"]
    print(f"idle tick, this tree / baseline: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
