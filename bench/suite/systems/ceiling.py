"""The raw-SQL ceiling: jobrunner's schema and its exact claim/finish statements,
driven by the thinnest possible clients. No real worker can beat it on this schema."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import psycopg

from bench.suite.pgcluster import PG_BIN
from bench.suite.procs import Command
from bench.suite.statements import CLAIM_PLAN_OPTIONS, ENQUEUE, UNFINISHED, pgbench_script
from bench.suite.systems.base import System, Variant

BATCH = 100
CLIENTS = 2


def schema_sql(repo_dir: Path) -> str:
    """jobrunner's migrations in order, read from the repository at run time: the same
    tables, indexes and storage settings a tick works on."""
    return "\n".join(path.read_text() for path in sorted((repo_dir / "sql").glob("[0-9]*.sql")))


class Ceiling(System):
    name = "raw-sql"
    label = "raw-SQL ceiling"
    kind = "ceiling"
    # "psycopg" is the baseline the report's ratios name; "psycopg b500" matches
    # jobrunner's default --batch-size.
    variants = (
        Variant("psycopg", {"clients": CLIENTS, "batch": BATCH, "driver": "psycopg 3"}, CLIENTS),
        Variant("psycopg b500", {"clients": CLIENTS, "batch": 500, "driver": "psycopg 3"}, CLIENTS),
        Variant("pgbench", {"clients": CLIENTS, "batch": BATCH, "driver": "pgbench -M extended"}),
    )
    how_run = (
        f"{CLIENTS} client processes, each looping: claim a batch (jobrunner's claim statement, "
        "autocommit) then one finish statement for the batch, until a claim returns nothing; "
        f"PGOPTIONS={CLAIM_PLAN_OPTIONS!r}, the planner settings of a tick's claim. "
        "Schema: jobrunner's migrations (sql/*.sql) read at run time."
    )
    idle_how = "python -m bench.suite.ceiling_client (connect, one empty claim)"

    def unavailable(self) -> str | None:
        if not (self.ctx.repo_dir / "sql" / "0001_initial.sql").exists():
            return "sql/0001_initial.sql not found next to bench/"
        return None

    def versions(self) -> dict[str, str]:
        return {"psycopg": psycopg.__version__}

    def setup(self, dburl: str) -> None:
        with self.connect(dburl) as conn:
            conn.execute(schema_sql(self.ctx.repo_dir))

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
        if variant.name == "pgbench":
            return [self._pgbench(dburl)]
        batch = int(variant.settings.get("batch", BATCH))
        return [self._client(dburl, f"raw-{i}", batch) for i in range(variant.processes)]

    def _pgbench(self, dburl: str) -> Command:
        script = self.ctx.logdir / "ceiling.pgbench.sql"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(pgbench_script(BATCH))
        n = self.count(dburl, UNFINISHED)
        # Each transaction claims a full batch while enough rows are left; two spare
        # transactions per client just claim nothing.
        per_client = -(-n // (BATCH * CLIENTS)) + 2
        pgbench = shutil.which("pgbench", path=str(PG_BIN)) or "pgbench"
        return Command(
            [
                pgbench,
                "--no-vacuum",
                "-M",
                "extended",
                "-c",
                str(CLIENTS),
                "-j",
                str(CLIENTS),
                "-t",
                str(per_client),
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
