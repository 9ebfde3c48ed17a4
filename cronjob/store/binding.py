"""A connection someone else configured, made fit for jobrunner's statements."""

from __future__ import annotations

from typing import Any


class ServerBinding:
    """Django's psycopg connection, running jobrunner's statements on plain cursors.

    Django's cursors bind parameters on the client, which cannot send the binary
    arrays jobrunner's statements use; a psycopg.Cursor on the same connection can,
    inside the same transaction. Everything else is the connection itself.
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.Cursor(self._raw, *args, **kwargs)

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        return self.cursor().execute(query, params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
