"""The ceiling: jobrunner's schema and a tick's own claim and finalize statements,
driven by pgbench with no framework around them. The baseline of the report's
ceiling ratios is `pgbench two-commit`; a psycopg client running the statements'
core stays as an extra row."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from bench.suite.pgcluster import PG_BIN
from bench.suite.procs import Command
from bench.suite.statements import (
    CLAIM_PLAN_OPTIONS,
    ENQUEUE,
    UNFINISHED,
    pgbench_one_commit,
    pgbench_two_commit,
    pgbench_variables,
)
from bench.suite.systems.base import System, Variant

BATCH = 100
CLIENTS = 2
TWO_COMMIT = "pgbench two-commit"
ONE_COMMIT = "pgbench one-commit"
SCRIPTS = {TWO_COMMIT: pgbench_two_commit, ONE_COMMIT: pgbench_one_commit}


def pgbench_path() -> str | None:
    return shutil.which("pgbench", path=str(PG_BIN)) or shutil.which("pgbench")


def schema_sql(repo_dir: Path) -> list[str]:
    """jobrunner's migrations in order, read from the repository at run time: the same
    tables, indexes and storage settings a tick works on. Each is one script, but those
    PostgreSQL refuses to run in a transaction (`CREATE INDEX CONCURRENTLY`), which
    jobrunner applies a statement at a time: their statements each end a line with `;`."""
    scripts = []
    for path in sorted((repo_dir / "sql").glob("[0-9]*.sql")):
        text = path.read_text()
        if text.startswith("-- jobrunner: no transaction"):
            scripts.extend(part + ";" for part in text.split(";\n") if part.strip(" \n;"))
        else:
            scripts.append(text)
    return scripts


class Ceiling(System):
    name = "raw-sql"
    label = "raw-SQL ceiling"
    kind = "ceiling"
    # "pgbench two-commit" is the baseline the report's ceiling ratios name. pgbench
    # runs its clients as threads of one process.
    variants = (
        Variant(
            TWO_COMMIT,
            {"clients": CLIENTS, "batch": BATCH, "commits": "claim, then finalize"},
        ),
        Variant(
            ONE_COMMIT,
            {"clients": CLIENTS, "batch": BATCH, "commits": "finalize-and-claim"},
        ),
        Variant(
            "psycopg core",
            {"clients": CLIENTS, "batch": BATCH, "driver": "psycopg 3, core statements"},
            CLIENTS,
            extra="psycopg client, statements reduced to their core: not the ceiling",
        ),
    )
    how_run = (
        f"`pgbench -M extended -c {CLIENTS} -j {CLIENTS}` running the tick's own "
        "queries.runs.RUNS_CLAIM_MANY and queries.runs.RUNS_FINALIZE_MANY (read from "
        "cronjob.queries.runs at run time; parameters as pgbench variables, the claim's last "
        "SELECT wrapped to hand back its ids as one array row), batch 100, each client until "
        "its claim finds nothing. two-commit: the claim commits, then the finalize of that "
        "batch commits (one round trip each, as in a tick). one-commit: finalize the previous "
        "batch and claim the next in one transaction, as a busy tick does (three round trips "
        "where the tick pipelines one: pgbench cannot keep a result inside a pipeline). "
        f"PGOPTIONS={CLAIM_PLAN_OPTIONS!r}, the planner settings of a tick's claim "
        "(queries.runs.RUNS_CLAIM_MANY_PLAN). psycopg core: 2 client processes looping a "
        "claim and a finish reduced to their core (bench/suite/statements.py). "
        "Schema: jobrunner's migrations (sql/*.sql) read at run time."
    )
    idle_how = "python -m bench.suite.ceiling_client (connect, one empty claim)"

    def unavailable(self) -> str | None:
        if not (self.ctx.repo_dir / "sql" / "0001_initial.sql").exists():
            return "sql/0001_initial.sql not found next to bench/"
        if importlib.util.find_spec("cronjob") is None:
            return "the cronjob package (the tick's statements) is not importable"
        if pgbench_path() is None:
            return f"pgbench not found in {PG_BIN} nor on PATH"
        return None

    def versions(self) -> dict[str, str]:
        out = subprocess.run(
            [pgbench_path() or "pgbench", "--version"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        words = out.stdout.split()  # pgbench (PostgreSQL) 15.18 (Debian ...)
        pgbench = words[2] if len(words) > 2 else "unknown"
        return {"pgbench": pgbench, "psycopg": psycopg.__version__}

    def setup(self, dburl: str) -> None:
        with self.connect(dburl) as conn:
            for script in schema_sql(self.ctx.repo_dir):
                conn.execute(script)

    def enqueue(self, dburl: str, n: int) -> None:
        with self.connect(dburl) as conn:
            conn.execute(ENQUEUE, [n])

    def _client(self, dburl: str, worker: str, batch: int = BATCH) -> Command:
        return Command(
            [sys.executable, "-m", "bench.suite.ceiling_client", dburl, str(batch), worker],
            env={"PYTHONPATH": str(self.ctx.repo_dir), "PGOPTIONS": CLAIM_PLAN_OPTIONS},
            cwd=str(self.ctx.repo_dir),
        )

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        if variant.name in SCRIPTS:
            return [self._pgbench(dburl, variant.name)]
        batch = int(variant.settings.get("batch", BATCH))
        return [self._client(dburl, f"raw-{i}", batch) for i in range(variant.processes)]

    def _pgbench(self, dburl: str, variant: str) -> Command:
        script = self.ctx.logdir / f"ceiling.{variant.replace(' ', '-')}.pgbench.sql"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(SCRIPTS[variant]())
        n = self.count(dburl, UNFINISHED)
        # Enough transactions for one client to drain everything alone, and one to find
        # nothing; once a client's claim is empty, its script skips the rest (\if :n > 0),
        # so the spare transactions cost no round trip.
        per_client = -(-n // BATCH) + 2
        defines = [f"--define={k}={v}" for k, v in pgbench_variables(BATCH).items()]
        return Command(
            [
                pgbench_path() or "pgbench",
                "--no-vacuum",
                "-M",
                "extended",
                "-c",
                str(CLIENTS),
                "-j",
                str(CLIENTS),
                "-t",
                str(per_client),
                *defines,
                "-f",
                str(script),
                dburl,
            ],
            env={"PGOPTIONS": CLAIM_PLAN_OPTIONS},
        )

    def unfinished(self, dburl: str) -> int:
        return self.count(dburl, UNFINISHED)

    def idle_command(self, dburl: str) -> Command | None:
        return self._client(dburl, "idle")
