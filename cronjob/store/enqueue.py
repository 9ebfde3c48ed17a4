"""One function per statement of cronjob.queries.enqueue: a run's enqueue, in the caller's
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from cronjob.queries import enqueue as queries
from cronjob.run_options import ALWAYS_SENT, RUN_OPTIONS, NewRun
from cronjob.store.preflight import advisory_lock
from cronjob.text import copy_text


@dataclass(frozen=True)
class Enqueued:
    """One enqueued run, or the run of the same type and tenant that already had its
    idempotency key."""

    id: int
    created: bool


def runs_insert_many(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    cursor = conn.cursor(row_factory=dict_row)
    rows = cursor.execute(*_inserting(runs, now)).fetchall()
    found: dict[tuple[str, ...], int] = {}
    for kind, statement, missing in _keys_not_seen(rows):
        # Another transaction inserted these keys while ours waited on them; they
        # are visible now, in a statement with a fresh snapshot.
        by_key = conn.execute(statement, missing)
        found.update({(kind, *_work(*row[:3])): row[3] for row in by_key.fetchall()})
    enqueued = _enqueued(rows, found)
    if replacing := _replacing(runs, enqueued, now):
        runs_replace_waiting(conn, replacing)
    return enqueued


async def runs_insert_many_async(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(*_inserting(runs, now))
    rows = await cursor.fetchall()
    found: dict[tuple[str, ...], int] = {}
    for kind, statement, missing in _keys_not_seen(rows):
        # As in runs_insert_many: keys another transaction inserted while ours waited.
        by_key = await conn.execute(statement, missing)
        found.update({(kind, *_work(*row[:3])): row[3] for row in await by_key.fetchall()})
    enqueued = _enqueued(rows, found)
    if replacing := _replacing(runs, enqueued, now):
        await runs_replace_waiting_async(conn, replacing)
    return enqueued


def _inserting(runs: Sequence[NewRun], now: datetime | None) -> tuple[str, dict[str, Any]]:
    """The insert for `runs`, and its parameters: an array per option sent."""
    optional = {name for run in runs for name in run.options if name not in ALWAYS_SENT}
    sent = ALWAYS_SENT + tuple(name for name in RUN_OPTIONS if name in optional)
    statement = queries.RUNS_INSERT_MANY if not optional else queries.runs_insert_many_sending(sent)
    params: dict[str, Any] = {
        "job_types": [run.job_type for run in runs],
        "payloads": [run.payload_json for run in runs],
        "now": now,
    }
    for name in sent:
        params[name] = [run.options.get(name) for run in runs]
    return statement, params


def runs_copy_many(conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None) -> list[int]:
    """Insert runs that hold no key (`NewRun.keyed`) by COPY; returns their ids in order. The
    rows are those runs_insert_many writes: what it computes from the clock with an option's
    `expression`, this computes with its `copied` from the clock of RUNS_COPY_MANY_IDS."""
    if any(run.keyed for run in runs):
        raise ValueError("runs_copy_many takes runs that hold no key: insert those")
    params = {"count": len(runs), "now": now}
    clock, ids, pinned = conn.execute(queries.RUNS_COPY_MANY_IDS, params, binary=True).fetchone()
    sent = _copied(runs, pinned)
    statement = queries.runs_copy_many_sending(tuple(sent), stamped=pinned)
    with conn.cursor().copy(statement) as copy:
        if not sent and not pinned:
            # In one write: a row at a time, the thread that sends a chunk takes the
            # interpreter's lock for each buffer it fills, and the server waits between two.
            copy.write(
                "".join(
                    f"{run_id}\t{copy_text(run.job_type)}\t{copy_text(run.payload_json)}\n"
                    for run_id, run in zip(ids, runs, strict=True)
                )
            )
            return ids
        stamps = (clock, clock) if pinned else ()
        for run_id, run in zip(ids, runs, strict=True):
            columns = [value(run.options, clock) for value in sent.values()]
            copy.write_row((run_id, run.job_type, run.payload_json, *columns, *stamps))
    return ids


def _copied(runs: Sequence[NewRun], pinned: bool) -> dict[str, Any]:
    """The options whose columns a COPY of `runs` sends, each with how it computes its value:
    none when no run sets any and the clock is the database's (the columns' defaults are
    then the insert's values), else those the insert would send."""
    given = {name for run in runs for name in run.options}
    if not given and not pinned:
        return {}
    return {
        name: option.copied or (lambda options, _clock, name=name: options.get(name))
        for name, option in RUN_OPTIONS.items()
        if option.column is not None and not option.keyed and (name in ALWAYS_SENT or name in given)
    }


