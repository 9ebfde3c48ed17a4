"""The `jobrunner` fixture's object: a test's view of jobrunner, in the test's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from cronjob.testing import enqueued as matching

if TYPE_CHECKING:
    from pathlib import Path

    from cronjob.handlers import HandlerSpec
    from cronjob.models import Definition, Run
    from cronjob.testing.drain import Drained
    from cronjob.testing.handle import Handled
    from cronjob.testing.transaction import AsyncConnection


class Jobrunner:
    """jobrunner in one test: the test's connection, its clock, what it enqueued, and a drain.

    Everything happens on `conn`, in the test's transaction, which the test's end rolls
    back: each test starts from an empty queue. The clock jobrunner reads is pinned to the
    transaction's start (`now`) and moves only with `advance`.
    """

    def __init__(self, conn: Any, *, now: datetime, django: bool = False) -> None:
        self._conn = conn
        self._now = now
        self._django = django
        self._aconn: AsyncConnection | None = None

    @classmethod
    def begin(cls, conn: Any, *, django: bool = False) -> Jobrunner:
        """A test's jobrunner on `conn`, whose transaction is the test's: its clock pinned
        to that transaction's start (or to the clock already pinned in it)."""
        from psycopg.pq import TransactionStatus

        from cronjob import store

        if conn.autocommit and conn.info.transaction_status != TransactionStatus.INTRANS:
            # In autocommit the clock's pin would end with its own statement, and what the
            # test enqueued would outlive it. (Django opens a test's transaction with its
            # first statement: its connection is out of autocommit until then.)
            raise RuntimeError(
                "jobrunner needs the test's open transaction: with pytest-django, use the db"
                " fixture (not transactional_db); in Django, a TestCase (not a"
                " TransactionTestCase)"
            )
        return cls(conn, now=store.clock_pin(conn, None), django=django)

    @property
    def conn(self) -> Any:
        """The test's connection, in its transaction: enqueue on it as the app does."""
        return self._conn

    @property
    def aconn(self) -> AsyncConnection:
        """`conn` as an AsyncConnection, for `enqueue_async` and async code under test."""
        if self._aconn is None:
            from cronjob.testing.transaction import AsyncConnection

            self._aconn = AsyncConnection(self._conn)
        return self._aconn

    @property
    def now(self) -> datetime:
        """The clock jobrunner reads in this test."""
        return self._now

    def advance(self, duration: str | float | timedelta) -> datetime:
        """Move the clock forward by `duration` ("90s", "5m", "2h", "1d", seconds or a
        timedelta): what is due, retries' backoff, rate windows and schedules follow.
        Returns the new time."""
        from cronjob import store
        from cronjob.inputs import parse_duration

        if isinstance(duration, timedelta):
            seconds = duration.total_seconds()
        else:
            seconds = parse_duration(duration, what="advance")
        if seconds < 0:
            raise ValueError("the clock only moves forward: advance by a positive duration")
        self._now = store.clock_pin(self._conn, self._now + timedelta(seconds=seconds))
        return self._now

    # -- what is enqueued ------------------------------------------------------

    def enqueued(self, job_type: str | None = None, **match: Any) -> list[Run]:
        """The waiting runs (queued, or failed with a retry due), oldest first, of
        `job_type` if given, that match (cronjob.testing.enqueued says how)."""
        wanted = matching.matcher(self._now, match)
        return [
            run
            for run in matching.waiting_runs(self._conn, job_type)
            if matching.matches(run, wanted)
        ]

    def assert_enqueued(
        self, job_type: str | None = None, *, count: int | None = None, **match: Any
    ) -> list[Run]:
        """Fail unless a waiting run matches (exactly `count` of them, if given); returns
        the runs that match. The failure lists what is enqueued instead."""
        wanted = matching.matcher(self._now, match)
        waiting = matching.waiting_runs(self._conn)
        found = [
            run
            for run in waiting
            if (job_type is None or run.job_type == job_type) and matching.matches(run, wanted)
        ]
        if found if count is None else len(found) == count:
            return found
        asked = matching.described(job_type, wanted)
        if count is None:
            message = f"expected a waiting run {asked}; found none"
        else:
            message = f"expected {count} waiting run(s) {asked}; found {len(found)}"
        shown = matching.listing(found, "matching") + "\n" if found else ""
        raise AssertionError(f"{message}\n{shown}{matching.listing(waiting, 'enqueued')}")

    def refute_enqueued(self, job_type: str | None = None, **match: Any) -> None:
        """Fail if a waiting run matches; the failure lists those that do."""
        found = self.enqueued(job_type, **match)
        if found:
            asked = matching.described(job_type, matching.matcher(self._now, match))
            raise AssertionError(
                f"expected no waiting run {asked}\n{matching.listing(found, 'found')}"
            )

    # -- running them ----------------------------------------------------------

    def drain(self, types: Sequence[str] | None = None) -> Drained:
        """Run every due run in this process, through the tick's own code, until none is
        due: runs their handlers enqueue, and retries due at once, included. Of `types`
        only, if given. Returns what became of each attempt."""
        return self._drain(types).run()

    async def adrain(self, types: Sequence[str] | None = None) -> Drained:
        """As `drain`, in an async test: `async def` handlers are awaited on its loop."""
        return await self._drain(types).run_async()

    def run_handler(
        self,
        job_type: str,
        payload: Any = None,
        *,
        tenant: str | int | None = None,
        attempt: int = 1,
    ) -> Handled:
        """Call the handler of `job_type` once with a real `ctx` (on its `attempt`) and
        return what happened: what it returned or raised, and what the tick would record.
        Nothing stays enqueued; what it wrote through `ctx.db` stays as its outcome left it."""
        from cronjob.testing import handle
        from cronjob.testing.drain import run_coroutine

        drain = self._drain([job_type])
        if drain.handlers[job_type].is_async:
            return run_coroutine(
                self.arun_handler(job_type, payload, tenant=tenant, attempt=attempt)
            )
        flight, call = handle.prepare(drain, job_type, payload, tenant=tenant, attempt=attempt)
        result = drain.attempt(flight)
        return handle.conclude(drain, result, call)

    async def arun_handler(
        self,
        job_type: str,
        payload: Any = None,
        *,
        tenant: str | int | None = None,
        attempt: int = 1,
    ) -> Handled:
        """As `run_handler`, in an async test: an `async def` handler is awaited on its loop."""
        from cronjob.testing import handle

        drain = self._drain([job_type])
        flight, call = handle.prepare(drain, job_type, payload, tenant=tenant, attempt=attempt)
        if flight.spec.is_async:
            result = await drain.attempt_async(flight)
        else:
            result = drain.attempt(flight)
        return handle.conclude(drain, result, call)

    def handlers(self) -> dict[str, HandlerSpec]:
        """The handlers a drain runs: every one registered by the modules imported so far
        (the `jobrunner_handlers` ini option's, the `jobrunner.handlers` entry points' and
        the test's own), and in a Django project its tasks with runs waiting or schedules."""
        from cronjob.handlers import registry

        handlers = dict(registry())
        if self._django:
            from cronjob.django.runner import task_handlers

            handlers = {**task_handlers(self._conn, None), **handlers}
        return handlers

    # -- schedules -------------------------------------------------------------

    def materialize(self, *, tenants_sql: str | None = None) -> int:
        """Turn every schedule occurrence due by the test's clock into runs, as a tick's
        first step does; returns how many runs it made. Raises if a due schedule could not
        be materialized (a tenant-scoped one without `tenants_sql`, a bad schedule)."""
        from cronjob.materialize import Materializer

        materializer = Materializer(tenants_sql=tenants_sql, now=self._now)
        created = materializer.run(self._conn)
        if materializer.problems:
            problems = "; ".join(f"{p.definition}: {p.reason}" for p in materializer.problems)
            raise RuntimeError(f"schedules not materialized: {problems}")
        return created

    def add_schedule(self, name: str, *, cron: str, job_type: str, **fields: Any) -> Definition:
        """Add a schedule as `jobrunner schedule add` does, starting from the test's clock;
        `fields` are a schedule file's (payload, timezone, scope, catch_up, overlap...)."""
        from cronjob import definitions

        spec = definitions.definition_spec(name, cron=cron, job_type=job_type, **fields)
        return definitions.add(self._conn, spec, now=self._now)

    def sync_schedules(self, path: str | Path | None = None) -> None:
        """Apply a schedule file (TOML, as `jobrunner schedule sync FILE`), or without one, in a
        Django project, the SCHEDULES of its settings (as `manage.py jobrunner sync`)."""
        from cronjob import definitions

        if path is not None:
            from pathlib import Path

            source = str(path)
            specs = definitions.load_file(Path(path).read_text(), source=source)
        elif self._django:
            from cronjob.django.runner import schedule_specs

            specs = schedule_specs()
        else:
            raise TypeError("sync_schedules() needs a schedule file outside a Django project")
        definitions.sync(self._conn, specs, now=self._now)

    def limit(
        self,
        job_type: str,
        *,
        concurrency: int | None = None,
        rate: str | None = None,
        per: str | None = None,
    ) -> None:
        """Limit `job_type` as `jobrunner limit` does (`rate` "10/1m", `per` "tenant" or
        "payload.FIELD"), in this test: its drains claim within it, by the test's clock."""
        from cronjob import store
        from cronjob.limits import parse_limit

        wanted = parse_limit(job_type, concurrency=concurrency, per=per, rate=rate)
        store.job_type_limit_set(self._conn, wanted, actor="test", now=self._now)

    def _drain(self, types: Sequence[str] | None) -> Any:
        from cronjob.testing.drain import TestDrain
        from cronjob.tick import observers

        handlers = self.handlers()
        if types is not None:
            if self._django:
                handlers.update(_django_tasks([t for t in types if t not in handlers]))
            missing = [t for t in types if t not in handlers]
            if missing:
                raise LookupError(f"no handler for job type(s) {missing}: {_known(handlers)}")
            handlers = {t: handlers[t] for t in types}
        watching = observers.build(handlers, _django_signals if self._django else None, _log())
        return TestDrain(self._conn, handlers, now=self._now, observers=watching)


def _known(handlers: dict[str, Any]) -> str:
    if not handlers:
        return (
            "no handler is registered (import the handler modules, or name them in the"
            " jobrunner_handlers ini option)"
        )
    return "registered: " + ", ".join(sorted(handlers))


def _django_tasks(job_types: list[str]) -> dict[str, HandlerSpec]:
    """The handlers of the project's tasks that `job_types` name (those that name none are
    left out): for a drain of named types, or a handler run alone, with no run waiting."""
    if not job_types:
        return {}
    from cronjob.django.backend import known_task
    from cronjob.django.discovery import known_tasks
    from cronjob.django.runner import task_handler

    tasks = known_tasks().tasks
    found = {}
    for job_type in job_types:
        try:
            found[job_type] = task_handler(known_task(job_type, tasks))
        except ValueError:
            continue
    return found


def _django_signals(handlers: dict[str, HandlerSpec]) -> list[Any]:
    from cronjob.django.signals import TaskSignals

    return [TaskSignals(inline=True)] if TaskSignals.wanted(handlers) else []


def _log() -> Any:
    from cronjob.log import get_logger

    return get_logger()
