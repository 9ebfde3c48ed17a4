"""A run's enqueue in statements: inserted, with the run that already holds its idempotency
or unique key found instead; copied in bulk when it holds neither; a debounce's replacement
of a waiting run; and the lock that makes keyed batches take turns.

Run by cronjob.store.enqueue. What it reads back of job_runs is the id, type, tenant and keys
of runs: all that the enqueuer role of deploy/roles.sql may read.
"""

from __future__ import annotations

import functools

from cronjob.queries import _NOW, _PINNED_CLOCK
from cronjob.run_options import ALWAYS_SENT, RUN_OPTIONS

# An idempotency key is unique per (job type, tenant), no tenant being one of its own: the
# unique index of migration 0017, whose expression the insert's ON CONFLICT names and the
# lookups of an existing run repeat, so that they walk that index.
_SAME_WORK = "ON CONFLICT (job_type, (coalesce(tenant_id, '')), idempotency_key)"


def _same_key(run: str, given: str) -> str:
    """`run` holds the idempotency key of the run `given` asks for: same key, type, tenant."""
    return (
        f"{run}.idempotency_key = {given}.idempotency_key AND {run}.job_type = {given}.job_type"
        f" AND coalesce({run}.tenant_id, '') = coalesce({given}.tenant_id, '')"
    )


# A unique key is unique among the unfinished runs of a type and tenant (migration 0021):
# those without a finish time, which the schema gives exactly the terminal ones. Read so
# rather than by status, which the enqueuer role may not read (deploy/roles.sql).
_UNFINISHED = "finished_at IS NULL"


def _same_unique(run: str, given: str) -> str:
    """`run` holds the unique key of the run `given` asks for: same key, type, tenant."""
    return (
        f"{run}.unique_key = {given}.unique_key AND {run}.job_type = {given}.job_type"
        f" AND coalesce({run}.tenant_id, '') = coalesce({given}.tenant_id, '')"
    )


# Ids are drawn from the sequence up front so each input row can be matched to
# the id it got, whether it was inserted now or already existed under its key.
# The arrays travel in binary: text arrays of JSON would otherwise be quoted and
# escaped element by element. Each option of a run (cronjob.run_options) sent is an
# array of its own, and the column it is stored in takes the option's expression.
# What it reads back of job_runs is the id, type, tenant and key of runs: all that the
# enqueuer role of deploy/roles.sql may read.
@functools.cache
def runs_insert_many_sending(sent: tuple[str, ...]) -> str:
    """The insert of runs whose options `sent` (names of run_options.RUN_OPTIONS) travel:
    ALWAYS_SENT, the idempotency key and the tenant among them, and any others."""
    options = [(name, RUN_OPTIONS[name]) for name in sent]
    arrays = "".join(f", %({name})b::{option.sql_type}[]" for name, option in options)
    inputs = "".join(f", {name}" for name, _ in options)
    stored = [(o.column, o.expression or name) for name, o in options if o.column is not None]
    columns = "".join(f", {column}" for column, _ in stored)
    values = "".join(f"{expression.format(now=_NOW)}, " for _, expression in stored)
    unique = "unique_key" in sent
    # A unique key is a second arbiter, and ON CONFLICT names one at most: with unique keys
    # the insert skips a row that conflicts with either (the other unique indexes are on
    # ids drawn here: they conflict with nothing).
    conflict = (
        "ON CONFLICT DO NOTHING"
        if unique
        else f"{_SAME_WORK} WHERE idempotency_key IS NOT NULL DO NOTHING"
    )
    returned = ", unique_key" if unique else ""
    found = "coalesce(mine.id, same_key.id, existing.id)"
    joins = ""
    if unique:
        found = "coalesce(mine.id, same_key.id, existing.id, same_unique.id, active.id)"
        joins = f"""
LEFT JOIN inserted same_unique ON mine.id IS NULL AND {_same_unique("same_unique", "i")}
LEFT JOIN job_runs active ON mine.id IS NULL AND same_unique.id IS NULL
                         AND {_same_unique("active", "i")} AND active.{_UNFINISHED}"""
    return f"""
WITH input AS (
    SELECT nextval('job_runs_id_seq') AS new_id, i.*
    FROM unnest(%(job_types)b::text[], %(payloads)b::text[]{arrays})
        WITH ORDINALITY AS i(job_type, payload{inputs}, ord)
),
inserted AS (
    INSERT INTO job_runs (id, job_type, payload{columns}, created_at, updated_at)
    SELECT new_id, job_type, payload::jsonb, {values}{_NOW}, {_NOW}
    FROM input ORDER BY ord
    {conflict}
    RETURNING id, job_type, tenant_id, idempotency_key{returned}
)
SELECT i.ord, i.job_type, i.tenant_id, i.idempotency_key{", i.unique_key" if unique else ""},
       {found} AS id,
       mine.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted mine ON mine.id = i.new_id
LEFT JOIN inserted same_key ON mine.id IS NULL AND {_same_key("same_key", "i")}
LEFT JOIN job_runs existing ON mine.id IS NULL AND same_key.id IS NULL
                           AND {_same_key("existing", "i")}{joins}
ORDER BY i.ord
"""


