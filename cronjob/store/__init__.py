"""One function per query: takes a connection, returns models, never commits on its own.

With cronjob.queries, the only code that executes SQL. Each function bears the name of
its statement (`runs_finalize_many` runs RUNS_FINALIZE_MANY); a function that needs
more than one statement names the others after itself plus a qualifier. The modules
follow those of cronjob.queries, one for one: `store.runs` runs `queries.runs`, and so
on, each async twin beside its function.

All of them are reached through this one, `store.<name>`:
- `preflight`, what runs before anything is known: migrating, checking the schema
  version, asking whether a tick has work. It builds no models, so an idle tick,
  which asks and leaves, never imports them.
- the rest (`runs`, `enqueue`, `definitions`, `tally`, `effects`, `incidents`, `limits`,
  `listen`, `tasks`, `server`, `dashboard`, `batches`, `dependencies`), which read and
  write as models: each imported the first time one of its names is used.
- `testing`, the pytest plugin's (cronjob.testing), searched last.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cronjob.store.preflight import (
    advisory_lock,
    handlers_seen_missing_due,
    handlers_seen_record,
    lock_wait_limits,
    migration_activity,
    migration_apply,
    migration_apply_alone,
    migrations_create_table,
    migrations_get_latest_version,
    migrations_list_applied,
    migrations_lock,
    migrations_lock_alone,
    tick_enter,
    tick_work_exists,
)

if TYPE_CHECKING:
    from cronjob.store.batches import *  # noqa: F403
    from cronjob.store.dashboard import *  # noqa: F403
    from cronjob.store.definitions import *  # noqa: F403
    from cronjob.store.dependencies import *  # noqa: F403
    from cronjob.store.effects import *  # noqa: F403
    from cronjob.store.enqueue import *  # noqa: F403
    from cronjob.store.incidents import *  # noqa: F403
    from cronjob.store.limits import *  # noqa: F403
    from cronjob.store.listen import *  # noqa: F403
    from cronjob.store.runs import *  # noqa: F403
    from cronjob.store.server import *  # noqa: F403
    from cronjob.store.tally import *  # noqa: F403
    from cronjob.store.tasks import *  # noqa: F403
    from cronjob.store.testing import *  # noqa: F403

__all__ = [
    "advisory_lock",
    "handlers_seen_missing_due",
    "handlers_seen_record",
    "lock_wait_limits",
    "migration_activity",
    "migration_apply",
    "migration_apply_alone",
    "migrations_create_table",
    "migrations_get_latest_version",
    "migrations_list_applied",
    "migrations_lock",
    "migrations_lock_alone",
    "tick_enter",
    "tick_work_exists",
]

# Searched in this order, the tick's first: a name is found without importing the modules
# after its own.
_MODULES = (
    "runs",
    "enqueue",
    "definitions",
    "tally",
    "effects",
    "incidents",
    "limits",
    "listen",
    "tasks",
    "server",
    "dashboard",
    "batches",
    "dependencies",
    "testing",
)


def __getattr__(name: str) -> Any:
    # Importing the models costs an idle tick more than its one question does.
    if name in _MODULES:
        return importlib.import_module(f"cronjob.store.{name}")
    if not name.startswith("__"):
        for module in _MODULES:
            found = importlib.import_module(f"cronjob.store.{module}")
            if hasattr(found, name):
                value = getattr(found, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'cronjob.store' has no attribute {name!r}")
