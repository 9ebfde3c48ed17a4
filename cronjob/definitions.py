"""Schedule definitions: validated whole, then added, changed, paused, resumed, removed, synced.

Everything is checked before anything is written; a bad field raises BadInput naming it. Times
that decide what runs (a new definition's start, a resumed one's restart) come from the
database clock, read inside the transaction that writes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronjob import locks, store
from cronjob.errors import BadInput, DefinitionExists, DefinitionNotFound
from cronjob.inputs import (
    check_payload,
    check_ping_url,
    check_text,
    excerpt,
    parse_int,
    parse_max_attempts,
    parse_positive_int,
)
from cronjob.locks import DEFAULT_LOCK_WAIT
from cronjob.models import DEFAULT_CATCH_UP_LIMIT, Definition, DefinitionSpec
from cronjob.progress import QUIET, Progress
from cronjob.text import one_line

SCOPES = ("global", "tenant")
CATCH_UP_POLICIES = ("latest", "all", "none")  # as in cronjob.cron, without importing it
OVERLAP_POLICIES = ("allow", "skip", "queue")
MAX_CATCH_UP_LIMIT = 10000
# A schedule file is read no further than this: thousands of definitions fit in it.
MAX_FILE_BYTES = 10_000_000
# What a sync plans that it then writes; `unchanged` and `keep` it leaves be.
WRITES = ("add", "change", "remove")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}")

# TOML keys of one definition, and the keyword each becomes.
FILE_KEYS = {
    "cron": "cron",
    "type": "job_type",
    "payload": "payload",
    "timezone": "timezone",
    "scope": "scope",
    "max_attempts": "max_attempts",
    "priority": "priority",
    "catch_up": "catch_up",
    "catch_up_limit": "catch_up_limit",
    "overlap": "overlap",
    "expect_within": "expect_within",
    "ping_url": "ping_url",
    "ping_failure_url": "ping_failure_url",
    "then": "then_type",
    "enabled": "enabled",
}


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = name if isinstance(name, str) else type(name).__name__
        raise BadInput(
            f"invalid schedule name {_quoted(shown)}: use letters, digits and _ . : / - "
            "(starting with a letter or digit, at most 200 characters)"
        )
    return name


def definition_spec(
    name: Any,
    *,
    cron: Any,
    job_type: Any,
    payload: Any = None,
    timezone: Any = "UTC",
    scope: Any = "global",
    max_attempts: Any = None,
    priority: Any = None,
    catch_up: Any = "latest",
    catch_up_limit: Any = None,
    overlap: Any = "allow",
    expect_within: Any = None,
    ping_url: Any = None,
    ping_failure_url: Any = None,
    then_type: Any = None,
    enabled: Any = None,
) -> DefinitionSpec:
    """Validate every field of a definition; raises BadInput naming the first problem."""
    from cronjob.cron import CronError, validate_expression, validate_timezone

    name = check_name(name)
    job_type = check_text(job_type, what="job type", max_length=200)
    if not isinstance(cron, str):
        raise BadInput(f"invalid cron expression {excerpt(cron)}: expected a string")
    if not isinstance(timezone, str):
        raise BadInput(f"invalid timezone {excerpt(timezone)}: expected a string")
    try:
        validate_expression(cron)
        timezone = validate_timezone(timezone)
    except CronError as exc:
        raise BadInput(str(exc)) from None
    if scope not in SCOPES:
        raise BadInput(f"invalid scope {_quoted(str(scope))}: expected global or tenant")
    if catch_up not in CATCH_UP_POLICIES:
        raise BadInput(
            f"invalid catch-up policy {_quoted(str(catch_up))}: expected latest, all or none"
        )
    if overlap not in OVERLAP_POLICIES:
        raise BadInput(
            f"invalid overlap policy {_quoted(str(overlap))}: expected allow, skip or queue"
        )
    if catch_up_limit is not None and catch_up != "all":
        raise BadInput("a catch-up limit applies to catch-up policy 'all' only")
    if then_type is not None:
        then_type = check_text(then_type, what="then type", max_length=200)
        if scope != "tenant" or overlap != "allow":
            raise BadInput("then applies to a schedule with scope tenant and overlap allow")
    if enabled is not None and not isinstance(enabled, bool):
        raise BadInput(f"invalid enabled {excerpt(enabled)}: expected true or false")
    return DefinitionSpec(
        name=name,
        job_type=job_type,
        schedule=" ".join(cron.split()),
        timezone=timezone,
        payload=check_payload({} if payload is None else payload),
        scope=scope,
        max_attempts=None if max_attempts is None else parse_max_attempts(max_attempts),
        priority=0 if priority is None else parse_int(priority, what="priority"),
        catch_up=catch_up,
        catch_up_limit=DEFAULT_CATCH_UP_LIMIT
        if catch_up_limit is None
        else parse_positive_int(catch_up_limit, what="catch-up limit", maximum=MAX_CATCH_UP_LIMIT),
        overlap=overlap,
        expect_within=None if expect_within is None else _expect_within(expect_within),
        ping_url=None if ping_url is None else check_ping_url(ping_url, what="ping_url"),
        ping_failure_url=_ping_failure_url(ping_url, ping_failure_url),
        then_type=then_type,
        enabled=enabled,
    )


MAX_EXPECT_WITHIN = 366 * 86400


def _ping_failure_url(ping_url: Any, ping_failure_url: Any) -> str | None:
    if ping_failure_url is None:
        return None
    if ping_url is None:
        raise BadInput("ping_failure_url needs ping_url")
    return check_ping_url(ping_failure_url, what="ping_failure_url")


def _expect_within(value: Any) -> int:
    from cronjob.inputs import parse_duration

    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadInput(f"invalid expect_within {value!r}: expected a duration such as '2h'")
    seconds = parse_duration(value, what="expect_within")
    if not 1 <= seconds <= MAX_EXPECT_WITHIN:
        raise BadInput("expect_within must be between 1s and 366d")
    return round(seconds)


def _quoted(text: str) -> str:
    return excerpt(text)


# -- timing --------------------------------------------------------------


def first_fire_after(definition: DefinitionSpec | Definition, moment: datetime) -> datetime | None:
    """The first occurrence strictly after `moment`: a definition's `next_fire_at`."""
    from cronjob import cron

    upcoming = cron.next_after(definition.schedule, definition.timezone, moment)
    return upcoming[0] if upcoming else None


