"""One function per statement of cronjob.queries.enqueue: a run's enqueue, in the caller's
transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from cronjob.errors import BadInput, DatabaseError
from cronjob.queries import enqueue as queries
from cronjob.run_options import ALWAYS_SENT, RUN_OPTIONS, NewRun
from cronjob.store.preflight import advisory_lock
from cronjob.text import copy_text


@dataclass(frozen=True)
class Enqueued:
    """One enqueued run, or the run of the same type and tenant that already had its
    idempotency key (or its unique key): with its result id and its enqueue time, what
    Django's TaskResult of the run shows."""

    id: int
    created: bool
    result_id: UUID | None = None
    enqueued_at: datetime | None = None


def runs_insert_many(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    statement, params = _inserting(runs, now)
    rows = conn.cursor(row_factory=dict_row).execute(statement, params).fetchall()
    if asking := _asking(runs, rows, params):
        # Another transaction took a key while ours waited on it: the run that holds it is
        # visible now, in a statement with a fresh snapshot.
        places, keys = asking
        answers = conn.execute(queries.RUNS_INSERT_MANY_HOLDERS, keys).fetchall()
        rows = _settled(rows, places, answers)
    enqueued = _enqueued(runs, rows)
    if replacing := _replacing(runs, enqueued, now):
        runs_replace_waiting(conn, replacing)
    return enqueued


async def runs_insert_many_async(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None
) -> list[Enqueued]:
    if not runs:
        return []
    statement, params = _inserting(runs, now)
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(statement, params)
    rows = await cursor.fetchall()
    if asking := _asking(runs, rows, params):
        # As in runs_insert_many: a key another transaction took while ours waited.
        places, keys = asking
        answers = await (await conn.execute(queries.RUNS_INSERT_MANY_HOLDERS, keys)).fetchall()
        rows = _settled(rows, places, answers)
    enqueued = _enqueued(runs, rows)
    if replacing := _replacing(runs, enqueued, now):
        await runs_replace_waiting_async(conn, replacing)
    return enqueued


def _inserting(runs: Sequence[NewRun], now: datetime | None) -> tuple[str, dict[str, Any]]:
    """The insert for `runs`, and its parameters: an array per option sent."""
    optional = {name for run in runs for name in run.options if name not in ALWAYS_SENT}
    sent = ALWAYS_SENT + tuple(name for name in RUN_OPTIONS if name in optional)
    keyed = any(run.keyed for run in runs)
    if not optional:
        statement = queries.RUNS_INSERT_MANY_KEYED if keyed else queries.RUNS_INSERT_MANY
    else:
        statement = queries.runs_insert_many_sending(sent, keyed=keyed)
    params: dict[str, Any] = {
        "job_types": [run.job_type for run in runs],
        "payloads": [run.payload_json for run in runs],
        "now": now,
        # A run holding keys of both kinds: see queries.enqueue on planning.
        "insert_all": any(run.options.keys() >= _KEYS for run in runs),
    }
    for name in sent:
        params[name] = [run.options.get(name) for run in runs]
    return statement, params


# The keys a run may hold, of each kind.
_KEYS = frozenset({"idempotency_key", "unique_key"})


def _asking(
    runs: Sequence[NewRun], rows: list[dict[str, Any]], params: dict[str, Any]
) -> tuple[list[int], dict[str, Any]] | None:
    """The rows whose run the insert could not know (their places in `rows`), and the
    parameters of RUNS_INSERT_MANY_HOLDERS that ask for them; None if it knew every row's.
    It planned which rows to insert from the runs that held keys as it started: when it
    wrote fewer than planned, the keys of the rows no run held then; when it could not plan
    (`insert_all`), every key."""
    planned = sum(row["holder"] == row["new_id"] for row in rows)
    if not params["insert_all"] and planned == rows[0]["inserted"]:
        return None
    places = [
        place for place, (run, row) in enumerate(zip(runs, rows, strict=True))
        if run.keyed and (params["insert_all"] or row["held_at"] is None)
    ]  # fmt: skip
    chosen = [runs[place] for place in places]
    return places, {
        "job_types": [run.job_type for run in chosen],
        "tenant_ids": [run.options.get("tenant_id") for run in chosen],
        "idempotency_keys": [run.options.get("idempotency_key") for run in chosen],
        "unique_keys": [run.options.get("unique_key") for run in chosen],
    }


def _settled(
    rows: list[dict[str, Any]], places: list[int], answers: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """`rows` with the runs found holding the keys of the rows at `places` (the answers of
    RUNS_INSERT_MANY_HOLDERS: place among those asked, id, result id, enqueue time): a row's
    own run if it was inserted."""
    settled = list(rows)
    found = {place: answer for place, *answer in answers}
    for asked, place in enumerate(places, start=1):
        row = rows[place]
        if asked not in found:
            raise DatabaseError(
                "a run holding a key this enqueue met was removed before the enqueue could "
                "read its id: enqueue again"
            )
        run_id, result_id, created_at = found[asked]
        mine = run_id == row["new_id"]
        settled[place] = {
            **row,
            "holder": run_id,
            "held_result_id": None if mine else result_id,
            "held_at": None if mine else created_at,
        }
    inserted = sum(row["holder"] == row["new_id"] for row in settled)
    if inserted != rows[0]["inserted"]:
        raise BadInput("a run was not enqueued: another run has its result id")
    return settled


def _enqueued(runs: Sequence[NewRun], rows: list[dict[str, Any]]) -> list[Enqueued]:
    """Each input row's run: its own, or the run already holding its key (that the row's
    `holder` names: a run of this batch, or one whose result id and enqueue time it holds)."""
    batch = {row["new_id"]: run for run, row in zip(runs, rows, strict=True)}
    enqueued = []
    for row in rows:
        holder = row["holder"]
        if row["held_at"] is None:  # this run, or an earlier one of the batch
            result_id, at = batch[holder].options.get("result_id"), row["clock"]
        else:
            result_id, at = row["held_result_id"], row["held_at"]
        created = holder == row["new_id"]
        enqueued.append(Enqueued(int(holder), created, result_id, at))
    return enqueued


def runs_copy_many(
    conn: Any, runs: Sequence[NewRun], *, now: datetime | None = None, batch_id: int | None = None
) -> list[int]:
    """Insert runs that hold no key (`NewRun.keyed`) by COPY; returns their ids in order. The
    rows are those runs_insert_many writes: what it computes from the clock with an option's
    `expression`, this computes with its `copied` from the clock of RUNS_COPY_MANY_IDS.
    `batch_id`: the runs, which set no option, are members of that batch (enqueue_batch)."""
    if any(run.keyed for run in runs):
        raise ValueError("runs_copy_many takes runs that hold no key: insert those")
    params = {"count": len(runs), "now": now}
    clock, ids, pinned = conn.execute(queries.RUNS_COPY_MANY_IDS, params, binary=True).fetchone()
    if batch_id is not None and not pinned:
        return _copied_members(conn, runs, ids, batch_id)
    if batch_id is not None:  # the clock pinned: the columns the insert computes are sent
        runs = [
            NewRun(r.job_type, r.payload_json, {**r.options, "batch_id": batch_id}) for r in runs
        ]
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


def _copied_members(conn: Any, runs: Sequence[NewRun], ids: list[int], batch_id: int) -> list[int]:
    """The COPY of a batch's members that set no option: the runs alone, and their batch."""
    if any(run.options for run in runs):
        raise ValueError("a batch's members go in by COPY only when they set no option")
    statement = queries.runs_copy_many_sending(("batch_id",), stamped=False)
    with conn.cursor().copy(statement) as copy:
        copy.write(
            "".join(
                f"{run_id}\t{copy_text(run.job_type)}\t{copy_text(run.payload_json)}\t{batch_id}\n"
                for run_id, run in zip(ids, runs, strict=True)
            )
        )
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
        "job_types": [run.job_type for run, _ in chosen],
        "tenant_ids": [run.options.get("tenant_id") for run, _ in chosen],
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
