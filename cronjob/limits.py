"""Flow control's limits, as given by any door: `jobrunner limit`, a schedule file's
`[limits.TYPE]` table, Django's JOBRUNNER settings. Each door hands its words to `parse_limit`
and gets one checked models.TypeLimit, and `describe` says a limit the same way everywhere.

How the claim enforces them: docs/guides/flow-control.md, and migration 0021.
"""

from __future__ import annotations

import re
from typing import Any

from cronjob.errors import BadInput
from cronjob.inputs import check_text, parse_duration, parse_integer
from cronjob.models import TypeLimit

_MAX = 2**31 - 1
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\S+)\s*")


def parse_per(value: str | None, *, what: str = "--per") -> tuple[str, str | None]:
    """`tenant` or `payload:FIELD` (None: the whole type) as (per, per_field)."""
    if value is None or value == "type":
        return "type", None
    text = check_text(value, what=what, max_length=200)
    if text == "tenant":
        return "tenant", None
    kind, colon, field = text.partition(":")
    if kind == "payload" and colon and field:
        return "payload", field
    raise BadInput(f"invalid {what} {text!r}: expected tenant or payload:FIELD")


def parse_rate(value: str, *, what: str = "--rate") -> tuple[int, float]:
    """`N/DURATION` (`10/1s`, `500/1h`) as (starts, period in seconds)."""
    text = check_text(value, what=what, max_length=100)
    match = _RATE.fullmatch(text)
    if match is None:
        raise BadInput(f"invalid {what} {text!r}: expected N/DURATION, e.g. 10/1s or 500/1h")
    starts = parse_integer(match[1], what=what, low=1, high=_MAX)
    period = parse_duration(match[2], what=what)
    if period <= 0:
        raise BadInput(f"invalid {what} {text!r}: the period must be longer than 0")
    return starts, period


def parse_limit(
    job_type: Any,
    *,
    concurrency: Any = None,
    per: str | None = None,
    rate: str | None = None,
    reason: str | None = None,
    names: dict[str, str] | None = None,
) -> TypeLimit:
    """A limit from a door's words; raises BadInput naming the first bad one. `names`: what
    the door calls each word in its messages (default: the command line's flags)."""
    named = {"concurrency": "--concurrency", "per": "--per", "rate": "--rate", **(names or {})}
    check_text(job_type, what="job type", max_length=200)
    if concurrency is None and rate is None:
        raise BadInput(f"give {named['concurrency']}, {named['rate']} or both")
    cap = None
    if concurrency is not None:
        cap = parse_integer(concurrency, what=named["concurrency"], low=1, high=_MAX)
    starts, period = (None, None) if rate is None else parse_rate(rate, what=named["rate"])
    kind, field = parse_per(per, what=named["per"])
    return TypeLimit(job_type, cap, starts, period, kind, field, reason)


def describe(limit: TypeLimit) -> str:
    """A limit in words: `at most 2 running, 10 starts per 1s, per tenant`."""
    parts = []
    if limit.concurrency is not None:
        parts.append(f"at most {limit.concurrency} running")
    if limit.rate is not None and limit.rate_period is not None:
        parts.append(f"{limit.rate} starts per {period_text(limit.rate_period)}")
    per = {"type": "for the whole type", "tenant": "per tenant"}.get(
        limit.per, f"per payload field {limit.per_field}"
    )
    return ", ".join(parts) + f", {per}"


def per_text(limit: TypeLimit) -> str:
    """The limit's key as `--per` spells it: type, tenant or payload:FIELD."""
    return f"payload:{limit.per_field}" if limit.per == "payload" else limit.per


def rate_text(limit: TypeLimit) -> str | None:
    """The rate as `--rate` spells it, or None."""
    if limit.rate is None or limit.rate_period is None:
        return None
    return f"{limit.rate}/{period_text(limit.rate_period)}"


def period_text(seconds: float) -> str:
    """A rate's period as a duration is written: `1s`, `5m`, `1h`, `1d`, `1.5s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- limits declared in a file or in settings, applied by a sync --

DECLARED_KEYS = ("concurrency", "per", "rate", "reason")


def declared_limits(tables: Any, *, where: str) -> list[TypeLimit]:
    """The limits of a schedule file's `[limits.TYPE]` tables, or of Django's OPTIONS
    "LIMITS" (a dict of TYPE: settings); raises BadInput naming the first problem."""
    if not isinstance(tables, dict):
        raise BadInput(f"{where}: limits must be a table of TYPE: settings")
    found = []
    for job_type, table in tables.items():
        here = f"{where} limit {job_type!r}"
        if not isinstance(table, dict):
            raise BadInput(f"{here}: expected a table of settings")
        unknown = sorted(str(key) for key in table if key not in DECLARED_KEYS)
        if unknown:
            raise BadInput(
                f"{here}: unknown key {unknown[0]!r} (known: {', '.join(DECLARED_KEYS)})"
            )
        reason = table.get("reason")
        if reason is not None:
            reason = check_text(reason, what="reason", max_length=1000)
        try:
            limit = parse_limit(
                job_type,
                concurrency=table.get("concurrency"),
                per=table.get("per"),
                rate=table.get("rate"),
                reason=reason,
                names={"concurrency": "concurrency", "per": "per", "rate": "rate"},
            )
        except BadInput as exc:
            raise BadInput(f"{here}: {exc}") from None
        found.append(limit)
    return found


def _same(current: TypeLimit, wanted: TypeLimit) -> bool:
    fields = ("concurrency", "rate", "rate_period", "per", "per_field", "reason")
    return all(getattr(current, f) == getattr(wanted, f) for f in fields)


def sync(
    conn: Any, wanted: list[TypeLimit] | None, *, prune: bool, dry_run: bool, actor: str
) -> list[tuple[str, str]]:
    """Make the limits match `wanted`, in the caller's transaction: each job type's action
    (`limit`, `unchanged`, `unlimit` with `prune`, else `keep`), as (action, job type). With
    `wanted` None (a file or settings without limits), nothing: not even `prune` clears them."""
    from cronjob import store

    if wanted is None:
        return []
    current = {limit.job_type: limit for limit in store.job_type_limits_list(conn)}
    actions = []
    for limit in wanted:
        held = current.pop(limit.job_type, None)
        if held is not None and _same(held, limit):
            actions.append(("unchanged", limit.job_type))
            continue
        actions.append(("limit", limit.job_type))
        if not dry_run:
            store.job_type_limit_set(conn, limit, actor=actor)
    for job_type in sorted(current):
        actions.append(("unlimit" if prune else "keep", job_type))
        if prune and not dry_run:
            store.job_type_limit_clear(conn, job_type)
    return actions
