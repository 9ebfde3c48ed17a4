"""Running Django tasks in a tick, and handlers whose ORM writes commit with their success.

A Django tick runs the tasks the project defines (cronjob.django.discovery: the installed
apps' tasks modules and the settings' schedules) that have runs waiting or schedules to
run: no --handlers needed. A run's job type is only looked up among them, never
imported. Each becomes a handler; `atomic` runs one inside a transaction on Django's
connection, in which the tick then records the run's success.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from cronjob.context import HandlerTransactionError, JobContext, LeaseLost
from cronjob.django.connection import ServerBinding, backend_options, database_alias
from cronjob.handlers import Fail, HandlerSpec, is_coroutine_function, registry


def task_handlers(
    conn: Any, queues: Sequence[str] | None, *, every: bool = False
) -> dict[str, HandlerSpec]:
    """Handlers of the Django tasks this tick may claim, by job type.

    Those with runs waiting (in `queues`, if given), and those that schedules run: the
    settings' and, when they name a task, those added by `schedule add` or a file; with
    `every` (a tick that stays, `--listen`: runs of any task may come while it waits), every
    task the apps' tasks modules hold, of `queues` if given. A
    waiting run's or a settings schedule's job type that names no task of this backend is
    logged once, and its runs wait. Nothing a row holds stops the tick. A plain handler
    registered under a task's path wins. They are this tick's alone: none goes into the
    registry, so the next tick in the process (a second `call_command`) selects its own.
    """
    from cronjob import log, store
    from cronjob.django.discovery import IMPORT_ERRORS, known_tasks, settings_task_paths

    waiting = store.task_types_waiting(conn, queues)
    settings = settings_task_paths()
    # Other schedules' types are mostly plain handlers' ("send_email"): tried, never logged.
    others = {d.job_type for d in store.definitions_list(conn) if "." in d.job_type}
    candidates = dict.fromkeys([*waiting, *settings, *sorted(others)])
    known = known_tasks() if every else None
    if known is not None:
        candidates.update(dict.fromkeys(sorted({t.module_path for t in known.tasks.values()})))
    wanted = [job_type for job_type in candidates if job_type not in registry()]
    if not wanted:
        return {}
    known = known or known_tasks()
    logger = log.get_logger()
    for module, why in known.problems.items():
        logger.warning("tasks module not imported", module=module, reason=why)
    handlers = {}
    for job_type in wanted:
        try:
            task = _task(job_type, known.tasks, from_settings=job_type in settings)
            if job_type not in waiting and queues is not None and task.queue_name not in queues:
                continue
            handlers[job_type] = task_handler(task)
        except IMPORT_ERRORS as exc:
            if job_type in waiting or job_type in settings:
                reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                logger.warning("task not run", job_type=job_type[:200], reason=reason[:500])
    return handlers


def _task(job_type: str, tasks: dict[str, Any], *, from_settings: bool) -> Any:
    """The task of this backend `job_type` names; ValueError saying why there is none.

    A path the settings' schedules name is imported, as the settings are the project's
    own code; any other is a row's text, only looked up among the tasks the project defines.
    """
    from cronjob.django.backend import importable_task, known_task

    return importable_task(job_type) if from_settings else known_task(job_type, tasks)


def task_handler(task: Any) -> HandlerSpec:
    """A handler running `task` with the run's args and kwargs, storing what it returns.

    Each attempt sends Django's task_started before the task runs (cronjob.django.signals;
    task_finished follows once its outcome is written).
    """
    from cronjob.django.tasks import task_options

    options = task_options(task)
    if is_coroutine_function(task.func):

        async def run_async(ctx: Any, payload: Any) -> None:
            from cronjob.django import signals

            args, kwargs = _arguments(payload)
            context = await _context_async(task, ctx)
            await signals.started_async(task, ctx, _running_result(context))
            value = await task.func(*context, *args, **kwargs)
            await _store_return_value_async(task, ctx, value)

        func: Callable[..., Any] = run_async
    else:

        def run(ctx: JobContext, payload: Any) -> None:
            if getattr(task, "atomic", False):
                _run(task, ctx, payload, atomic=True)  # ends with the transaction
                return
            if ctx.database.in_caller_transaction:  # a test's: its connection stays as it is
                _run(task, ctx, payload)
                return
            _fresh_connections()
            try:
                _run(task, ctx, payload)
            finally:
                _end_of_task()

        func = run
    func.django_task = task  # type: ignore[attr-defined]  # for its signals (TaskSignals)
    # The task's options bear HandlerSpec's field names; unset ones keep its defaults.
    return HandlerSpec(task.module_path, func, **options)


def _fresh_connections() -> None:
    """As at the start of a request: drop this thread's connections that broke or outlived
    CONN_MAX_AGE, so that a restarted database costs one failed run, not every later one.

    A connection jobrunner's own statements broke counts too: those go through psycopg
    cursors, so Django's wrapper never saw the error.
    """
    from django.db import close_old_connections, connections

    close_old_connections()
    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if raw is not None and raw.closed and not connection.in_atomic_block:
            connection.close()


def _end_of_task() -> None:
    """As at the end of a request: give back connections that are not to be kept (to
    Django's pool, if it has one), since a worker thread may end without a word."""
    from django.db import close_old_connections

    close_old_connections()


def _run(task: Any, ctx: JobContext, payload: Any, *, atomic: bool = False) -> None:
    from cronjob.django import signals

    args, kwargs = _arguments(payload)
    context = _context(task, ctx)
    # Before an atomic task's transaction opens: receivers' queries are not the task's.
    signals.started(task, ctx, _running_result(context))
    if atomic:
        join_django_transaction(ctx)
    value = task.func(*context, *args, **kwargs)
    _store_return_value(task, ctx, value)


def _running_result(context: tuple[Any, ...]) -> Any:
    """A takes_context task's TaskResult, read for its context: its task_started's too."""
    return context[0].task_result if context else None


def _arguments(payload: Any) -> tuple[list[Any], dict[str, Any]]:
    args = payload.get("args") if isinstance(payload, dict) else None
    kwargs = payload.get("kwargs") if isinstance(payload, dict) else None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise Fail('payload is not a Django task\'s {"args": [...], "kwargs": {...}}')
    return args, kwargs


def _context(task: Any, ctx: JobContext) -> tuple[Any, ...]:
    if not task.takes_context:
        return ()
    from django.tasks import TaskContext

    from cronjob.django.connection import django_connection
    from cronjob.django.results import task_result
    from cronjob.store import task_result_get

    row = task_result_get(django_connection(), ctx.run_id)
    return (TaskContext(task_result=task_result(row, task.backend, task=task)),)


async def _context_async(task: Any, ctx: Any) -> tuple[Any, ...]:
    """As `_context`, read on a connection of the tick's own: Django's are sync only."""
    if not task.takes_context:
        return ()
    from django.tasks import TaskContext

    from cronjob.django.results import task_result
    from cronjob.store import task_result_get_async

    conn = await ctx.database.connect_async(autocommit=True)
    try:
        row = await task_result_get_async(conn, ctx.run_id)
    finally:
        await conn.close()
    return (TaskContext(task_result=task_result(row, task.backend, task=task)),)


def _return_json(task: Any, value: Any) -> tuple[Any, str | None]:
    """What the task returned, as Django's JSON values and as the text stored.

    A value that cannot be stored fails the run at once (the same value comes back on
    every retry), with the error that says why: TypeError for a value JSON cannot hold,
    ValueError for one too large or too deep.
    """
    from django.utils.json import normalize_json

    from cronjob.errors import BadInput
    from cronjob.inputs import encode_payload

    if value is None:
        return None, None
    try:
        normal = normalize_json(value)
        return normal, encode_payload(normal, source=f"return value of {task.name}")
    except (TypeError, ValueError) as exc:
        raise Fail(error=exc) from None
    except BadInput as exc:
        raise Fail(error=ValueError(str(exc))) from None


def _store_return_value(task: Any, ctx: JobContext, value: Any) -> None:
    from cronjob import store
    from cronjob.django import signals

    normal, text = _return_json(task, value)
    if text is not None and not store.task_return_value_set(
        ctx.db, ctx.run_id, ctx.lease_token, text
    ):
        raise LeaseLost(f"run {ctx.run_id} no longer holds its lease")
    signals.returned(ctx, normal)


async def _store_return_value_async(task: Any, ctx: Any, value: Any) -> None:
    from cronjob import store
    from cronjob.django import signals

    normal, text = _return_json(task, value)
    if text is not None and not await store.task_return_value_set_async(
        await ctx.db, ctx.run_id, ctx.lease_token, text
    ):
        raise LeaseLost(f"run {ctx.run_id} no longer holds its lease")
    signals.returned(ctx, normal)


class DjangoTransaction(ServerBinding):
    """A `transaction.atomic()` block on Django's connection, as a handler's `ctx.db`.

    Opened in the worker thread before the handler runs, so its ORM writes go into it;
    `commit()` (after the tick recorded success in it) leaves the block, committing;
    `close()` leaves it rolling back, if it is still open. Either way the thread's
    connection is then handled as at the end of a request. `nested`: the run's transaction
    is a savepoint in the caller's (a test's, cronjob.testing), and so is this block, after
    which the connection stays as it is.
    """

    def __init__(self, alias: str, *, nested: bool = False) -> None:
        from django.db import connections, transaction

        self._django = connections[alias]
        self._nested = nested
        if self._django.in_atomic_block and not nested:
            raise HandlerTransactionError("Django's connection is already in a transaction")
        self._atomic: Any = transaction.atomic(using=alias)
        self._atomic.__enter__()
        super().__init__(self._django.connection)

    def commit(self) -> None:
        if self._django.needs_rollback:
            raise HandlerTransactionError(
                "the handler marked Django's transaction for rollback, so its success could"
                " not commit with it"
            )
        atomic, self._atomic = self._atomic, None
        try:
            atomic.__exit__(None, None, None)
        except Exception as exc:
            if not self._django.run_commit_hooks_on_set_autocommit_on:
                raise  # the COMMIT itself failed: nothing of the run's success is kept
            # Committed, success and all; a transaction.on_commit() callback raised after.
            self._django.run_commit_hooks_on_set_autocommit_on = False
            from cronjob import log

            log.get_logger().warning(
                "on_commit callback failed after the run's success committed",
                error=f"{type(exc).__name__}: {str(exc)[:500]}",
            )
        finally:
            self._end()

    def close(self) -> None:
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            error = HandlerTransactionError("rolled back")
            try:
                atomic.__exit__(type(error), error, None)
            finally:
                self._end()

    def _end(self) -> None:
        if not self._nested:
            _end_of_task()


def join_django_transaction(ctx: JobContext) -> None:
    """Make a new transaction on Django's connection this run's `ctx.db` (see `atomic`)."""
    nested = ctx.database.in_caller_transaction
    if not nested:
        _fresh_connections()
    joined = DjangoTransaction(database_alias(), nested=nested)
    try:
        ctx.join_transaction(joined)
    except BaseException:
        joined.close()  # leaves the atomic block, so the thread's next run starts clean
        raise


def atomic(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a jobrunner handler inside a transaction on Django's connection.

        @handler("import_orders")
        @atomic
        def import_orders(ctx, payload):
            Order.objects.create(...)

    The tick records the run's success in that same transaction, fenced by the lease:
    the ORM writes and "succeeded" commit together or not at all. `ctx.db` is that
    transaction too (Django's connection, with Django's type adapters), and
    `ctx.once(key)` records its key in it. The connection is the Tasks backend's
    DATABASE alias, where jobrunner's tables are.
    """
    if is_coroutine_function(func):
        raise TypeError("atomic needs a plain def handler: Django's ORM transactions are sync")
    if any(spec.func is func for spec in registry().values()):
        raise TypeError("put @atomic below @handler(...): the handler is registered already")

    @functools.wraps(func)
    def run(ctx: JobContext, payload: Any) -> Any:
        join_django_transaction(ctx)
        return func(ctx, payload)

    return run


def schedule_specs() -> list[Any]:
    """The periodic tasks in settings (OPTIONS "SCHEDULES"), as definitions; BadInput if bad."""
    from cronjob.django.schedules import specs_from_settings

    return specs_from_settings(backend_options().get("SCHEDULES") or {})


def limit_specs() -> list[Any] | None:
    """The limits in settings (OPTIONS "LIMITS": a dict of task path: settings, as a schedule
    file's [limits.TYPE] tables), checked; None when the settings have none."""
    from cronjob.limits import declared_limits

    limits = backend_options().get("LIMITS")
    return None if limits is None else declared_limits(limits, where='TASKS OPTIONS "LIMITS"')