def upcoming_fire_times(definition: Definition, count: int) -> list[datetime]:
    """The next `count` fire times of an enabled definition, from its next one on."""
    from cronjob import cron

    if not definition.enabled or definition.next_fire_at is None or count < 1:
        return []
    first = definition.next_fire_at
    return [first, *cron.next_after(definition.schedule, definition.timezone, first, count - 1)]


def _same_timing(definition: Definition, spec: DefinitionSpec) -> bool:
    from cronjob import cron

    return definition.timezone == spec.timezone and cron.validate_expression(
        definition.schedule
    ) == cron.validate_expression(spec.schedule)


# -- one definition at a time ---------------------------------------------


def add(conn: Any, spec: DefinitionSpec, *, now: datetime | None = None) -> Definition:
    """Create a definition. It starts from now: nothing earlier is ever materialized."""
    with conn.transaction():
        clock = store.clock_now(conn, now=now)
        created = store.definition_insert(
            conn,
            spec,
            enabled=spec.enabled is not False,
            now=clock,
            next_fire_at=first_fire_after(spec, clock),
        )
    if created is None:
        raise DefinitionExists(
            f"schedule {excerpt(spec.name)} already exists "
            "(remove it first, or manage definitions with `jobrunner schedule sync`)"
        )
    return created


def get(conn: Any, name: str) -> Definition:
    found = store.definition_get(conn, name)
    if found is None:
        raise DefinitionNotFound(f"schedule {excerpt(name)} not found")
    return found


def pause(conn: Any, name: str, *, now: datetime | None = None) -> tuple[Definition, bool]:
    """Stop materializing; returns the definition and whether it was running before."""
    return _set_enabled(conn, name, False, now)


def resume(conn: Any, name: str, *, now: datetime | None = None) -> tuple[Definition, bool]:
    """Start materializing again from now: occurrences while paused are not made up.

    Returns the definition and whether it was paused before.
    """
    return _set_enabled(conn, name, True, now)


