"""The app's connection pool, opened on first use (its tests never open it)."""

import functools
import os


@functools.cache
def pool():
    from psycopg_pool import ConnectionPool

    return ConnectionPool(os.environ["DATABASE_URL"], open=True)
