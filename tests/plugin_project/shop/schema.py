"""The shop's own tables."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id bigserial PRIMARY KEY, email text NOT NULL UNIQUE, welcomed boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS orders (
    id bigserial PRIMARY KEY, user_id bigint NOT NULL, amount_cents int NOT NULL,
    paid boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS outbox (id bigserial PRIMARY KEY, address text, subject text);
CREATE TABLE IF NOT EXISTS reports (id bigserial PRIMARY KEY, day date NOT NULL);
"""


def create(conn):
    conn.execute(SCHEMA)