def _set_enabled(
    conn: Any, name: str, enabled: bool, now: datetime | None
) -> tuple[Definition, bool]:
    with conn.transaction():
        current = store.definition_get(conn, name, lock=True)
        if current is None:
            raise DefinitionNotFound(f"schedule {excerpt(name)} not found")
        if current.enabled == enabled:
            return current, False
        clock = store.clock_now(conn, now=now)
        mark, next_fire_at = current.materialized_through, current.next_fire_at
        if enabled:
            mark, next_fire_at = _restarted(current, current, clock)
        updated = store.definition_set_enabled(
            conn,
            current.id,
            enabled,
            now=clock,
            materialized_through=mark,
            next_fire_at=next_fire_at,
        )
    return updated, True


def _restarted(
    current: Definition, timing: DefinitionSpec | Definition, clock: datetime
) -> tuple[datetime, datetime | None]:
    """A high-water mark and next fire time that start `timing`'s schedule afresh at `clock`.

    Used when a paused definition resumes and when a schedule or timezone changes: what
    would have fired before is not made up (it was paused, or it was another schedule).
    """
    mark = max(current.materialized_through, clock)
    return mark, first_fire_after(timing, mark)


def remove(conn: Any, name: str) -> Definition:
    """Delete a definition. Its runs stay (unlinked from it); queued ones still run."""
    with conn.transaction():
        current = store.definition_get(conn, name, lock=True)
        if current is None:
            raise DefinitionNotFound(f"schedule {excerpt(name)} not found")
        store.definition_delete(conn, current.id)
    return current


# -- declarative files ----------------------------------------------------


@dataclass(frozen=True)
class PlanItem:
    """What `sync` does (or would do) to one definition."""

    action: str  # add | change | unchanged | remove | keep (absent from the file, no --prune)
    name: str
    changes: tuple[str, ...] = ()


def load_file(text: str, *, source: str) -> list[DefinitionSpec]:
    """Parse and validate a TOML file of definitions; raises BadInput for the first problem.

    [schedules.nightly-report]
    cron = "30 2 * * *"
    type = "reports.nightly"
    timezone = "Europe/Amsterdam"
    payload = { format = "pdf" }
    """
    import tomllib

    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{source}: invalid TOML: {one_line(str(exc), limit=200)}") from None
    except RecursionError:
        raise BadInput(f"{source}: invalid TOML: nested too deep") from None
    except ValueError:
        # tomllib hands some values to int() unchecked, which refuses thousands of digits.
        raise BadInput(f"{source}: invalid TOML: a number too large") from None
    # [limits.TYPE] tables are flow control's (cronjob.limits.declared_limits).
    unknown = sorted(set(document) - {"schedules", "limits"})
    if unknown:
        raise BadInput(
            f"{source}: unknown top-level key {excerpt(unknown[0])} "
            "(definitions go in [schedules.NAME] tables, limits in [limits.TYPE] tables)"
        )
    tables = document.get("schedules", {})
    if not isinstance(tables, dict):
        raise BadInput(f"{source}: 'schedules' must be a table of [schedules.NAME] tables")
    return [_spec_from_table(name, table, source) for name, table in tables.items()]


def load_file_limits(text: str, *, source: str) -> list[Any] | None:
    """The file's `[limits.TYPE]` tables, checked (cronjob.limits); None if it has none.
    Call after load_file, which has checked the TOML."""
    import tomllib

    from cronjob.limits import declared_limits

    tables = tomllib.loads(text).get("limits")
    return None if tables is None else declared_limits(tables, where=source)


def _spec_from_table(name: str, table: Any, source: str) -> DefinitionSpec:
    where = f"{source}: schedule {excerpt(name)}"
    if not isinstance(table, dict):
        raise BadInput(f"{where}: expected a table of settings ([schedules.{name}])")
    check_keys(where, table, FILE_KEYS, ("cron", "type"))
    try:
        return definition_spec(name, **{FILE_KEYS[key]: value for key, value in table.items()})
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def check_keys(
    where: str, table: dict[Any, Any], allowed: Sequence[str], required: Sequence[str]
) -> None:
    """BadInput for the first key of `table` not `allowed`, or the first `required` missing."""
    unknown = sorted(set(table) - set(allowed), key=str)
    if unknown:
        raise BadInput(
            f"{where}: unknown key {excerpt(str(unknown[0]))} (expected {', '.join(allowed)})"
        )
    for key in required:
        if key not in table:
            raise BadInput(f"{where}: missing key {key!r}")


