"""Acting on sets of runs during an incident, and the audit trail of every change.

`retry`, `cancel` and `prune` select runs by ids or by filters (a `Selection`). A dry
run counts; a real one walks the selection in id order, in batches of at most
`MAX_BATCH` runs, each its own short transaction, so no run stays locked for longer
than one batch. The first batch's transaction also writes the command's one
`job_audit` row; each later batch appends its count to it (`job_audit_batches`) as it
commits, since the trail is append-only. Both read the same rows in the same order
under the same limit, so what a dry run counts is what the command then changes,
unless something else moved meanwhile.

A real run reports each committed batch to its `Progress` and asks it, before the next,
whether to stop (cronjob.progress): stopped there, the audit entry counts exactly the
runs changed, and the same command run again goes on with the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from cronjob import store
from cronjob.errors import BadInput
from cronjob.models import BatchResult, Selection, SelectionCount, Status
from cronjob.progress import QUIET, Progress

MAX_BATCH = 1000
# A selection of more runs than this asks before it acts: on a terminal, a yes/no
# question; elsewhere, --yes.
CONFIRM_ABOVE = 100


@dataclass(frozen=True)
class Action:
    """What a command does to the runs it selects, and which of them it may touch."""

    command: str  # as the audit trail names it
    past: str  # "retried"
    eligible: tuple[str, ...]  # statuses the command acts on
    batch: Callable[..., BatchResult]


def _all_but(*excluded: Status) -> tuple[str, ...]:
    return tuple(s.value for s in Status if s not in excluded)


def _actions() -> dict[str, Action]:
    # The store's record functions load on first use; an idle tick never comes here.
    unfinished = ("queued", "failed", "running", "waiting")
    finished = ("succeeded", "dead", "cancelled")
    return {
        "retry": Action("retry", "retried", _all_but(Status.SUCCEEDED), store.runs_retry_selected),
        "cancel": Action("cancel", "cancelled", unfinished, store.runs_cancel_selected),
        "prune": Action("prune", "pruned", finished, store.runs_prune_selected),
    }


def action(name: str) -> Action:
    return _actions()[name]


def actor_name(given: str | None = None) -> str:
    """Who is acting: --actor, else JOBRUNNER_ACTOR, else user@host."""
    chosen = (given or os.environ.get("JOBRUNNER_ACTOR") or "").strip()
    if chosen:
        if len(chosen) > 200 or "\x00" in chosen:
            raise BadInput("invalid --actor: at most 200 characters, no NUL")
        return chosen
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def moment(text: str, *, what: str, clock: datetime) -> datetime:
    """`--since`/`--until`: a duration ago on the database clock, or an ISO-8601 timestamp."""
    from cronjob.inputs import excerpt, parse_duration, parse_timestamp

    try:
        return clock - timedelta(seconds=parse_duration(text, what=what))
    except BadInput:
        pass
    try:
        return parse_timestamp(text, what=what)
    except BadInput:
        raise BadInput(
            f"invalid {what} {excerpt(text)}: expected a duration ago (e.g. 30m, 2h) or an "
            "ISO-8601 timestamp (e.g. 2026-01-05T09:10:00Z)"
        ) from None


def split(value: str | None, what: str) -> tuple[str, ...] | None:
    """A comma-separated filter's values, each once; None when not given, BadInput when empty."""
    from cronjob.inputs import comma_list

    if value is None:
        return None
    items = tuple(dict.fromkeys(comma_list(value)))
    if not items:
        raise BadInput(f"invalid {what}: empty")
    return items


def build_selection(
    ids: Sequence[int] | None, chosen_statuses: tuple[str, ...] | None, options: Mapping[str, Any]
) -> Selection:
    """A Selection from a door's filters (`job_types`, `tenants`, `error_types`, `error_like`,
    `schedule`, `limit`, as text); since and until stay text until the clock is read."""
    error_like = options.get("error_like")
    if error_like is not None and not error_like.strip():
        raise BadInput("invalid --error-like: empty")
    return Selection(
        ids=tuple(ids) if ids else None,
        statuses=chosen_statuses,
        job_types=split(options.get("job_types"), "--type"),
        tenants=split(options.get("tenants"), "--tenant"),
        error_types=split(options.get("error_types"), "--error-type"),
        error_like=error_like,
        schedule=options.get("schedule"),
        limit=options.get("limit"),
        batch_id=_batch_id(options.get("batch_id")),
    )


def _batch_id(given: Any) -> int | None:
    from cronjob.inputs import parse_id

    return None if given is None else parse_id(given, what="--batch")


