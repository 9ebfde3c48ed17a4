"""A soak: repeated enqueue-and-drain cycles, clean and then while a snapshot is held open.

    python bench/soak.py                        # 12 cycles of 25,000 runs per phase
    python bench/soak.py --cycles 4 --n 25000 --systems jobrunner

A PostgreSQL queue's worst day is a slow death, not a cold start: an analytics query or a
forgotten `BEGIN` holds a snapshot for minutes, VACUUM cannot remove the dead rows every
claim and finish leaves behind, and each claim walks further through them. This measures it.

Each system (jobrunner with its best flags, graphile-worker tuned: the harness's own
definitions in bench/suite/systems) gets a database of its own on one throwaway cluster.
Each cycle enqueues `--n` no-op jobs (not timed), runs VACUUM ANALYZE (as autovacuum would),
and times one drain until nothing is left. First `--cycles` cycles with nothing held (the
clean phase), then `--cycles` more while a session in each database holds a REPEATABLE READ
snapshot taken before the held phase's first enqueue (the held phase): VACUUM then removes
nothing that phase made. The systems take turns within each cycle, in an order that
alternates, so other load on the machine falls on both alike.

Prints, per system, each cycle's jobs/s, the clean median, the held phase's first, last and
median, and last-held over clean-median; then the two targets (jobrunner's last held cycle
within 15% of its clean median; jobrunner's held median above graphile-worker's). Writes the
table to `--out` (bench/SOAK-RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.suite.pgcluster import throwaway_cluster  # noqa: E402
from bench.suite.systems import REGISTRY, Context, System  # noqa: E402

VARIANTS = {"jobrunner": "best", "graphile-worker": "tuned"}
DRAIN_TIMEOUT = 900  # seconds: only bounds a hung drain


class Soaked:
    """One system's database, its drain variant and what each cycle measured."""

    def __init__(self, system: System, url: str) -> None:
        self.system = system
        self.url = url
        self.variant = next(v for v in system.variants if v.name == VARIANTS[system.name])
        self.rates: dict[str, list[float]] = {"clean": [], "held": []}
        self.holder: psycopg.Connection | None = None

    def cycle(self, phase: str, n: int) -> None:
        self.system.enqueue(self.url, n)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        drain = self.system.drain(self.url, self.variant, DRAIN_TIMEOUT)
        left = self.system.unfinished(self.url)
        if left:
            raise SystemExit(f"{self.system.label}: {left} jobs left after a drain")
        self.rates[phase].append(n / drain.seconds)

    def hold(self) -> None:
        """A snapshot taken now and kept: nothing that dies after it can be vacuumed."""
        self.holder = psycopg.connect(self.url)
        self.holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.holder.execute("SELECT count(*) FROM pg_class").fetchone()

    def release(self) -> None:
        if self.holder is not None:
            self.holder.close()
            self.holder = None


def soak(soaked: list[Soaked], *, cycles: int, n: int) -> None:
    for phase in ("clean", "held"):
        if phase == "held":
            for s in soaked:
                s.hold()
        try:
            for number in range(cycles):
                order = soaked if number % 2 == 0 else soaked[::-1]
                for s in order:
                    s.cycle(phase, n)
                figures = ", ".join(f"{s.system.label} {s.rates[phase][-1]:,.0f}" for s in order)
                print(f"{phase} cycle {number + 1}/{cycles}: {figures} jobs/s", flush=True)
        finally:
            for s in soaked:
                s.release()


def report(soaked: list[Soaked], settings: str) -> list[str]:
    lines = [
        settings,
        "",
        "| system | clean median | held first | held last | held median | last / clean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in soaked:
        clean, held = statistics.median(s.rates["clean"]), s.rates["held"]
        lines.append(
            f"| {s.system.label} ({s.variant.name}) | {clean:,.0f} | {held[0]:,.0f} "
            f"| {held[-1]:,.0f} | {statistics.median(held):,.0f} | {held[-1] / clean:.2f} |"
        )
    lines += ["", "Each cycle (jobs/s):", ""]
    for s in soaked:
        for phase, rates in s.rates.items():
            lines.append(f"- {s.system.label}, {phase}: " + ", ".join(f"{r:,.0f}" for r in rates))
    by_name = {s.system.name: s for s in soaked}
    jobrunner, graphile = by_name.get("jobrunner"), by_name.get("graphile-worker")
    lines.append("")
    if jobrunner is not None:
        clean = statistics.median(jobrunner.rates["clean"])
        last = jobrunner.rates["held"][-1]
        verdict = "met" if last >= 0.85 * clean else "missed"
        lines.append(
            f"- target: jobrunner's last held cycle within 15% of its clean median: "
            f"{last:,.0f} vs {clean:,.0f} = {last / clean:.2f}, {verdict}"
        )
    if jobrunner is not None and graphile is not None:
        ours = statistics.median(jobrunner.rates["held"])
        theirs = statistics.median(graphile.rates["held"])
        verdict = "met" if ours > theirs else "missed"
        lines.append(
            f"- target: jobrunner's held median above graphile-worker's: {ours:,.0f} vs "
            f"{theirs:,.0f} = {ours / theirs:.2f}x, {verdict}"
        )
    return lines


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=25_000, help="jobs per cycle (25,000)")
    parser.add_argument("--cycles", type=int, default=12, help="cycles per phase (12)")
    parser.add_argument(
        "--systems",
        default="jobrunner,graphile-worker",
        help="comma-separated, of jobrunner and graphile-worker (default both)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "SOAK-RESULTS.md")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    wanted = args.systems.split(",")
    with (
        tempfile.TemporaryDirectory(prefix="jobrunner-soak-") as logs,
        throwaway_cluster() as cluster,
    ):
        ctx = Context(
            cluster=cluster,
            bench_dir=ROOT / "bench",
            repo_dir=ROOT,
            envs_dir=ROOT / "bench" / ".envs",
            logdir=Path(logs),
        )
        soaked = []
        for cls in REGISTRY:
            if cls.name not in wanted:
                continue
            system = cls(ctx)
            if why := system.unavailable():
                print(f"{system.label}: not run: {why}", file=sys.stderr)
                continue
            system.install()
            url = cluster.createdb(f"soak_{system.name.replace('-', '_')}")
            system.setup(url)
            soaked.append(Soaked(system, url))
        soak(soaked, cycles=args.cycles, n=args.n)
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = report(soaked, f"{args.cycles} cycles of {args.n:,} jobs per phase; {at}")
    print("\n".join(lines))
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