def plan_sync(
    existing: Sequence[Definition], specs: Sequence[DefinitionSpec], *, prune: bool
) -> list[PlanItem]:
    """Pure: compare the database's definitions with the file's, in file order."""
    current = {d.name: d for d in existing}
    wanted = {spec.name for spec in specs}
    items = []
    for spec in specs:
        found = current.get(spec.name)
        if found is None:
            items.append(PlanItem("add", spec.name))
            continue
        changes = _differences(found, spec)
        items.append(PlanItem("change" if changes else "unchanged", spec.name, changes))
    for name in sorted(set(current) - wanted):
        items.append(PlanItem("remove" if prune else "keep", name))
    return items


def _differences(current: Definition, spec: DefinitionSpec) -> tuple[str, ...]:
    import json

    def canonical(payload: Any) -> str:
        # json.dumps, not ==: True == 1 in Python but not in JSON.
        return json.dumps(payload, sort_keys=True)

    pairs: list[tuple[str, Any, Any]] = [
        ("type", current.job_type, spec.job_type),
        ("cron", current.schedule, spec.schedule),
        ("timezone", current.timezone, spec.timezone),
        ("payload", canonical(current.payload), canonical(spec.payload)),
        ("scope", current.scope, spec.scope),
        ("max_attempts", current.max_attempts, spec.max_attempts),
        ("priority", current.priority, spec.priority),
        ("catch_up", current.catch_up, spec.catch_up),
        ("catch_up_limit", current.catch_up_limit, spec.catch_up_limit),
        ("overlap", current.overlap, spec.overlap),
        ("expect_within", current.expect_within, spec.expect_within),
        ("ping_url", current.ping_url, spec.ping_url),
        ("ping_failure_url", current.ping_failure_url, spec.ping_failure_url),
        ("then", current.then_type, spec.then_type),
    ]
    if spec.enabled is not None:
        pairs.append(("enabled", current.enabled, spec.enabled))
    return tuple(name for name, old, new in pairs if old != new)


def sync(
    conn: Any,
    specs: Sequence[DefinitionSpec],
    *,
    prune: bool = False,
    dry_run: bool = False,
    now: datetime | None = None,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    progress: Progress = QUIET,
) -> list[PlanItem]:
    """Make the database's definitions match `specs` (upsert by name), in one transaction.

    A definition whose schedule or timezone changes, or that the file enables again, starts
    afresh from now, like a new one. A paused definition stays paused unless the file says
    `enabled = true`. With `prune`, definitions absent from `specs` are removed. A sync
    that another host is running is waited for, at most `lock_wait` seconds. `progress`
    counts the definitions written, and may stop the sync before any of them (raising
    Stopped, which rolls the transaction back).
    """
    with conn.transaction():
        if not dry_run:
            locks.take(conn, store.definitions_lock_for_sync, what="schedule sync", wait=lock_wait)
        existing = store.definitions_list(conn, lock=not dry_run)
        items = plan_sync(existing, specs, prune=prune)
        if dry_run:
            return items
        clock = store.clock_now(conn, now=now)
        current = {d.name: d for d in existing}
        by_name: Mapping[str, DefinitionSpec] = {spec.name: spec for spec in specs}
        progress.expect(sum(item.action in WRITES for item in items))
        for item in items:
            if item.action not in WRITES:
                continue
            progress.checkpoint()
            if item.action == "add":
                spec = by_name[item.name]
                store.definition_insert(
                    conn,
                    spec,
                    enabled=spec.enabled is not False,
                    now=clock,
                    next_fire_at=first_fire_after(spec, clock),
                )
            elif item.action == "change":
                _apply_change(conn, current[item.name], by_name[item.name], clock)
            elif item.action == "remove":
                store.definition_delete(conn, current[item.name].id)
            progress.advance(1)
    return items


def _apply_change(conn: Any, current: Definition, spec: DefinitionSpec, clock: datetime) -> None:
    enabled = current.enabled if spec.enabled is None else spec.enabled
    mark, next_fire_at = current.materialized_through, current.next_fire_at
    if not _same_timing(current, spec) or (enabled and not current.enabled):
        mark, next_fire_at = _restarted(current, spec, clock)
    store.definition_update(
        conn,
        current.id,
        spec,
        enabled=enabled,
        now=clock,
        materialized_through=mark,
        next_fire_at=next_fire_at,
    )
