"""One function per query: takes a connection, returns models, never commits on its own.

With queries.py, the only code that executes SQL. Each function bears the name of
its statement (`runs_finalize_many` runs queries.RUNS_FINALIZE_MANY); a function that
needs more than one statement names the others after itself plus a qualifier.

The functions live in two modules, and are all reached through this one:
- `preflight`, what runs before anything is known: migrating, checking the schema
  version, asking whether a tick has work. It builds no models, so an idle tick,
  which asks and leaves, never imports them.
- `records`, everything that reads or writes runs, definitions and effects, as
  models. Imported the first time one of its names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cronjob.store.preflight import (
    lock_wait_limits,
    migration_apply,
    migrations_create_table,
    migrations_get_latest_version,
    migrations_list_applied,
    migrations_lock,
    tick_work_exists,
)

if TYPE_CHECKING:
    from cronjob.store.records import *  # noqa: F403

__all__ = [
    "lock_wait_limits",
    "migration_apply",
    "migrations_create_table",
    "migrations_get_latest_version",
    "migrations_list_applied",
    "migrations_lock",
    "tick_work_exists",
]


def __getattr__(name: str) -> Any:
    # Importing the models costs an idle tick more than its one question does.
    if name.startswith("__"):
        raise AttributeError(f"module 'cronjob.store' has no attribute {name!r}")
    records = importlib.import_module("cronjob.store.records")
    try:
        value = getattr(records, name)
    except AttributeError:
        raise AttributeError(f"module 'cronjob.store' has no attribute {name!r}") from None
    globals()[name] = value
    return value
