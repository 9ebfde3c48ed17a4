"""The registry of benchmarked systems, in report order.

To add one: subclass bench.suite.systems.base.System in a module here and
list it below.
"""

from __future__ import annotations

from bench.suite.systems.base import Context, Drain, NotRun, System, Variant
from bench.suite.systems.ceiling import Ceiling
from bench.suite.systems.graphile import GraphileWorkerSystem
from bench.suite.systems.jobrunner import JobrunnerSystem
from bench.suite.systems.pgqueuer import PgQueuerSystem
from bench.suite.systems.procrastinate import ProcrastinateSystem

REGISTRY: tuple[type[System], ...] = (
    JobrunnerSystem,
    PgQueuerSystem,
    ProcrastinateSystem,
    GraphileWorkerSystem,
    Ceiling,
)

__all__ = ["REGISTRY", "Context", "Drain", "NotRun", "System", "Variant"]
