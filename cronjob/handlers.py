"""The handler registry, the @handler decorator, and loading handler modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from inspect import CO_COROUTINE
from typing import Any

from cronjob.errors import BadInput, HandlerImportError
from cronjob.inputs import excerpt, parse_duration, parse_max_attempts
from cronjob.text import one_line

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_LEASE = 120.0
DEFAULT_BACKOFF_BASE = 15.0
DEFAULT_BACKOFF_CAP = 3600.0
ENTRY_POINT_GROUP = "jobrunner.handlers"


class Retry(Exception):
    """Raise from a handler to retry after `delay` (a duration or seconds)."""

    def __init__(self, delay: str | float = 0, reason: str = "retry requested") -> None:
        self.delay = parse_duration(delay, what="retry delay")
        super().__init__(reason)


class Fail(Exception):
    """Raise from a handler to give up at once: the run goes straight to `dead`.

    `error`: the exception that makes retrying pointless, recorded as the attempt's
    error (its class, message and traceback) in place of Fail's own.
    """

    def __init__(self, *args: Any, error: BaseException | None = None) -> None:
        super().__init__(*args)
        self.error = error


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**(attempt-1)))."""

    base: float = DEFAULT_BACKOFF_BASE
    cap: float = DEFAULT_BACKOFF_CAP

    @classmethod
    def of(cls, value: Backoff | tuple[Any, Any] | str | float | None) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, Backoff):
            return value
        if isinstance(value, tuple):
            if len(value) != 2:
                raise BadInput(f"invalid backoff: a (base, cap) pair, not {len(value)} values")
            base, cap = value
            return cls(
                parse_duration(base, what="backoff base"), parse_duration(cap, what="backoff cap")
            )
        return cls(base=parse_duration(value, what="backoff base"))


@dataclass(frozen=True)
class HandlerSpec:
    job_type: str
    func: Callable[..., Any]
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = Backoff()
    lease: float = DEFAULT_LEASE
    timeout: float | None = None
    # What the handler logs while it runs is kept with its attempt (cronjob.runlog).
    capture_logs: bool = True

    @property
    def is_async(self) -> bool:
        """An `async def` handler: its runs go to the tick's event loop, not to a thread."""
        return is_coroutine_function(self.func)


_registry: dict[str, HandlerSpec] = {}


def handler(
    job_type: str,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    backoff: Backoff | tuple[Any, Any] | str | float | None = None,
    lease: str | float = DEFAULT_LEASE,
    timeout: str | float | None = None,
    capture_logs: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `func(ctx, payload)` as the handler for `job_type`."""
    if not isinstance(job_type, str) or not job_type.strip():
        raise ValueError("job type must be a non-empty string")
    try:
        options = handler_options(
            max_attempts=max_attempts,
            backoff=backoff,
            lease=lease,
            timeout=timeout,
            capture_logs=capture_logs,
        )
    except BadInput as exc:
        raise BadInput(f"handler {job_type[:200]!r}: {exc}") from None

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        _registry[job_type] = HandlerSpec(job_type, func, **options)
        return func

    return register


def handler_options(
    *,
    max_attempts: Any = None,
    backoff: Any = None,
    lease: Any = None,
    timeout: Any = None,
    capture_logs: Any = None,
) -> dict[str, Any]:
    """A handler's options, checked as every door checks them (`@handler`, a Django task's
    own options), by HandlerSpec's field names; those given as None are left out, so
    HandlerSpec's defaults stand. Raises BadInput naming the first bad one."""
    options: dict[str, Any] = {}
    if max_attempts is not None:
        options["max_attempts"] = parse_max_attempts(max_attempts, what="max_attempts")
    if backoff is not None:
        options["backoff"] = Backoff.of(backoff)
    if lease is not None:
        options["lease"] = parse_duration(lease, what="lease")
        if options["lease"] < 1:
            raise BadInput(f"invalid lease {excerpt(lease)}: must be at least 1s")
    if timeout is not None:
        options["timeout"] = parse_duration(timeout, what="timeout")
    if capture_logs is not None:
        if not isinstance(capture_logs, bool):
            raise BadInput(f"invalid capture_logs {excerpt(capture_logs)}: expected True or False")
        options["capture_logs"] = capture_logs
    return options


def is_coroutine_function(func: Any) -> bool:
    code = getattr(func, "__code__", None)
    if code is not None:
        return bool(code.co_flags & CO_COROUTINE)
    call = getattr(func, "__call__", None)  # noqa: B004 - a callable object's own method
    code = getattr(call, "__code__", None)
    return code is not None and bool(code.co_flags & CO_COROUTINE)


def registry() -> dict[str, HandlerSpec]:
    return _registry


# Directories given by --handlers-path / JOBRUNNER_HANDLERS_PATH (use_handler_path).
_handler_path: list[str] = []


def use_handler_path(value: str | None) -> None:
    """Directories (separated by os.pathsep) to import handler modules from, besides the
    installed packages: the one way to import an app's modules from a directory, since the
    current one is never on the module path (a file planted there must not run)."""
    import os

    if not value:
        return
    for entry in value.split(os.pathsep):
        if not entry.strip():
            continue
        directory = os.path.abspath(os.path.expanduser(entry))
        if not os.path.isdir(directory):
            raise BadInput(f"--handlers-path {excerpt(entry)}: no such directory")
        if directory not in _handler_path:
            _handler_path.append(directory)


def load_handler_modules(names: list[str], *, entry_points: bool = True) -> None:
    """Import handler modules; their @handler decorators fill the registry."""
    import sys

    # First on the path, as the app's own directory is for its own scripts.
    sys.path[:0] = [d for d in _handler_path if d not in sys.path]
    for name in names:
        name = name.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise HandlerImportError(
                f"cannot import handler module {excerpt(name)}: {_exception_line(exc)}"
                f"{_where_to_look(name, exc)}"
            ) from None
    if entry_points:
        _load_entry_points()


def _where_to_look(name: str, exc: BaseException) -> str:
    """What to do when the handler module itself, or its package, is not found."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or not (name == missing or name.startswith(missing + ".")):
        return ""  # found, but something it imports is missing or broken: its own line says
    if _handler_path:
        return f" (looked in --handlers-path {excerpt(_pathsep().join(_handler_path))} too)"
    return (
        "; the current directory is not imported, on purpose: install your app "
        "(pip install -e .), or name its directory with --handlers-path DIR or "
        "JOBRUNNER_HANDLERS_PATH"
    )


def _pathsep() -> str:
    import os

    return os.pathsep


def _load_entry_points() -> None:
    from importlib.metadata import distributions, entry_points

    # Parsing every installed distribution's entry points is most of what loading
    # handlers costs; reading the files first shows whether any declares the group
    # at all, which few installations do.
    if not any(
        ENTRY_POINT_GROUP in (dist.read_text("entry_points.txt") or "") for dist in distributions()
    ):
        return
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise HandlerImportError(
                f"cannot import handler module {ep.value!r} (entry point {ep.name!r}): "
                f"{_exception_line(exc)}"
            ) from None


def _exception_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc)) or '(no message)'}"


def require_types(
    types: list[str] | None, tasks: dict[str, HandlerSpec] | None = None
) -> dict[str, HandlerSpec]:
    """The handlers this tick may claim for, optionally narrowed by `--types`: the
    registered ones, and `tasks` (a Django tick's, chosen for it alone)."""
    available = {**registry(), **(tasks or {})}
    if not types:
        return dict(available)
    missing = [t for t in types if t not in available]
    if missing:
        raise BadInput(f"no handler registered for job type(s): {', '.join(missing)}")
    return {t: available[t] for t in types}
