"""A run's enqueue in statements: inserted, with the run that already holds its idempotency
or unique key found instead; copied in bulk when it holds neither; a debounce's replacement
of a waiting run; and the lock that makes keyed batches take turns.

Run by cronjob.store.enqueue. It reads no column of job_runs, which the enqueuer role of
deploy/roles.sql may not: the runs that hold keys come from jobrunner_runs_holding_keys, a
function that answers only for the keys it is given (migration 0024).
"""

from __future__ import annotations

import functools

from cronjob.queries import _NOW, _PINNED_CLOCK
from cronjob.run_options import ALWAYS_SENT, RUN_OPTIONS

# A key is held by the run of the same job type and tenant (none: '') that has it: an
# idempotency key forever (migration 0017), a unique key while the run is unfinished (0021).
# The enqueuer role reads nothing of job_runs (deploy/roles.sql): which run holds a key comes
# from jobrunner_runs_holding_keys (migration 0024), given the type, tenant and keys of each
# input row and answering for those whose key a run holds, numbered as given.
_HOLDING_KEYS = """jobrunner_runs_holding_keys(
    ARRAY(SELECT job_type FROM input ORDER BY ord), ARRAY(SELECT tenant_id FROM input ORDER BY ord),
    ARRAY(SELECT idempotency_key FROM input ORDER BY ord),
    ARRAY(SELECT {unique_key} FROM input ORDER BY ord))"""


# Ids are drawn from the sequence up front, so each input row knows the id it gets if it is
# inserted. The arrays travel in binary: text arrays of JSON would otherwise be quoted and
# escaped element by element. Each option of a run (cronjob.run_options) sent is an array of
# its own, and the column it is stored in takes the option's expression.
#
# Which rows are inserted is decided before the insert, from the runs that held the keys
# when the statement started (`held`): a row whose key a run held is that run's; else the
# first row of the batch with its key is inserted and the later ones are its. The insert
# returns nothing of the rows (the enqueuer may read none of their columns), only how many
# it wrote: fewer than planned means another transaction took a key while this one waited
# on it, and the caller asks again which run holds it (RUNS_INSERT_MANY_HOLDERS). A batch
# with a row holding both kinds of key cannot be planned so (its rows may conflict in
# chains): with `insert_all`, every row is tried and the caller asks afterwards for every key.
@functools.cache
def runs_insert_many_sending(sent: tuple[str, ...], *, keyed: bool = True) -> str:
    """The insert of runs whose options `sent` (names of run_options.RUN_OPTIONS) travel:
    ALWAYS_SENT, the idempotency key and the tenant among them, and any others; `keyed`: some
    run of the batch holds a key."""
    options = [(name, RUN_OPTIONS[name]) for name in sent]
    arrays = "".join(f", %({name})b::{option.sql_type}[]" for name, option in options)
    inputs = "".join(f", {name}" for name, _ in options)
    stored = [(o.column, o.expression or name) for name, o in options if o.column is not None]
    columns = "".join(f", {column}" for column, _ in stored)
    values = "".join(f"{expression.format(now=_NOW)}, " for _, expression in stored)
    unique = "unique_key" in sent
    planned = "input"
    chosen = ""
    if keyed:
        planned = "planned"
        chosen = "\n    WHERE %(insert_all)s::boolean OR holder = new_id"
    by_unique = (
        "\n                         WHEN i.unique_key IS NOT NULL"
        " THEN first_value(i.new_id) OVER same_unique"
        if unique
        else ""
    )
    unique_window = (
        ",\n           same_unique AS (PARTITION BY i.job_type, coalesce(i.tenant_id, ''),"
        " i.unique_key ORDER BY i.ord)"
        if unique
        else ""
    )
    holding = _HOLDING_KEYS.format(unique_key="unique_key" if unique else "NULL::text")
    plan = f"""
held AS (
    SELECT h.place, h.id, h.result_id, h.created_at FROM {holding} h
),
planned AS (
    SELECT i.*, held.result_id AS held_result_id, held.created_at AS held_at,
           coalesce(held.id,
                    CASE WHEN i.idempotency_key IS NOT NULL
                         THEN first_value(i.new_id) OVER same_key{by_unique}
                         ELSE i.new_id END) AS holder
    FROM input i
    LEFT JOIN held ON held.place = i.ord
    WINDOW same_key AS (PARTITION BY i.job_type, coalesce(i.tenant_id, ''), i.idempotency_key
                        ORDER BY i.ord){unique_window}
),"""
    answer = "holder, held_result_id, held_at"
    if not keyed:
        plan = ""
        answer = "new_id AS holder, NULL::uuid AS held_result_id, NULL::timestamptz AS held_at"
    return f"""
WITH input AS (
    SELECT nextval('job_runs_id_seq') AS new_id, i.*
    FROM unnest(%(job_types)b::text[], %(payloads)b::text[]{arrays})
        WITH ORDINALITY AS i(job_type, payload{inputs}, ord)
),{plan}
inserted AS (
    INSERT INTO job_runs (id, job_type, payload{columns}, created_at, updated_at)
    SELECT new_id, job_type, payload::jsonb, {values}{_NOW}, {_NOW}
    FROM {planned}{chosen}
    ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT ord, new_id, {answer}, {_NOW} AS clock, (SELECT count(*) FROM inserted) AS inserted
FROM {planned}
ORDER BY ord
"""


# What most batches send: every option but those later migrations added.
RUNS_INSERT_MANY = runs_insert_many_sending(ALWAYS_SENT, keyed=False)
RUNS_INSERT_MANY_KEYED = runs_insert_many_sending(ALWAYS_SENT, keyed=True)

# The runs that hold the keys of input rows, asked in a statement of its own: it sees the
# runs committed since the insert started and those the insert wrote. Numbered as given.
RUNS_INSERT_MANY_HOLDERS = """
SELECT place, id, result_id, created_at
FROM jobrunner_runs_holding_keys(%(job_types)s::text[], %(tenant_ids)s::text[],
                                 %(idempotency_keys)s::text[], %(unique_keys)s::text[])
"""

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


# A debounce: each run that held a unique key an enqueue with `replace` asked for takes its
# payload and run_at, if it is still waiting for its first attempt and is of that key's type
# and tenant, enqueued by this login (jobrunner_replace_waiting, migration 0024, which the
# enqueuer may call without rights to update runs of its own).
RUNS_REPLACE_WAITING = f"""
SELECT jobrunner_replace_waiting(
    %(ids)s::bigint[], %(job_types)s::text[], %(tenant_ids)s::text[], %(unique_keys)s::text[],
    %(payloads)s::text[],
    ARRAY(SELECT coalesce(at, {_NOW} + make_interval(secs => coalesce(delay, 0)))
          FROM unnest(%(run_ats)s::timestamptz[], %(delays)s::float8[]) AS o(at, delay)))
"""

# Batches that carry idempotency keys take turns: two batches holding some of each
# other's keys (the same key for the same type and tenant), in different orders, would
# otherwise wait on each other until the server broke the deadlock by failing one. One
# lock for every batch, whatever its types and tenants: a lock per type and tenant, taken
# chunk by chunk as a batch meets them, could be taken in different orders again. This
# constant spells "jobkeys".
RUNS_KEYED_BATCH_LOCK_KEY = 29958816149218675
RUNS_LOCK_FOR_KEYED_BATCH = f"SELECT pg_advisory_xact_lock({RUNS_KEYED_BATCH_LOCK_KEY})"
RUNS_LOCK_FOR_KEYED_BATCH_TRY = f"SELECT pg_try_advisory_xact_lock({RUNS_KEYED_BATCH_LOCK_KEY})"
