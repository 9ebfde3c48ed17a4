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
