"""PgQueuer: `pgq install`, batch enqueue, `pgq run --mode drain` (exits when empty)."""

from __future__ import annotations

from pathlib import Path

from bench.suite.envs import pip_env, pip_version
from bench.suite.procs import Command, run_checked
from bench.suite.systems.base import LOG_LEVEL, System, Variant, side_by_side

# `pgq run` passes its --log-level default through as a plain string under newer
# typer releases and crashes before it starts ('str' object has no attribute
# 'name', pgqueuer 1.6.0 with typer 0.29); typer < 0.20 keeps the CLI working.
REQUIREMENTS = ["pgqueuer[asyncpg]>=0.10,<2", "typer<0.20"]

# Settings are `pgq run` flags. PgQueuer's default batch is 10; its docs
# recommend raising the batch size for many short jobs.
VARIANTS = side_by_side(
    (
        Variant("default", {"--batch-size": 10}),
        Variant("tuned", {"--batch-size": 100}),
    )
)


class PgQueuerSystem(System):
    name = "pgqueuer"
    label = "PgQueuer"
    variants = VARIANTS
    how_run = (
        "asyncpg driver; async no-op entrypoint; `pgq run pgqueuer_app:main --mode drain` "
        "(exits once the queue is empty), `--log-level WARNING`; x2: two such processes on "
        "the one queue; jobs enqueued with Queries.enqueue in batches of 5000"
    )
    idle_how = "pgq run pgqueuer_app:main --mode drain --log-level WARNING"

    @property
    def venv(self) -> Path:
        return self.ctx.envs_dir / "pgqueuer"

    def install(self) -> None:
        pip_env(self.ctx.envs_dir, "pgqueuer", REQUIREMENTS, self.ctx.reinstall)

    def versions(self) -> dict[str, str]:
        return {
            "pgqueuer": pip_version(self.venv, "pgqueuer"),
            "asyncpg": pip_version(self.venv, "asyncpg"),
        }

    def _cmd(self, dburl: str, *args: str) -> Command:
        return Command(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            env={"BENCH_DATABASE_URL": dburl, "PGDSN": dburl},
            cwd=str(self.ctx.peers_dir),
        )

    def setup(self, dburl: str) -> None:
        run_checked(self._cmd(dburl, "pgq", "install"), 300, self.ctx.logdir, "pgqueuer-install")

    def enqueue(self, dburl: str, n: int) -> None:
        cmd = self._cmd(dburl, "python", "pgqueuer_app.py", "enqueue", str(n))
        run_checked(cmd, 600, self.ctx.logdir, "pgqueuer-enqueue")

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        flags = [str(x) for k, v in variant.settings.items() for x in (k, v)]
        flags += ["--log-level", variant.log_level.upper()]
        return [
            self._cmd(dburl, "pgq", "run", "pgqueuer_app:main", "--mode", "drain", *flags)
            for _ in range(variant.processes)
        ]

    def unfinished(self, dburl: str) -> int:
        # PgQueuer deletes a job from its queue table once it is done.
        return self.count(dburl, "SELECT count(*) FROM pgqueuer")

    def idle_command(self, dburl: str) -> Command | None:
        return self._cmd(
            dburl,
            "pgq",
            "run",
            "pgqueuer_app:main",
            "--mode",
            "drain",
            "--log-level",
            LOG_LEVEL.upper(),
        )
