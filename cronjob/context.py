"""What a handler sees: `ctx`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cronjob.models import ClaimedRun

EFFECT_RECORD = (
    "INSERT INTO job_effects (key, run_id) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING RETURNING 1"
)


class JobContext:
    """Everything a handler may need about the run it is executing.

    `db` is opened lazily: a handler that never touches it holds no transaction
    while it runs. When it does, the run's success is recorded in that same
    transaction, so the handler's writes and "succeeded" commit together.
    """

    def __init__(self, run: ClaimedRun, connect: Callable[[], Any]) -> None:
        self.run_id: int = run.id
        self.job_type: str = run.job_type
        self.attempt: int = run.attempt
        self.tenant_id: str | None = run.tenant_id
        self.scheduled_for: datetime | None = run.scheduled_for
        self.cancelled = threading.Event()
        self._run = run
        self._connect = connect
        self._db: Any = None
        self._log: Any = None

    @property
    def log(self) -> Any:
        if self._log is None:
            from cronjob.log import get_logger

            self._log = get_logger(
                run_id=self.run_id, job_type=self.job_type, attempt=self.attempt,
                **({"tenant_id": self.tenant_id} if self.tenant_id is not None else {}),
            )  # fmt: skip
        return self._log

    @property
    def db(self) -> Any:
        """A psycopg connection inside a transaction that commits with the run's success."""
        if self._db is None:
            self._db = self._connect()
        return self._db

    @property
    def used_db(self) -> bool:
        return self._db is not None

    def once(self, key: str) -> bool:
        """True the first time `key` is seen; recorded atomically with the run's success."""
        if not isinstance(key, str) or not key:
            raise ValueError("once() needs a non-empty string key")
        return self.db.execute(EFFECT_RECORD, (key, self.run_id)).fetchone() is not None

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            finally:
                self._db = None
