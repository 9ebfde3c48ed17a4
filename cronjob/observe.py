"""What watches a command-line tick's attempts besides its run logs, as configured.

`jobrunner tick` hands `observers` to the tick (`TickOptions.observers`), which calls it
once it has found work: an idle tick imports none of what is named here.

- Tracing (cronjob.tracing, extra `otel`): when the `OTEL_*` environment asks for traces.
- Error reports (cronjob.sentry, extra `sentry`): when Sentry is configured (`SENTRY_DSN`,
  or an SDK a handler module initialized).
- Django's task signals (cronjob.django.signals): in a Django project's tick that runs
  tasks.

An integration that is configured but not installed is logged once, and the tick runs
without it.
"""

from __future__ import annotations

from typing import Any

from cronjob.handlers import HandlerSpec
from cronjob.tick.observers import Observer


def observers(handlers: dict[str, HandlerSpec], *, django: bool = False) -> list[Observer]:
    """The observers the environment asks for, for a tick running `handlers`."""
    from cronjob import sentry, tracing
    from cronjob.tick.steps import worker_name

    found: list[Observer] = []
    if tracing.configured():
        _add(
            found,
            "otel",
            "tracing is configured (OTEL_*)",
            lambda: tracing.Tracing(worker=worker_name()),
        )
    if sentry.configured():
        _add(found, "sentry", "Sentry is configured", sentry.Reports)
    if django:
        from cronjob.django.signals import TaskSignals

        if TaskSignals.wanted(handlers):
            found.append(TaskSignals())
    return found


def _add(found: list[Observer], extra: str, what: str, make: Any) -> None:
    try:
        found.append(make())
    except ImportError as exc:
        from cronjob.log import get_logger

        get_logger().warning(
            f"{what}, but the {extra} extra is not installed: the tick runs without it"
            f" (pip install 'pg-jobrunner[{extra}]')",
            error=f"{type(exc).__name__}: {str(exc)[:200]}",
        )
