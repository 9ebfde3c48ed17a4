"""The drain and the idle tick of two revisions of jobrunner, alternated in one run.

    python bench/ab.py --base 4dcfa6b                 # that commit against this working tree
    python bench/ab.py --base main --head HEAD~3      # two commits
    python bench/ab.py --base main --head-flag JOBRUNNER_X=1   # one tree, two environments

A change that must leave the hot paths as they were ("the drain within 3%") is measured
here. Each side is its own source tree (`git archive` of the revision, or this working tree)
with its own database on one throwaway cluster, migrated by its own `jobrunner migrate`. Each
round, in an order that alternates, both sides enqueue `--n` no-op runs, VACUUM ANALYZE, and
drain them with one `jobrunner tick` with the best flags; then each runs `--idle-runs` idle
ticks, interleaved. Finished runs are deleted before each enqueue, so both tables stay in the
same steady state. Other load on the machine falls on both sides alike.

Prints each side's median runs/s and idle-tick time and their ratio (head over base), and
writes them to `--out` (bench/ab-results.json). The Python is this one's, with the project's
dependencies installed (`pip install -e .`); PYTHONPATH points each side at its own tree.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.suite.pgcluster import throwaway_cluster  # noqa: E402

BEST = ["--concurrency", "1", "--batch-size", "1000"]
TICK = ["tick", "--handlers", "bench.noop_handlers", "--max-runtime", "600s"]
QUIET = ["--log-level", "warning"]


@dataclass
class Side:
    label: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    drains: list[float] = field(default_factory=list)  # runs/s
    idles: list[float] = field(default_factory=list)  # seconds

    def run(self, *args: str, stdin: bytes | None = None) -> None:
        env = {
            **os.environ,
            **self.env,
            "PYTHONPATH": str(self.tree),
            "JOBRUNNER_DATABASE_URL": self.url,
        }
        command = [sys.executable, "-m", "cronjob", *args]
        result = subprocess.run(
            command, cwd=self.tree, env=env, input=stdin, capture_output=True, check=False
        )
        if result.returncode != 0:
            detail = result.stderr.decode(errors="replace").strip()[-400:]
            raise SystemExit(f"{self.label}: {' '.join(args)} exited {result.returncode}: {detail}")


def _tree(revision: str | None, into: Path) -> Path:
    """This working tree for None, else the revision's files unpacked into `into`."""
    if revision is None:
        return ROOT
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _drain(side: Side, n: int) -> None:
    _sql(side.url, "DELETE FROM job_runs WHERE finished_at IS NOT NULL")
    side.run("enqueue", "--jsonl", "-", stdin=b'{"type":"noop","payload":{}}\n' * n)
    _sql(side.url, "VACUUM ANALYZE")
    started = time.perf_counter()
    side.run(*TICK, *BEST, *QUIET)
    side.drains.append(n / (time.perf_counter() - started))


def _idle(side: Side) -> None:
    started = time.perf_counter()
    side.run(*TICK, *QUIET)
    side.idles.append(time.perf_counter() - started)


def _sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def measure(base: Side, head: Side, *, n: int, rounds: int, idle_runs: int) -> None:
    for number in range(rounds):
        order = (base, head) if number % 2 == 0 else (head, base)
        for side in order:
            _drain(side, n)
        for _ in range(idle_runs):
            for side in order:
                _idle(side)
        print(
            f"round {number + 1}/{rounds}: "
            + ", ".join(f"{s.label} {s.drains[-1]:,.0f} runs/s" for s in order),
            flush=True,
        )


def report(base: Side, head: Side, out: Path, settings: dict[str, object]) -> None:
    rows = []
    for what, unit, pick in (
        ("drain", "runs/s", lambda s: statistics.median(s.drains)),
        ("idle tick", "ms", lambda s: statistics.median(s.idles) * 1000),
    ):
        b, h = pick(base), pick(head)
        rows.append({"what": what, "unit": unit, "base": b, "head": h, "ratio": h / b})
    print()
    print(f"{'':<10} {'base ' + base.label:>24} {'head ' + head.label:>24} {'head/base':>10}")
    for row in rows:
        cells = [f"{row[k]:>20,.1f} {row['unit']:<3}" for k in ("base", "head")]
        print(f"{row['what']:<10} {cells[0]} {cells[1]} {row['ratio']:>10.3f}")
    raw = {
        side.label: {"drains_runs_per_s": side.drains, "idle_seconds": side.idles}
        for side in (base, head)
    }
    out.write_text(json.dumps({"settings": settings, "medians": rows, "raw": raw}, indent=2))
    print(f"\nwritten to {out}")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision measured against")
    parser.add_argument("--head", help="the revision measured (default: this working tree)")
    parser.add_argument(
        "--head-flag",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable set for the head side only (repeatable)",
    )
    parser.add_argument("--n", type=int, default=20_000, help="runs per drain (20,000)")
    parser.add_argument("--rounds", type=int, default=6, help="drains per side (6)")
    parser.add_argument("--idle-runs", type=int, default=5, help="idle ticks per round (5)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "ab-results.json")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    head_env = dict(flag.split("=", 1) for flag in args.head_flag)
    with (
        tempfile.TemporaryDirectory(prefix="jobrunner-ab-") as scratch,
        throwaway_cluster() as cluster,
    ):
        base = Side(args.base, _tree(args.base, Path(scratch) / "base"))
        head = Side(args.head or "working tree", _tree(args.head, Path(scratch) / "head"), head_env)
        for name, side in (("ab_base", base), ("ab_head", head)):
            side.url = cluster.createdb(name)
            side.run("migrate")
        measure(base, head, n=args.n, rounds=args.rounds, idle_runs=args.idle_runs)
        settings = {
            "base": args.base,
            "head": args.head or "working tree",
            "head_env": head_env,
            "n": args.n,
            "rounds": args.rounds,
            "idle_runs": args.idle_runs,
            "flags": BEST,
            "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        report(base, head, args.out, settings)


if __name__ == "__main__":
    main()
