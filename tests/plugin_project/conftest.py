"""The shop's test fixtures: its own tables, made once in jobrunner's test database."""

import psycopg
import pytest
from shop import payments, schema


@pytest.fixture(scope="session", autouse=True)
def shop_tables(jobrunner_test_database):
    with psycopg.connect(jobrunner_test_database.url, autocommit=True) as conn:
        schema.create(conn)


@pytest.fixture(autouse=True)
def gateway():
    payments.answers.clear()
    payments.calls.clear()
    return payments
