"""What the pytest plugin costs a test suite: 1,000 tests that each enqueue and drain one run
against 1,000 empty tests.

    python bench/testing_plugin.py                  # 1,000 tests, 5 repetitions
    python bench/testing_plugin.py --tests 200 --reps 3

On a throwaway cluster (bench/suite/pgcluster.py, as bench/run.py uses), in a generated
project of its own: a handler module, and two test files of `--tests` tests each, one whose
tests use the `jobrunner` fixture to `enqueue` a run on `jobrunner.conn` and `drain()` it
(asserting one success), one whose tests do nothing. Each repetition runs `pytest -q` on
each file as a process of its own, in turns, and times it whole (interpreter start, the
plugin's session set-up with its one migration, every test). The difference of the medians
is what the plugin costs beyond pytest's own overhead (wall time, and the CPU pytest and the
server spent, which a loaded machine changes far less); the target is a few seconds for
1,000 tests on 2 cores (issue 43). Bytecode is cached, as on a developer's machine: pytest
rewrites the asserts of every module of a package that registers a plugin (jobrunner's
among them), which costs a second or more a session when nothing is cached. Prints a table
and writes it to `bench/TESTING-RESULTS.md`.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_SECONDS = 5.0  # "a few seconds beyond pytest's own overhead", for 1,000 tests


class Sample(NamedTuple):
    wall: float
    client: float  # CPU seconds of the pytest process
    server: float  # CPU seconds of the server's processes meanwhile


FIELDS = Sample._fields

HANDLERS = """
from cronjob import handler


@handler("bench.noop")
def noop(ctx, payload):
    pass
"""

DRAINING = """
import pytest

from cronjob import enqueue


@pytest.mark.parametrize("i", range({tests}))
def test_enqueue_and_drain(jobrunner, i):
    enqueue(jobrunner.conn, "bench.noop", {{"i": i}})
    assert jobrunner.drain().succeeded == 1
"""

EMPTY = """
import pytest


@pytest.mark.parametrize("i", range({tests}))
def test_nothing(i):
    pass
"""


def project(directory: Path, tests: int) -> None:
    (directory / "bench_handlers.py").write_text(HANDLERS)
    (directory / "pytest.ini").write_text("[pytest]\njobrunner_handlers = bench_handlers\n")
    (directory / "test_draining.py").write_text(DRAINING.format(tests=tests))
    (directory / "test_empty.py").write_text(EMPTY.format(tests=tests))


def run_pytest(directory: Path, test_file: str, url: str) -> float:
    """The wall time of `pytest test_file` in `directory`, as a process of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBRUNNER_", "PYTEST_"))}
    # Bytecode cached as on a developer's machine (the untimed first run writes it): else
    # every run compiles, and rewrites the asserts of, every module a plugin's package has.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["JOBRUNNER_TEST_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(directory)]))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"pytest {test_file} failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    return elapsed


def measured(cluster: Any, directory: Path, test_file: str, url: str) -> Sample:
    """One run of `test_file`: its wall time, and the CPU pytest and the server spent."""
    client, server = _children_cpu(), cluster.cpu_seconds()
    wall = run_pytest(directory, test_file, url)
    return Sample(wall, _children_cpu() - client, cluster.cpu_seconds() - server)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def table(tests: int, samples: dict[str, list[Sample]]) -> str:
    """Medians of each case, and the draining case's less the empty one's."""
    rows = [
        f"| case ({tests} tests) | wall s | per test ms | pytest CPU s | server CPU s"
        " | walls (s) |",
        "|---|---|---|---|---|---|",
    ]
    medians = {}
    for name, label in (("empty", "empty tests"), ("draining", "enqueue + drain one run")):
        runs = samples[name]
        medians[name] = Sample(*(statistics.median(getattr(r, f) for r in runs) for f in FIELDS))
        wall, client, server = medians[name]
        walls = ", ".join(f"{r.wall:.2f}" for r in runs)
        rows.append(
            f"| {label} | {wall:.2f} | {wall / tests * 1000:.2f} | {client:.2f} | {server:.2f}"
            f" | {walls} |"
        )
    wall, client, server = (
        getattr(medians["draining"], f) - getattr(medians["empty"], f) for f in FIELDS
    )
    limit = TARGET_SECONDS * tests / 1000
    rows.append(
        f"| the plugin's cost | {wall:.2f} | {wall / tests * 1000:.2f} | {client:.2f} |"
        f" {server:.2f} | target ≤ {limit:.1f} s: {'met' if wall <= limit else 'missed'};"
        f" CPU {(client + server) / tests * 1000:.2f} ms a test |"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000, help="tests in each file")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each file")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    from bench.suite.pgcluster import throwaway_cluster

    samples: dict[str, list[Sample]] = {"empty": [], "draining": []}
    with throwaway_cluster() as cluster, tempfile.TemporaryDirectory(prefix="jrbench-") as top:
        directory = Path(top)
        os.chmod(directory, 0o755)
        project(directory, args.tests)
        url = cluster.createdb("plugin_bench")
        for warm in ("test_draining.py", "test_empty.py"):  # the schema, the bytecode caches
            run_pytest(directory, warm, url)
        for rep in range(args.reps):
            cases = [("empty", "test_empty.py"), ("draining", "test_draining.py")]
            for name, test_file in cases if rep % 2 == 0 else reversed(cases):
                samples[name].append(measured(cluster, directory, test_file, url))
                wall, client, server = samples[name][-1]
                print(
                    f"rep {rep + 1} {name}: {wall:.2f} s, CPU {client:.2f} s pytest,"
                    f" {server:.2f} s server",
                    flush=True,
                )
    result = table(args.tests, samples)
    print(result)
    if not args.no_write:
        load = ", ".join(f"{figure:.1f}" for figure in os.getloadavg())
        machine = (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
            f" load average at the end {load}"
        )
        (ROOT / "bench" / "TESTING-RESULTS.md").write_text(
            "# The pytest plugin's cost\n\n"
            f"`python bench/testing_plugin.py --tests {args.tests} --reps {args.reps}`"
            f" on {machine}, {time.strftime('%Y-%m-%d')}: each file run by a `pytest -q`"
            " process of its own, timed whole (start-up included), medians.\n\n"
            f"{result}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
