"""The schema this jobrunner ships (sql/NNNN_name.sql), and whether a database has it.

Applying the migrations is `cronjob.migrate`'s.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from cronjob.db import UNDEFINED_TABLE, database_errors
from cronjob.errors import DatabaseError, SchemaNotReady


def require_schema(conn: Any) -> None:
    """Refuse to work on a missing or outdated schema."""
    from cronjob.store import migrations_get_latest_version

    try:
        with database_errors():
            current = migrations_get_latest_version(conn)
    except DatabaseError as exc:
        if exc.sqlstate != UNDEFINED_TABLE:
            raise
        if not conn.autocommit:
            conn.rollback()
        raise SchemaNotReady(
            "the jobrunner schema is missing from this database: run `jobrunner migrate`"
        ) from None
    latest = latest_shipped_version()
    if current < latest:
        raise SchemaNotReady(
            f"the jobrunner schema is at version {current}, this jobrunner needs {latest}: "
            "run `jobrunner migrate`"
        )
    if current > latest:
        raise SchemaNotReady(
            f"the jobrunner schema is at version {current}, newer than this jobrunner "
            f"understands ({latest}): upgrade jobrunner"
        )


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    shipped = here / "sql"
    return shipped if shipped.is_dir() else here.parent / "sql"


# Migrations ship as sql/NNNN_name.sql.
MIGRATION_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def latest_shipped_version() -> int:
    """The schema version this jobrunner needs: the number of its last migration."""
    # From the file names alone: every command asks, and a tick with nothing to do
    # should not load the migration machinery to learn one number.
    matches = map(MIGRATION_FILENAME.match, os.listdir(migrations_dir()))
    return max((int(match.group(1)) for match in matches if match), default=0)
