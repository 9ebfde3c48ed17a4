"""What an operator changes outside a selection of runs, each change one function that writes
its own `job_audit` row in the transaction of the change.

Both doors call these: the command line (`pause`, `resume`, `retry ID`, `cancel ID`,
`schedule pause/resume/run`) and the dashboard's buttons, so a change made from either is the
same change with the same audit row. A selection of runs goes through `cronjob.incident`
(`count`, `apply`). The caller checks its own input (the actor, the reason, the names) and
opens the connection, in autocommit mode: each function here is its own transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cronjob import incident, store
from cronjob.models import Definition, TypeLimit


@dataclass(frozen=True)
class Done:
    """What a change did: the names (job types, or a schedule) it changed, and its audit row."""

    changed: tuple[str, ...]
    audit_id: int


def pause_types(conn: Any, job_types: Sequence[str], *, actor: str, reason: str | None) -> Done:
    """Stop every host claiming `job_types`; `changed` holds those that were not paused."""
    with conn.transaction():
        paused = store.job_types_pause(conn, job_types, reason=reason, actor=actor)
        return _done(conn, "pause", {"type": list(job_types)}, paused, actor=actor, reason=reason)


def resume_types(conn: Any, job_types: Sequence[str], *, actor: str, reason: str | None) -> Done:
    """Claim `job_types` again; `changed` holds those that were paused."""
    with conn.transaction():
        resumed = store.job_types_resume(conn, job_types)
        selection = {"type": list(job_types)}
        return _done(conn, "resume", selection, resumed, actor=actor, reason=reason)


def _done(
    conn: Any, command: str, selection: dict[str, Any], changed: Sequence[str], **why: Any
) -> Done:
    """`changed`, audited as `command` in the transaction that changed them."""
    audit_id = incident.record(conn, command, changed=len(changed), selection=selection, **why)
    return Done(tuple(changed), audit_id)


def set_limit(conn: Any, limit: TypeLimit, *, actor: str) -> Done:
    """Set `limit` on its job type, replacing any it had: every tick on every host enforces it
    from its next claim on."""
    from cronjob import limits

    with conn.transaction():
        store.job_type_limit_set(conn, limit, actor=actor)
        selection = {
            "type": [limit.job_type],
            "concurrency": limit.concurrency,
            "rate": limits.rate_text(limit),
            "per": limits.per_text(limit),
        }
        audit_id = incident.record(
            conn, "limit", actor=actor, reason=limit.reason, changed=1, selection=selection
        )
    return Done((limit.job_type,), audit_id)


def clear_limit(conn: Any, job_type: str, *, actor: str, reason: str | None) -> Done:
    """Clear the limit of `job_type`; `changed` is empty when it had none."""
    with conn.transaction():
        cleared = store.job_type_limit_clear(conn, job_type)
        audit_id = incident.record(
            conn,
            "limit --clear",
            actor=actor,
            reason=reason,
            changed=int(cleared is not None),
            selection={"type": [job_type]},
        )
    return Done((job_type,) if cleared else (), audit_id)


def change_runs(
    conn: Any, command: str, ids: Sequence[int], *, actor: str, reason: str | None
) -> list[Any]:
    """`retry` or `cancel` the runs `ids`, batch by batch, audited; one change per id."""
    change_many = store.runs_retry_many if command == "retry" else store.runs_cancel_many
    return incident.apply_ids(conn, command, ids, change_many, actor=actor, reason=reason)


def pause_schedule(conn: Any, name: str, *, actor: str, reason: str | None) -> Done:
    """Stop materializing the schedule `name`; `changed` is empty when it was paused already."""
    from cronjob import definitions

    with conn.transaction():
        _, changed = definitions.pause(conn, name)
        names = (name,) if changed else ()
        return _done(conn, "schedule pause", {"name": name}, names, actor=actor, reason=reason)


def resume_schedule(
    conn: Any, name: str, *, actor: str, reason: str | None
) -> tuple[Definition, Done]:
    """Materialize the schedule `name` again from now on; with the definition as it is now."""
    from cronjob import definitions

    with conn.transaction():
        found, changed = definitions.resume(conn, name)
        names = (name,) if changed else ()
        done = _done(conn, "schedule resume", {"name": name}, names, actor=actor, reason=reason)
    return found, done


@dataclass(frozen=True)
class RunNow:
    """One occurrence of a schedule made now: the runs it created (one, or one per tenant;
    none when its overlap policy skipped it), and the audit row."""

    created: int
    audit_id: int


def run_schedule_now(
    conn: Any, name: str, *, actor: str, reason: str | None, tenants_sql: str | None = None
) -> RunNow:
    """Enqueue one occurrence of the schedule `name` at the database clock's now, as a tick
    materializes a due one: its payload, scope (a run per tenant, from `tenants_sql`) and
    overlap policy (a skip is recorded as the tick records one). Its timing is left as it
    is: the next occurrence still fires when it is due, paused or not.

    Raises BadInput when the schedule cannot be materialized (tenant-scoped without a tenant
    query, or a tenant query that fails), with nothing written.
    """
    from cronjob.errors import BadInput
    from cronjob.materialize import Materializer

    materializer = Materializer(tenants_sql=tenants_sql)
    with conn.transaction():
        created = materializer.run_now(conn, name)
        if materializer.problems:
            raise BadInput(f"schedule {name!r} not run: {materializer.problems[0].reason}")
        audit_id = incident.record(
            conn,
            "schedule run",
            actor=actor,
            reason=reason,
            selection={"name": name},
            changed=created,
        )
    return RunNow(created, audit_id)