def _work(job_type: str, tenant_id: str | None, key: str) -> tuple[str, str, str]:
    """What an idempotency key is unique for: its job type and tenant (none: '')."""
    return job_type, tenant_id or "", key


def _keys_not_seen(
    rows: list[dict[str, Any]],
) -> list[tuple[str, str, dict[str, list[str | None]]]]:
    """For the input rows the insert found no run for, the statements that find them, by
    idempotency key (RUNS_INSERT_MANY_IDS_BY_KEY) and by unique key: each with the kind of
    key it looks up and its parameters."""
    missing = [row for row in rows if row["id"] is None]
    by_idempotency = [row for row in missing if row["idempotency_key"] is not None]
    by_unique = [row for row in missing if row["idempotency_key"] is None]
    found = []
    for statement, key, chosen in (
        (queries.RUNS_INSERT_MANY_IDS_BY_KEY, "idempotency_key", by_idempotency),
        (queries.RUNS_INSERT_MANY_IDS_BY_UNIQUE_KEY, "unique_key", by_unique),
    ):
        if chosen:
            params = {
                "job_types": [row["job_type"] for row in chosen],
                "tenant_ids": [row["tenant_id"] for row in chosen],
                "keys": [row[key] for row in chosen],
            }
            found.append((key, statement, params))
    return found


def _enqueued(rows: list[dict[str, Any]], found: dict[tuple[str, ...], int]) -> list[Enqueued]:
    """Each input row's run: its own, or the run already holding its key (`found`, by the
    kind of key, and the key's type, tenant and text)."""
    enqueued = []
    for row in rows:
        run_id = row["id"]
        if run_id is None:
            kind = "idempotency_key" if row["idempotency_key"] is not None else "unique_key"
            run_id = found[(kind, *_work(row["job_type"], row["tenant_id"], row[kind]))]
        enqueued.append(Enqueued(id=int(run_id), created=bool(row["created"])))
    return enqueued


def runs_replace_waiting(conn: Any, replacing: dict[str, Any]) -> None:
    """A debounce: the waiting runs `_replacing` names take their new payload and run_at."""
    conn.execute(queries.RUNS_REPLACE_WAITING, replacing)


async def runs_replace_waiting_async(conn: Any, replacing: dict[str, Any]) -> None:
    await conn.execute(queries.RUNS_REPLACE_WAITING, replacing)


def _replacing(
    runs: Sequence[NewRun], enqueued: list[Enqueued], now: datetime | None
) -> dict[str, Any] | None:
    """The parameters of RUNS_REPLACE_WAITING for the runs enqueued with `replace` that found
    their unique key held; None if there are none."""
    chosen = [
        (run, done) for run, done in zip(runs, enqueued, strict=True)
        if not done.created and run.options.get("replace")
    ]  # fmt: skip
    if not chosen:
        return None
    return {
        "ids": [done.id for _, done in chosen],
        "unique_keys": [run.options["unique_key"] for run, _ in chosen],
        "payloads": [run.payload_json for run, _ in chosen],
        "run_ats": [run.options.get("run_at") for run, _ in chosen],
        "delays": [run.options.get("delay") for run, _ in chosen],
        "now": now,
    }


def runs_lock_for_keyed_batch(conn: Any, *, wait: bool = True) -> bool:
    """Take the keyed-batch lock, held until this transaction ends; with `wait`, queue for
    any other batch with idempotency keys, else return False at once if one holds it."""
    return advisory_lock(
        conn, queries.RUNS_LOCK_FOR_KEYED_BATCH, queries.RUNS_LOCK_FOR_KEYED_BATCH_TRY, wait=wait
    )
