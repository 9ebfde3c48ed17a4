"""The overview's charts, drawn on the server as SVG: no script, no library, no request.

Pure: minutes in, markup out. Every number is formatted here and every label is placed
in the page's HTML around the chart, so the SVG holds coordinates and class names alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup

from cronjob.store.dashboard import ChartMinute

MINUTES = 24 * 60
WIDTH = MINUTES  # a unit of width per minute
HEIGHT = 120


@dataclass(frozen=True)
class Chart:
    """An SVG and what its axes mean."""

    svg: Markup
    peak: float  # the value the top of the chart stands for
    series: tuple[str, ...]  # the class names drawn, in the order of the legend


def _slot(minute: datetime, now: datetime) -> int | None:
    """The minute's x position: 0 a day ago, MINUTES - 1 the current minute."""
    back = int((now - minute) // timedelta(minutes=1))
    slot = MINUTES - 1 - back
    return slot if 0 <= slot < MINUTES else None


def _path(values: Sequence[float], peak: float) -> str:
    """A step line through one value per minute, scaled so `peak` touches the top."""
    scale = (HEIGHT - 2) / peak if peak > 0 else 0.0
    points, level = [f"M0,{HEIGHT}"], float(HEIGHT)
    for x, value in enumerate(values):
        y = round(HEIGHT - value * scale, 1)
        if y != level:  # a point where the line steps; flat stretches need none
            points.append(f"L{x},{level}L{x},{y}")
            level = y
    points.append(f"L{WIDTH},{level}L{WIDTH},{HEIGHT}Z")
    return "".join(points)


def _svg(layers: Sequence[tuple[str, Sequence[float]]], peak: float, title: str) -> Markup:
    paths = "".join(
        f'<path class="series {name}" d="{_path(values, peak)}"/>' for name, values in layers
    )
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none"'
        f' role="img" aria-label="{Markup.escape(title)}">'
        f'<rect class="frame" x="0" y="0" width="{WIDTH}" height="{HEIGHT}"/>{paths}</svg>'
    )


def finished_per_minute(minutes: Sequence[ChartMinute], now: datetime) -> Chart:
    """Runs finished in each minute of the last day, stacked: succeeded under dead under
    cancelled, so the top line is every run that finished."""
    series = {"succeeded": [0.0] * MINUTES, "dead": [0.0] * MINUTES, "cancelled": [0.0] * MINUTES}
    for row in minutes:
        slot = _slot(row.minute, now)
        if slot is not None:
            series["succeeded"][slot] = row.succeeded
            series["dead"][slot] = row.dead
            series["cancelled"][slot] = row.cancelled
    stacked, below = [], [0.0] * MINUTES
    for name in ("succeeded", "dead", "cancelled"):
        below = [b + v for b, v in zip(below, series[name], strict=True)]
        stacked.append((name, below))
    peak = max(below, default=0.0)
    # The tallest layer first, so the lower ones are drawn over it and stay visible.
    svg = _svg(list(reversed(stacked)), peak, "runs finished per minute, last 24 hours")
    return Chart(svg, peak, ("succeeded", "dead", "cancelled"))


def longest_wait(minutes: Sequence[ChartMinute], now: datetime) -> Chart:
    """For each minute of the last day, the longest a run that started in it had waited
    since it was due: the queue's age, as the runs that left it saw it."""
    values = [0.0] * MINUTES
    for row in minutes:
        slot = _slot(row.minute, now)
        if slot is not None and row.longest_wait is not None:
            values[slot] = row.longest_wait
    peak = max(values, default=0.0)
    return Chart(
        _svg([("wait", values)], peak, "longest wait before start, last 24 hours"), peak, ("wait",)
    )