# What most batches send: every option but those later migrations added.
RUNS_INSERT_MANY = runs_insert_many_sending(ALWAYS_SENT)

# Runs that hold no key (run_options' keyed ones) conflict with nothing, and go in by COPY,
# at a fraction of the insert's cost: the ids drawn first, in one statement, with the clock
# the copied columns of run_options are computed from (`Option.copied`), and whether that
# clock is pinned (given, or the session's): the columns' defaults read the database's.
RUNS_COPY_MANY_IDS = f"""
SELECT {_NOW},
       ARRAY(SELECT nextval('job_runs_id_seq') FROM generate_series(1, %(count)s::int)),
       %(now)s::timestamptz IS NOT NULL OR {_PINNED_CLOCK} IS NOT NULL
"""


@functools.cache
def runs_copy_many_sending(sent: tuple[str, ...], *, stamped: bool) -> str:
    """The COPY of runs whose options `sent` (names of run_options.RUN_OPTIONS with a column)
    travel; the columns left out take their defaults, which are the insert's values for runs
    that set none of them. `stamped`: created_at and updated_at travel too (a given `now`)."""
    columns = "".join(f", {RUN_OPTIONS[name].column}" for name in sent)
    stamps = ", created_at, updated_at" if stamped else ""
    return f"COPY job_runs (id, job_type, payload{columns}{stamps}) FROM STDIN"


# The runs that hold the keys of input rows the insert found taken but could not see.
RUNS_INSERT_MANY_IDS_BY_KEY = f"""
SELECT k.job_type, k.tenant_id, k.idempotency_key, r.id
FROM unnest(%(job_types)s::text[], %(tenant_ids)s::text[], %(keys)s::text[])
    AS k(job_type, tenant_id, idempotency_key)
JOIN job_runs r ON {_same_key("r", "k")}
"""

# The unfinished runs that hold the unique keys of input rows the insert found taken but
# could not see.
RUNS_INSERT_MANY_IDS_BY_UNIQUE_KEY = f"""
SELECT k.job_type, k.tenant_id, k.unique_key, r.id
FROM unnest(%(job_types)s::text[], %(tenant_ids)s::text[], %(keys)s::text[])
    AS k(job_type, tenant_id, unique_key)
JOIN job_runs r ON {_same_unique("r", "k")} AND r.{_UNFINISHED}
"""

# A debounce: each run that held a unique key an enqueue with `replace` asked for takes its
# payload and run_at, if it is still waiting for its first attempt (jobrunner_replace_waiting,
# migration 0021, which the enqueuer may call without rights to update runs of its own).
RUNS_REPLACE_WAITING = f"""
SELECT jobrunner_replace_waiting(
    %(ids)s::bigint[], %(unique_keys)s::text[], %(payloads)s::text[]::jsonb[],
    ARRAY(SELECT coalesce(at, {_NOW} + make_interval(secs => coalesce(delay, 0)))
          FROM unnest(%(run_ats)s::timestamptz[], %(delays)s::float8[]) AS o(at, delay)))
"""

# Batches that carry idempotency keys take turns: two batches holding some of each
# other's keys (the same key for the same type and tenant), in different orders, would
# otherwise wait on each other until the server broke the deadlock by failing one. One
# lock for every batch, whatever its types and tenants: a lock per type and tenant, taken
# chunk by chunk as a batch meets them, could be taken in different orders again. This
# constant spells "jobkeys".
RUNS_LOCK_FOR_KEYED_BATCH = "SELECT pg_advisory_xact_lock(29958816149218675)"
RUNS_LOCK_FOR_KEYED_BATCH_TRY = "SELECT pg_try_advisory_xact_lock(29958816149218675)"
