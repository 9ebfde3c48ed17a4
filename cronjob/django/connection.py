"""Django's database connection, as jobrunner's statements need it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from cronjob.store.binding import ServerBinding

BACKEND_PATH = "cronjob.django.JobrunnerBackend"


def setup() -> None:
    """django.setup(), once: apps loaded, so tasks and models import."""
    import django
    from django.apps import apps

    if not apps.ready:
        with _settings_import():
            django.setup()


@contextlib.contextmanager
def _settings_import() -> Iterator[None]:
    """A settings module that does not import is one line, saying where to look."""
    name = os.environ.get("DJANGO_SETTINGS_MODULE", "")
    try:
        yield
    except ImportError as exc:
        from cronjob.errors import BadInput

        raise BadInput(
            f"cannot import Django settings {name[:200]!r} (DJANGO_SETTINGS_MODULE):"
            f" {type(exc).__name__}: {str(exc)[:200]}; set PYTHONPATH to the project's"
            " directory, or run `python manage.py jobrunner ...`"
        ) from None


def backend_options() -> dict[str, Any]:
    """OPTIONS of the first TASKS backend that is jobrunner's ({} if none is)."""
    from django.conf import settings

    with _settings_import():
        tasks = getattr(settings, "TASKS", {})
    for params in tasks.values():
        if params.get("BACKEND") == BACKEND_PATH:
            return dict(params.get("OPTIONS") or {})
    return {}


def database_alias() -> str:
    return str(backend_options().get("DATABASE", "default"))


def database_conninfo() -> str:
    """A libpq connection string for the database the Tasks backend writes to.

    Django's connection parameters less the ones libpq does not know (Django's own
    options, psycopg's `prepare_threshold`...); `assume_role` becomes the session's role,
    as Django sets it on its own connections.
    """
    from django.db import connections
    from psycopg import pq
    from psycopg.conninfo import make_conninfo

    from cronjob.text import remember_password

    connection = connections[database_alias()]
    params = connection.get_connection_params()
    libpq = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    fields = {
        key: value
        for key, value in params.items()
        if key in libpq and isinstance(value, str | int) and not isinstance(value, bool)
    }
    role = connection.settings_dict.get("OPTIONS", {}).get("assume_role")
    if role:
        fields["options"] = f"{fields.get('options', '')} -c role={role}".strip()
    conninfo = make_conninfo("", **fields)
    remember_password(conninfo)
    password = connection.settings_dict.get("PASSWORD")
    if password:
        remember_password(make_conninfo("", password=str(password)))
    return conninfo


def django_connection(alias: str | None = None) -> ServerBinding:
    """This thread's Django connection for `alias`, in whatever transaction it is in."""
    from django.db import connections

    connection = connections[alias or database_alias()]
    connection.ensure_connection()
    return ServerBinding(connection.connection)
