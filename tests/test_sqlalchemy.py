"""enqueue inside a SQLAlchemy Session's transaction (psycopg 3 driver), as
docs/guides/sqlalchemy.md shows."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from cronjob import enqueue
from tests.conftest import count

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


@pytest.fixture
def engine(db_url: str) -> Any:
    # SQLAlchemy's URL for the psycopg 3 driver, with libpq's own parameters passed
    # through to psycopg.connect unchanged (the test server may be on a Unix socket).
    made = sqlalchemy.create_engine(
        "postgresql+psycopg://", connect_args=conninfo.conninfo_to_dict(db_url)
    )
    with made.begin() as connection:
        connection.execute(text("CREATE TABLE IF NOT EXISTS sa_orders (ref text)"))
        connection.execute(text("TRUNCATE sa_orders"))
    yield made
    made.dispose()


def test_enqueue_commits_and_rolls_back_with_the_session(
    engine: Any, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        session.execute(text("INSERT INTO sa_orders VALUES ('lost')"))
        enqueue(session.connection().connection.driver_connection, "send_receipt", {"n": 1})
        raise RuntimeError("the request failed")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert count(conn, "SELECT count(*) FROM sa_orders") == 0

    with Session(engine) as session, session.begin():
        session.execute(text("INSERT INTO sa_orders VALUES ('kept')"))
        run_id = enqueue(
            session.connection().connection.driver_connection, "send_receipt", {"n": 2}
        )
    assert count(conn, "SELECT count(*) FROM job_runs WHERE id = %s", run_id) == 1
    assert count(conn, "SELECT count(*) FROM sa_orders") == 1
