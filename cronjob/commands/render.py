"""How commands print what they found: tables, times and clipped text, written once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from cronjob.text import one_line, printable


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right_from: int | None = None,
    bold_header: bool = False,
) -> None:
    """Columns two spaces apart, each as wide as its widest cell; columns from `right_from`
    on (counts, ages) are right-aligned. Trailing blanks are dropped from every line."""
    headers = [printable(h) for h in headers]
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if right_from is not None and i >= right_from else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    # click drops the styling when stdout is not a terminal.
    click.echo(click.style(line(headers), bold=True) if bold_header else line(headers))
    for row in rows:
        click.echo(line(row))


def when(moment: Any) -> str:
    """A database time as the operator reads it, with its offset; empty for none."""
    return moment.strftime("%Y-%m-%d %H:%M:%S%z") if moment else ""


def iso(value: Any) -> Any:
    """Times as ISO-8601 text for JSON output; every other value as it is."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def clip(text: str, width: int) -> str:
    """`text` on one line, printable, cut to `width` characters with an ellipsis if it is
    longer."""
    text = printable(one_line(text))
    return text if len(text) <= width else text[: width - 1] + "…"


def definition_json(d: Any) -> dict[str, Any]:
    """A schedule as `schedule list --json` and `schedule show --json` print it."""
    return {
        "id": d.id, "name": d.name, "type": d.job_type, "cron": d.schedule,
        "timezone": d.timezone, "scope": d.scope, "payload": d.payload,
        "max_attempts": d.max_attempts, "priority": d.priority, "catch_up": d.catch_up,
        "catch_up_limit": d.catch_up_limit, "overlap": d.overlap,
        "overlap_skips": d.overlap_skips, "expect_within": d.expect_within,
        "ping_url": d.ping_url, "ping_failure_url": d.ping_failure_url, "then": d.then_type,
        "enabled": d.enabled,
        "materialized_through": iso(d.materialized_through),
        "next_fire_at": iso(d.next_fire_at), "created_at": iso(d.created_at),
        "updated_at": iso(d.updated_at),
    }  # fmt: skip
