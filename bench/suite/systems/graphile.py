"""graphile-worker (Node): SQL add_jobs, `graphile-worker --once` (exits when empty)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from bench.suite.envs import npm_prefix, npm_version
from bench.suite.procs import Command, run_checked
from bench.suite.systems.base import System, Variant, base_name, side_by_side

PACKAGES = ["graphile-worker@^0.17.3"]

# Settings are graphile-worker preset options (`preset.worker`). "tuned" is the
# configuration from its performance page (concurrency 24, pool 25, local queue
# of 500, batched completion); "default" is its stock configuration.
VARIANTS = side_by_side(
    (
        Variant("default", {"concurrentJobs": 1, "maxPoolSize": 10}, max_n=10_000),
        Variant(
            "tuned",
            {
                "concurrentJobs": 24,
                "maxPoolSize": 25,
                "localQueue": {"size": 500},
                "completeJobBatchDelay": 0,
                "failJobBatchDelay": 0,
            },
        ),
    )
)

# graphile-worker has no log level setting: its console logger writes every level
# but debug. The preset's `logger` passes on only the levels at or above the run's.
LEVELS = ("error", "warning", "info", "debug")
LOGGER_JS = """\
const {{ Logger, consoleLogFactory }} = require("graphile-worker");
const LEVELS = {levels};
const logger = new Logger((scope) => {{
  const log = consoleLogFactory(scope);
  return (level, message, meta) => {{
    if (LEVELS.indexOf(level) <= {most}) log(level, message, meta);
  }};
}});
"""

ADD_JOBS = """\
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
    FROM generate_series(1, %s)
))"""


class GraphileWorkerSystem(System):
    name = "graphile-worker"
    label = "graphile-worker"
    variants = VARIANTS
    how_run = (
        "Node, async no-op task from a task directory; `graphile-worker --once --config <preset>` "
        "(exits when no job is runnable); the preset's `logger` passes on warning and error "
        "lines only (graphile-worker's default console logger writes info, one line per job); "
        "x2: two such processes on the one queue; jobs added with one "
        "graphile_worker.add_jobs() call"
    )
    idle_how = "graphile-worker --once --config <default preset, logging at warning>"

    @property
    def prefix(self) -> Path:
        return self.ctx.envs_dir / "graphile-worker"

    def unavailable(self) -> str | None:
        if not (shutil.which("node") and shutil.which("npm")):
            return "node/npm not found on PATH"
        return None

    def install(self) -> None:
        npm_prefix(self.ctx.envs_dir, "graphile-worker", PACKAGES, self.ctx.reinstall)
        for variant in self.variants:
            preset = {
                "worker": {
                    "taskDirectory": str(self.ctx.peers_dir / "graphile" / "tasks"),
                    **variant.settings,
                }
            }
            logger = LOGGER_JS.format(
                levels=json.dumps(LEVELS), most=LEVELS.index(variant.log_level)
            )
            self._config(variant).write_text(
                f"{logger}const preset = {json.dumps(preset, indent=2)};\n"
                "preset.worker.logger = logger;\n"
                "module.exports = preset;\n"
            )

    def _config(self, variant: Variant) -> Path:
        return self.prefix / f"{base_name(variant.name)}-{variant.log_level}.config.js"

    def versions(self) -> dict[str, str]:
        node = subprocess.run(
            ["node", "--version"], check=False, capture_output=True, text=True, timeout=30
        )
        return {
            "graphile-worker": npm_version(self.prefix, "graphile-worker"),
            "node": node.stdout.strip().lstrip("v"),
        }

    def _cli(self, dburl: str, variant: Variant, *args: str) -> Command:
        cli = self.prefix / "node_modules" / "graphile-worker" / "dist" / "cli.js"
        return Command(
            [
                "node",
                str(cli),
                "--connection",
                dburl,
                "--config",
                str(self._config(variant)),
                *args,
            ],
            cwd=str(self.prefix),
        )

    def setup(self, dburl: str) -> None:
        cmd = self._cli(dburl, self.variants[0], "--schema-only")
        run_checked(cmd, 300, self.ctx.logdir, "graphile-schema")

    def enqueue(self, dburl: str, n: int) -> None:
        with self.connect(dburl) as conn:
            conn.execute(ADD_JOBS, [n])

    def drain_commands(self, dburl: str, variant: Variant) -> list[Command]:
        return [self._cli(dburl, variant, "--once") for _ in range(variant.processes)]

    def unfinished(self, dburl: str) -> int:
        # graphile-worker deletes a job once it has succeeded.
        return self.count(dburl, "SELECT count(*) FROM graphile_worker._private_jobs")

    def idle_command(self, dburl: str) -> Command | None:
        return self._cli(dburl, self.variants[0], "--once")