def with_clock(
    conn: Any,
    selection: Selection,
    options: Mapping[str, Any],
    until: Callable[[datetime], datetime] | None = None,
) -> Selection:
    """Resolve `since`/`until` (text in `options`) against the database clock, and the schedule
    by name; `until`, given the clock, bounds the selection further."""
    clock = store.clock_now(conn)
    since_text, until_text = options.get("since"), options.get("until")
    since = moment(since_text, what="--since", clock=clock) if since_text else None
    bound = moment(until_text, what="--until", clock=clock) if until_text else None
    if until is not None:
        bound = min(bound, until(clock)) if bound is not None else until(clock)
    return resolve(conn, replace(selection, since=since, until=bound))


def resolve(conn: Any, selection: Selection) -> Selection:
    """The selection with its schedule looked up by name."""
    if selection.schedule is None:
        return selection
    from cronjob import definitions

    return replace(selection, definition_id=definitions.get(conn, selection.schedule).id)


def count(conn: Any, chosen: Action, selection: Selection) -> SelectionCount:
    return store.runs_count_selected(conn, selection, eligible=chosen.eligible)


@dataclass
class Applied:
    """What a command changed: runs by their status before, a sample of ids, batches."""

    by_status: dict[str, int] = field(default_factory=dict)
    sample_ids: list[int] = field(default_factory=list)
    batches: int = 0
    audit_id: int | None = None

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def apply(
    conn: Any,
    chosen: Action,
    selection: Selection,
    *,
    actor: str,
    reason: str | None,
    batch_size: int = MAX_BATCH,
    progress: Progress = QUIET,
) -> Applied:
    """Act on every run of `selection`, batch by batch, and record it in the audit trail.

    `conn` must be in autocommit mode: each batch commits on its own. `progress` hears of
    each batch as it commits, and may stop the work before the next (raising Stopped).
    """
    if not conn.autocommit:
        raise ValueError("acting on a selection needs an autocommit connection")
    size = max(1, min(batch_size, MAX_BATCH))
    applied = Applied()
    after = 0
    remaining = selection.limit
    while remaining is None or remaining > 0:
        limit = size if remaining is None else min(size, remaining)
        progress.checkpoint()
        with conn.transaction():
            batch = chosen.batch(
                conn, selection, eligible=chosen.eligible, after=after, limit=limit
            )
            _audit_batch(conn, applied, chosen.command, selection, batch.ids, actor, reason)
        applied.batches += 1
        for status in batch.statuses:
            applied.by_status[status] = applied.by_status.get(status, 0) + 1
        progress.advance(len(batch.ids))
        if remaining is not None:
            remaining -= len(batch.ids)
        if batch.last_id is None or len(batch.ids) < limit:
            break
        after = batch.last_id
    return applied


def _audit_batch(
    conn: Any,
    applied: Applied,
    command: str,
    selection: Selection,
    ids: Sequence[int],
    actor: str,
    reason: str | None,
) -> None:
    if applied.audit_id is None:
        applied.audit_id = store.audit_insert(
            conn,
            actor=actor,
            command=command,
            selection=selection.as_json(),
            changed=len(ids),
            sample_ids=ids,
            reason=reason,
        )
    elif ids:
        store.audit_batch_insert(conn, applied.audit_id, ids)
    room = store.AUDIT_SAMPLE - len(applied.sample_ids)
    applied.sample_ids.extend(list(ids)[: max(0, room)])


def apply_ids(
    conn: Any,
    command: str,
    ids: Sequence[int],
    change_many: Callable[..., list[Any]],
    *,
    actor: str,
    reason: str | None,
) -> list[Any]:
    """Retry or cancel runs by id, `MAX_BATCH` a transaction; returns one change per id."""
    changes: list[Any] = []
    applied = Applied()
    selection = Selection(ids=tuple(ids))
    for start in range(0, len(ids), MAX_BATCH):
        with conn.transaction():
            batch = change_many(conn, ids[start : start + MAX_BATCH])
            done = [c.id for c in batch if c.changed]
            _audit_batch(conn, applied, command, selection, done, actor, reason)
        changes.extend(batch)
    return changes


def record(
    conn: Any,
    command: str,
    *,
    actor: str,
    selection: dict[str, Any],
    changed: int,
    reason: str | None = None,
) -> int:
    """The audit row of a command that changes state in one transaction: call inside it."""
    return store.audit_insert(
        conn,
        actor=actor,
        command=command,
        selection=selection,
        changed=changed,
        sample_ids=(),
        reason=reason,
    )
