"""The benchmark's own logic: which rows it compares, its targets, and the ceiling's
statements, which must be the ones a tick sends."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.suite import ratios, statements
from bench.suite.results import Row
from bench.suite.systems import REGISTRY
from bench.suite.systems.base import Variant, base_name, side_by_side
from bench.suite.systems.ceiling import pgbench_path
from cronjob.queries.runs import (
    _FLOORS,
    _NO_FLOORS,
    RUNS_CLAIM_MANY,
    RUNS_CLAIM_MANY_COLUMNS,
    RUNS_FINALIZE_MANY,
)

KINDS = {cls.name: cls.kind for cls in REGISTRY}


def drain(system: str, variant: str, jobs_per_second: float, procs: int, extra: str = "") -> Row:
    return Row(
        "drain",
        system,
        system,
        variant,
        "jobs/s",
        samples=[jobs_per_second],
        extra={"processes": procs, "extra": extra},
    )


def idle(system: str, ms: float) -> Row:
    return Row("idle", system, system, "one-shot", "ms", samples=[ms])


ROWS = [
    drain("jobrunner", "default", 9000, 1),
    drain("jobrunner", "default x2", 15000, 2),
    drain("jobrunner", "best", 12000, 1),
    drain("jobrunner", "best x2", 20000, 2),
    drain("jobrunner", "default, cold tables", 50000, 1, extra="never analyzed"),
    drain("pgqueuer", "default", 2000, 1),
    drain("pgqueuer", "default x2", 3000, 2),
    drain("procrastinate", "default", 150, 1),
    drain("procrastinate", "default x2", 4000, 2),
    drain("graphile-worker", "default", 500, 1),
    drain("graphile-worker", "default x2", 900, 2),
    drain("graphile-worker", "tuned", 10000, 1),
    drain("graphile-worker", "tuned x2", 12000, 2),
    drain("raw-sql", "pgbench two-commit", 25000, 1),
    drain("raw-sql", "pgbench one-commit", 30000, 1),
    drain("raw-sql", "psycopg core", 14000, 2, extra="core statements"),
    idle("floor", 300),
    idle("jobrunner", 320),
    idle("graphile-worker", 380),
]


def test_every_peer_drains_with_one_and_with_two_processes_of_each_variant():
    from bench.suite.systems.graphile import VARIANTS as GRAPHILE
    from bench.suite.systems.pgqueuer import VARIANTS as PGQUEUER
    from bench.suite.systems.procrastinate import VARIANTS as PROCRASTINATE

    for variants in (GRAPHILE, PGQUEUER, PROCRASTINATE):
        assert [(v.name, v.processes) for v in variants] == [
            ("default", 1),
            ("default x2", 2),
            ("tuned", 1),
            ("tuned x2", 2),
        ]
        assert {v.log_level for v in variants} == {"warning"}
        assert all(v.analyze and not v.extra for v in variants)


def test_side_by_side_keeps_settings_and_caps_and_base_name_undoes_it():
    [one, two] = side_by_side((Variant("tuned", {"--batch-size": 100}, max_n=5),))

    assert (two.name, two.processes, two.settings, two.max_n) == ("tuned x2", 2, one.settings, 5)
    assert base_name(two.name) == base_name(one.name) == "tuned"
    assert base_name("default, cold tables") == "default, cold tables"


def test_jobrunners_extra_rows_are_the_cold_tables_and_the_info_level_default():
    from bench.suite.systems.jobrunner import VARIANTS

    extra = {v.name: (v.analyze, v.log_level) for v in VARIANTS if v.extra}
    assert extra == {
        "default, cold tables": (False, "warning"),
        "default, log info": (True, "info"),
    }
    assert {v.log_level for v in VARIANTS if not v.extra} == {"warning"}


def test_baselines_are_taken_at_the_rows_own_process_count():
    assert ratios.graphile_tuned(ROWS, 1).variant == "tuned"
    assert ratios.graphile_tuned(ROWS, 2).variant == "tuned x2"
    # The fastest peer default differs by process count here.
    assert ratios.best_peer_default(ROWS, KINDS, 1).system == "pgqueuer"
    assert ratios.best_peer_default(ROWS, KINDS, 2).system == "procrastinate"
    assert ratios.ceiling(ROWS).variant == "pgbench two-commit"


def test_the_ceilings_rows_have_no_process_count_to_compare_at():
    [pgbench] = [r for r in ROWS if r.variant == "pgbench one-commit"]
    [mine] = [r for r in ROWS if r.variant == "best x2"]

    assert ratios.worker_processes(pgbench, KINDS) is None
    assert ratios.worker_processes(mine, KINDS) == 2


def test_extra_rows_are_never_a_baseline_nor_a_targets_figure():
    cold_graphile = drain("graphile-worker", "tuned", 1, 1, extra="cold")
    rows = [cold_graphile, *ROWS]

    assert ratios.graphile_tuned(rows, 1) is not cold_graphile
    # jobrunner's cold-table row is the fastest of all, and still not its figure.
    assert ratios.fastest_subject(rows, 1).variant == "best"
    assert ratios.fastest_subject(rows).variant == "best x2"


def test_targets_divide_like_with_like_and_say_by_how_much_one_is_missed():
    one, two, ceiling, idle_, default = ratios.targets(ROWS, KINDS)

    assert one.ratio == pytest.approx(12000 / 10000)
    assert one.figure == "jobrunner best, 1 process / graphile-worker tuned, 1 process"
    assert one.verdict == "missed by 0.30x (needs 25% more)"
    assert two.ratio == pytest.approx(20000 / 12000) and two.verdict == "met"
    assert ceiling.ratio == pytest.approx(20000 / 25000) and ceiling.verdict == "met"
    assert idle_.ratio == pytest.approx(320 / 380) and idle_.below and idle_.verdict == "met"
    assert default.ratio == pytest.approx(9000 / 2000) and default.met


def test_a_missed_time_limit_and_a_missing_row_are_reported_as_such():
    slow_idle = [r for r in ROWS if not (r.section == "idle" and r.system == "jobrunner")]
    slow_idle.append(idle("jobrunner", 418))
    targets = {t.goal: t for t in ratios.targets(slow_idle, KINDS)}
    [idle_target] = [t for goal, t in targets.items() if goal.startswith("idle")]
    assert idle_target.verdict == "missed: 10% over the limit"

    no_graphile = [r for r in ROWS if r.system != "graphile-worker"]
    first = ratios.targets(no_graphile, KINDS)[0]
    assert first.ratio is None and first.verdict == "not measured" and first.met is None


def test_the_targets_table_is_in_the_report_after_drain_and_idle():
    from bench.suite import report

    rep = report.Report(
        command="python bench/run.py",
        date="today",
        machine={},
        server={},
        options={"n": 20000},
        sections=["drain", "idle"],
        systems=[],
        versions={},
        skipped={},
        rows=ROWS,
    )
    titles = [title for title, _, _ in report._tables(rep)]
    assert titles == ["Drain throughput", "Idle one-shot", "Targets"]
    (headers, body), _ = report.targets_table(rep)
    assert headers == ["target", "rows divided", "ratio", "needed", "verdict"]
    assert [row[2] for row in body] == ["1.20x", "1.67x", "0.80x", "0.84x", "4.50x"]


# -- the ceiling's statements ----------------------------------------------------------
def _as_psycopg(sql: str) -> str:
    """A pgbench statement with its variables back as psycopg placeholders."""
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql)


def _placeholders(sql: str) -> str:
    return re.sub(r"%\((\w+)\)[sb]", r"%(\1)s", sql).replace("%(now)s", "NULL")


def test_the_pgbench_finalize_is_the_ticks_finalize():
    assert _as_psycopg(statements.tick_finalize_for_pgbench()) == _placeholders(
        RUNS_FINALIZE_MANY.strip()
    )


def test_the_pgbench_claim_is_the_ticks_claim_up_to_its_final_select():
    claim = _as_psycopg(statements.tick_claim_for_pgbench())
    # A tick's first claim, which resumes from nothing: a full one.
    tick = _placeholders(RUNS_CLAIM_MANY.replace(_FLOORS, _NO_FLOORS).strip())
    head = tick[: tick.index("-- Handed to the workers")]

    assert claim.startswith(head)
    # The tick's final SELECT is kept whole, wrapped to hand back one row.
    assert f"FROM (SELECT {RUNS_CLAIM_MANY_COLUMNS}" in claim
    assert "ORDER BY handed.place) AS handed" in claim


def test_both_pgbench_scripts_send_the_claim_and_the_finalize_in_their_order():
    claim, finalize = statements.tick_claim_for_pgbench(), statements.tick_finalize_for_pgbench()
    two, one = statements.pgbench_two_commit(), statements.pgbench_one_commit()

    assert two.index(claim) < two.index(finalize)
    assert "BEGIN" not in two
    assert one.index("BEGIN;") < one.index(finalize) < one.index(claim) < one.index("COMMIT;")
    variables = set(re.findall(r"(?<!:):(\w+)", two + one))
    assert variables <= set(statements.pgbench_variables(100))


@pytest.mark.parametrize("script", ["pgbench_two_commit", "pgbench_one_commit"])
def test_pgbench_drains_a_queue_with_the_ticks_statements(
    db_url: str, script: str, tmp_path: Path
) -> None:
    pgbench = pgbench_path()
    if pgbench is None:
        pytest.skip("pgbench is not installed")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(statements.ENQUEUE, [250])
    path = tmp_path / "script.sql"
    path.write_text(getattr(statements, script)())
    defines = [f"--define={k}={v}" for k, v in statements.pgbench_variables(100).items()]

    out = subprocess.run(
        [
            pgbench,
            "--no-vacuum",
            "-M",
            "extended",
            "-c",
            "2",
            "-j",
            "2",
            "-t",
            "5",
            *defines,
            "-f",
            str(path),
            db_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PGOPTIONS": statements.CLAIM_PLAN_OPTIONS, "PATH": "/usr/bin:/bin"},
    )

    assert out.returncode == 0, out.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT status, attempts, count(*) FROM job_runs GROUP BY 1, 2"
        ).fetchall()
        attempts = conn.execute("SELECT count(*) FROM job_attempts").fetchone()
    assert rows == [("succeeded", 1, 250)]
    assert attempts == (0,)


def test_the_drain_table_divides_each_row_by_baselines_at_its_own_process_count():
    from bench.suite import report

    pgbench = drain("raw-sql", "pgbench two-commit", 25000, 1)
    pgbench.settings = {"clients": 2, "batch": 100}
    rows = [pgbench if r.variant == "pgbench two-commit" else r for r in ROWS]
    rep = report.Report(
        command="-",
        date="-",
        machine={},
        server={},
        options={"n": 20000},
        sections=["drain"],
        systems=[],
        versions={},
        skipped={},
        rows=rows,
    )

    (headers, body), legend = report.drain_table(rep)
    cells = {(line[0], line[1]): dict(zip(headers, line, strict=True)) for line in body}

    best_x2 = cells["jobrunner", "best x2"]
    assert best_x2["vs graphile-worker tuned (same procs)"] == "1.67x"  # 20,000 / 12,000
    assert best_x2["vs best peer default (same procs)"] == "5.00x"  # / Procrastinate's 4,000
    assert best_x2["vs pgbench two-commit ceiling"] == "0.80x"
    assert cells["jobrunner", "default, cold tables *"]["procs"] == "1"
    ceiling = cells["raw-sql", "pgbench two-commit"]
    assert ceiling["procs"] == "2 clients"
    assert ceiling["vs graphile-worker tuned (same procs)"] == "-"
    assert "pgqueuer (1), procrastinate (2)" in legend


# -- the profile section -------------------------------------------------------------------
MAIN = "<module> (<string>:1);main (cronjob/cli.py:177)"
DRAIN = f"{MAIN};Drain.run (cronjob/tick/drain.py:56)"
THREAD = "Thread._bootstrap (threading.py:995)"
BACKGROUND = f"{THREAD};background (cronjob/tick/connection.py:89)"
RUNS = "(cronjob/store/runs.py:1)"
RAW = "\n".join(
    [
        f"{MAIN};connect (cronjob/db.py:159) 6",
        f"{DRAIN};Pool.collect (cronjob/tick/pool.py:200) 4",
        f"{THREAD};Workers._work_loop (cronjob/tick/workers.py:100) 1",
        f"{BACKGROUND};runs_finalize_and_claim_many {RUNS};_claimed_runs {RUNS} 3",
        f"{BACKGROUND};runs_claim_many {RUNS} 2",
        f"{BACKGROUND};runs_finalize_many {RUNS} 2",
        f"{THREAD};Workers._run (cronjob/tick/workers.py:110);"
        "execute (cronjob/tick/execute.py:40) 1",
        f"{DRAIN};Drain._record (cronjob/tick/drain.py:160) 1",
        f"{DRAIN};Drain._pass (cronjob/tick/drain.py:90) 1",
        "BaseCursor._execute_gen (psycopg/cursor.py:1) 1",  # a stack py-spy could not read whole
    ]
)


def test_a_profiles_samples_go_under_what_their_stack_shows_per_run():
    from bench.suite import profile_section as p

    per_run = p.gil_per_run(RAW, rate=500, runs=1000)  # one sample: 2 us a run

    assert per_run == pytest.approx(
        {
            p.GIL: 44.0,
            p.START_UP: 12.0,
            "handing runs to the worker thread and back": 10.0,
            "decoding the claimed rows": 6.0,
            "the claim: parameters, send, receive": 4.0,
            "writing outcomes: parameters, send, receive": 4.0,
            "calling the handler": 2.0,
            "deciding and recording outcomes": 2.0,
            p.REST: 4.0,  # the loop itself, and the stack py-spy cut short
        }
    )


def test_the_machine_bound_and_what_each_per_process_target_asks_for():
    assert ratios.machine_bound(2, 50.0) == pytest.approx(40_000)
    tuned = [r for r in ROWS if r.system == "graphile-worker" and r.variant.startswith("tuned")]
    for row in tuned:
        row.extra["n"] = 20_000
    # 1.5 x 10,000/s over 20,000 runs: 1.333 s, of which the idle tick's 0.32 s is start-up.
    one, two = ratios.needed_rates(ROWS)
    assert (one.processes, two.processes) == (1, 2)
    assert one.overall == pytest.approx(15_000)
    assert one.once_running == pytest.approx(20_000 / (20_000 / 15_000 - 0.32))
    slow_start = [r for r in ROWS if r.section != "idle"] + [idle("jobrunner", 1500)]
    assert ratios.needed_rates(slow_start)[0].once_running == float("inf")
    no_idle = [r for r in ROWS if r.section != "idle"]
    assert ratios.needed_rates(no_idle)[0].once_running is None  # not known, not impossible


def test_the_profile_table_shows_shares_of_the_lock_and_the_bound():
    from bench.suite import profile_section as p
    from bench.suite import report

    figures = {
        p.WALL: 40.0,
        p.TICK_CPU: 20.0,
        p.SERVER_CPU: 30.0,
        **p.gil_per_run(RAW, rate=500, runs=1000),
    }
    rows = [
        Row("profile", "jobrunner", "jobrunner", what, "us/run", [value], settings={"n": 1000})
        for what, value in figures.items()
    ]
    rep = report.Report(
        command="",
        date="",
        machine={"cores": "2"},
        server={},
        options={},
        sections=["profile"],
        systems=[],
        versions={},
        skipped={},
        rows=ROWS + rows,
    )
    (_headers, body), legend = report.profile_table(rep)

    assert [row[0] for row in body[:4]] == [p.WALL, p.TICK_CPU, p.SERVER_CPU, p.GIL]
    assert body[3][1:] == ["44.0", "100%"]
    assert [f"· {p.START_UP}", "12.0", "27%"] in body  # 6 samples of 22
    assert "50.0 us of CPU a run (start-up included) on 2 cores allows at most 40,000" in legend
    assert "one-process target asks for 15,000 runs/s over the timed drain" in legend
