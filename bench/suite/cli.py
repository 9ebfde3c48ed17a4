"""`python bench/run.py`: options, one throwaway cluster, the sections, the report."""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from bench.suite import procs
from bench.suite.pgcluster import PG_BIN, Cluster, throwaway_cluster
from bench.suite.report import (
    Report,
    load_average,
    machine,
    print_tables,
    write_json,
    write_markdown,
)
from bench.suite.sections import SECTIONS, Bench, Options, log
from bench.suite.systems import REGISTRY, Context

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BENCH_DIR.parent

QUICK = Options(
    n=2_000,
    reps=1,
    idle_runs=10,
    history_rows=100_000,
    enqueue_n=10_000,
    claim_probes=20,
    memory_jsonl_mb=(10, 100),
    memory_list_runs=100,
    profile_n=10_000,
    cap_scale=0.25,
)
FULL = Options()


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _size_options(p: argparse.ArgumentParser) -> None:
    """How much each section measures; each defaults to the full run's size."""
    p.add_argument("--n", type=int, help=f"jobs per drain (default {FULL.n:,})")
    p.add_argument("--reps", type=int, help=f"repetitions, median reported (default {FULL.reps})")
    p.add_argument(
        "--idle-runs", type=int, help=f"timed runs per idle command (default {FULL.idle_runs})"
    )
    p.add_argument(
        "--history-rows",
        type=int,
        help=f"finished runs for the growth section (default {FULL.history_rows:,})",
    )
    p.add_argument(
        "--enqueue-n",
        type=int,
        help=f"runs for the bulk enqueue section (default {FULL.enqueue_n:,})",
    )
    p.add_argument(
        "--memory-jsonl-mb",
        type=lambda text: tuple(int(size) for size in _csv(text)),
        help="sizes of the --jsonl inputs of the memory section, in MB "
        f"(default {','.join(map(str, FULL.memory_jsonl_mb))})",
    )
    p.add_argument(
        "--memory-list-runs",
        type=int,
        help=f"1 MB runs that list reads in the memory section (default {FULL.memory_list_runs})",
    )
    p.add_argument(
        "--profile-n",
        type=int,
        help=f"runs each profiled drain takes (default {FULL.profile_n:,})",
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    names = [cls.name for cls in REGISTRY]
    p = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="Benchmark jobrunner against PgQueuer, Procrastinate, graphile-worker and "
        "a pgbench ceiling running the tick's own statements, on a throwaway PostgreSQL "
        "cluster.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small and fast: N={QUICK.n}, 1 repetition, "
        f"{QUICK.history_rows:,} history rows, {QUICK.enqueue_n:,} enqueued",
    )
    p.add_argument(
        "--only",
        type=_csv,
        default=list(SECTIONS),
        help=f"comma-separated sections (default all): {','.join(SECTIONS)}",
    )
    p.add_argument(
        "--systems",
        type=_csv,
        default=names,
        help=f"comma-separated systems (default all): {','.join(names)}",
    )
    _size_options(p)
    p.add_argument(
        "--no-cap",
        action="store_true",
        help="drain --n jobs in every variant, also the slow ones that are capped "
        "to keep a full run under 30 minutes",
    )
    p.add_argument(
        "--reinstall",
        action="store_true",
        help="recreate the peers' environments under bench/.envs/",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR,
        help="directory for RESULTS.md and results.json (default bench/)",
    )
    p.add_argument(
        "--no-write",
        action="store_true",
        help="print the tables only; leave RESULTS.md and results.json alone",
    )
    args = p.parse_args(argv)
    unknown = [s for s in args.only if s not in SECTIONS]
    unknown += [s for s in args.systems if s not in names]
    if unknown:
        p.error(f"unknown section or system: {', '.join(unknown)}")
    if "rss" in args.only and "drain" not in args.only:
        args.only.append("drain")  # peak RSS is read from the drain runs
    for name in ("n", "reps", "idle_runs", "history_rows", "enqueue_n"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def options(args: argparse.Namespace) -> Options:
    base = QUICK if args.quick else FULL
    return Options(
        n=args.n or base.n,
        reps=args.reps or base.reps,
        idle_runs=args.idle_runs or base.idle_runs,
        history_rows=args.history_rows or base.history_rows,
        enqueue_n=args.enqueue_n or base.enqueue_n,
        claim_probes=base.claim_probes,
        cap=not args.no_cap,
        cap_scale=base.cap_scale,
        memory_jsonl_mb=args.memory_jsonl_mb or base.memory_jsonl_mb,
        memory_list_runs=args.memory_list_runs or base.memory_list_runs,
        profile_n=args.profile_n or base.profile_n,
    )


def _prune_logs(logs: Path, keep: int = 4) -> None:
    """Worker logs run to ~100 MB a full run: keep the newest few runs' only."""
    if logs.is_dir():
        for old in sorted(p for p in logs.iterdir() if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(
    cluster: Cluster,
    args: argparse.Namespace,
    opts: Options,
    sections: list[str],
    command: str,
    logdir: Path,
) -> Report:
    load_at_start = load_average()
    log(f"PostgreSQL on {cluster.url('')} (data in {cluster.root}); logs in {logdir}")
    ctx = Context(
        cluster=cluster,
        bench_dir=BENCH_DIR,
        repo_dir=REPO_DIR,
        envs_dir=BENCH_DIR / ".envs",
        logdir=logdir,
        reinstall=args.reinstall,
    )
    systems = [cls(ctx) for cls in REGISTRY if cls.name in args.systems]
    bench = Bench(ctx, opts, systems)
    bench.prepare()
    bench.run(sections)
    return Report(
        command=command,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        machine={
            **machine(REPO_DIR),
            "load average at start": load_at_start,
            "load average at end": load_average(),
        },
        server=cluster.settings(),
        options={**opts.__dict__, "systems": ",".join(args.systems)},
        sections=sections,
        systems=systems,
        versions=bench.versions,
        skipped=bench.skipped,
        rows=bench.rows,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    opts = options(args)
    sections = [s for s in SECTIONS if s in args.only]
    command = shlex.join(["python", "bench/run.py", *(sys.argv[1:] if argv is None else argv)])
    if not (PG_BIN / "initdb").exists():
        print(
            f"PostgreSQL server binaries not found in {PG_BIN} (set JRBENCH_PG_BIN)",
            file=sys.stderr,
        )
        return 1
    # Ctrl-C and SIGTERM both end the run cleanly, also when started in the background
    # (where a shell leaves SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    logdir = BENCH_DIR / ".envs" / "logs" / time.strftime("%Y%m%d-%H%M%S")
    _prune_logs(logdir.parent)
    started = time.monotonic()
    try:
        with throwaway_cluster() as cluster:
            try:
                report = _run(cluster, args, opts, sections, command, logdir)
            finally:
                # Workers first, so the cluster can stop without waiting on them.
                procs.kill_all()
    except KeyboardInterrupt:
        print("\ninterrupted: workers killed, cluster stopped and removed", file=sys.stderr)
        return 130
    print_tables(report)
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        write_markdown(report, args.out / "RESULTS.md")
        write_json(report, args.out / "results.json")
        log(f"wrote {args.out / 'RESULTS.md'} and {args.out / 'results.json'}")
    log(f"done in {time.monotonic() - started:.0f}s")
    return 0
