"""Procrastinate: `procrastinate schema --apply`, batch_defer, `worker --one-shot`."""

from __future__ import annotations

from pathlib import Path

from bench.suite.envs import pip_env, pip_version
from bench.suite.procs import Command, run_checked
from bench.suite.systems.base import LOG_LEVEL, System, Variant, side_by_side

REQUIREMENTS = ["procrastinate>=2,<4", "psycopg[binary,pool]"]

# Settings are `procrastinate worker` flags. Its default concurrency is 1: one
# job at a time, one fetch query per job. Tuned raises the number of jobs one
# worker runs at once (each still fetched by its own query).
VARIANTS = side_by_side(
    (
        Variant("default", {"--concurrency": 1}, max_n=3_000),
        Variant("tuned", {"--concurrency": 10}, max_n=3_000),
    )
)


class ProcrastinateSystem(System):
    name = "procrastinate"
    label = "Procrastinate"
    variants = VARIANTS
    how_run = (
        "PsycopgConnector; async no-op task; `procrastinate --log-level warning worker "
        "--one-shot` (exits when no job is left); x2: two such processes on the one queue; "
        "jobs deferred with batch_defer_async in batches of 5000"
    )
    idle_how = (
        f"procrastinate --log-level {LOG_LEVEL} --app procrastinate_app.app worker --one-shot"
    )

    @property
    def venv(self) -> Path:
        return self.ctx.envs_dir / "procrastinate"

    def install(self) -> None:
        pip_env(self.ctx.envs_dir, "procrastinate", REQUIREMENTS, self.ctx.reinstall)

    def versions(self) -> dict[str, str]:
        return {
            "procrastinate": pip_version(self.venv, "procrastinate"),
            "psycopg": pip_version(self.venv, "psycopg"),
        }

    def _cmd(self, dburl: str, *args: str) -> Command:
        return Command(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            env={"BENCH_DATABASE_URL": dburl, "PYTHONPATH": str(self.ctx.peers_dir)},
            cwd=str(self.ctx.peers_dir),
        )

    def _cli(self, dburl: str, *args: str, level: str = LOG_LEVEL) -> Command:
        return self._cmd(
            dburl, "procrastinate", "--log-level", level, "--app", "procrastinate_app.app", *args
        )

    def setup(self, dburl: str) -> None:
        cmd = self._cli(dburl, "schema", "--apply")
        run_checked(cmd, 300, self.ctx.logdir, "procrastinate-schema")

    def enqueue(self, dburl: str, n: int) -> None:
        cmd = self._cmd(dburl, "python", "procrastinate_app.py", "enqueue", str(n))
        run_checked(cmd, 600, self.ctx.logdir, "procrastinate-enqueue")

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        flags = [str(x) for k, v in variant.settings.items() for x in (k, v)]
        return [
            self._cli(dburl, "worker", "--one-shot", *flags, level=variant.log_level)
            for _ in range(variant.processes)
        ]

    def unfinished(self, dburl: str) -> int:
        return self.count(
            dburl, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )

    def idle_command(self, dburl: str) -> Command | None:
        return self._cli(dburl, "worker", "--one-shot")
