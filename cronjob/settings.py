"""One frozen settings object built from flags and the environment."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CONCURRENCY = 4
DEFAULT_ASYNC_CONCURRENCY = 100
DEFAULT_CLAIM_BATCH_SIZE = 500
DEFAULT_MAX_RUNTIME = 50.0  # ends inside the cron minute that started it
DEFAULT_GRACE = 25.0  # below systemd's and Kubernetes' default 30 s stop timeout
# A listening tick refreshes its row in job_ticks at least every 20 s; one not seen for this
# long belongs to a tick that is gone (killed, or cut off from the database).
LISTENING_TICK_STALE = 180.0
# prune's --batch-size: runs, and then ledger keys, deleted per statement
DEFAULT_PRUNE_BATCH_SIZE = 1000


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None  # None: resolve from the environment or the embedded server
    handler_modules: tuple[str, ...] = ()
    tenants_sql: str | None = None

    @classmethod
    def build(
        cls,
        database_url: str | None = None,
        handlers: str | None = None,
        tenants_sql: str | None = None,
    ) -> Settings:
        from cronjob.inputs import check_tenants_sql

        modules = tuple(m.strip() for m in (handlers or "").split(",") if m.strip())
        return cls(database_url or None, modules, check_tenants_sql(tenants_sql or None))
