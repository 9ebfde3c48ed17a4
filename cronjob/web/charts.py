"""The overview's charts, drawn on the server as SVG: no script, no library, no request.

Pure: minutes in, markup out. Every number is formatted here and every label is placed
in the page's HTML around the chart, so the SVG holds coordinates and class names alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup

from cronjob.store.dashboard import ChartMinute

MINUTES = 24 * 60
WIDTH = MINUTES  # a unit of width per minute
HEIGHT = 120
# A burst among quiet minutes: when the busiest minute is more than this many times a typical
# minute with any (the median of them), a linear scale would draw the rest flat along the
# bottom; the chart then uses a log scale, says so, and draws a line at each power of ten.
BURST_RATIO = 20.0


@dataclass(frozen=True)
class Chart:
    """An SVG and what its axes mean."""

    svg: Markup
    peak: float  # the value the top of the chart stands for
    series: tuple[str, ...]  # the class names drawn, in the order of the legend
    scale: str = "linear"  # or "log": a burst among quiet minutes
    grid: tuple[float, ...] = ()  # the values of the lines drawn across (log scale)


def _scale_of(values: Sequence[float]) -> str:
    busy = sorted(v for v in values if v > 0)
    if not busy:
        return "linear"
    typical = busy[len(busy) // 2]
    return "log" if busy[-1] > BURST_RATIO * typical else "linear"


def _height(value: float, peak: float, scale: str) -> float:
    """Where `value` stands, from 0 (the bottom) to HEIGHT - 2 (`peak`, near the top)."""
    if peak <= 0:
        return 0.0
    if scale == "log":
        return (HEIGHT - 2) * math.log10(1 + value) / math.log10(1 + peak)
    return (HEIGHT - 2) * value / peak


def _grid(peak: float, scale: str) -> tuple[float, ...]:
    if scale != "log" or peak < 10:
        return ()
    return tuple(10.0**k for k in range(1, int(math.log10(peak)) + 1))


def _slot(minute: datetime, now: datetime) -> int | None:
    """The minute's x position: 0 a day ago, MINUTES - 1 the current minute."""
    back = int((now - minute) // timedelta(minutes=1))
    slot = MINUTES - 1 - back
    return slot if 0 <= slot < MINUTES else None


def _path(values: Sequence[float], peak: float, scale: str = "linear") -> str:
    """A step line through one value per minute, scaled so `peak` touches the top."""
    points, level = [f"M0,{HEIGHT}"], float(HEIGHT)
    for x, value in enumerate(values):
        y = round(HEIGHT - _height(value, peak, scale), 1)
        if y != level:  # a point where the line steps; flat stretches need none
            points.append(f"L{x},{level}L{x},{y}")
            level = y
    points.append(f"L{WIDTH},{level}L{WIDTH},{HEIGHT}Z")
    return "".join(points)


def _svg(
    layers: Sequence[tuple[str, Sequence[float]]],
    peak: float,
    title: str,
    scale: str = "linear",
) -> Markup:
    paths = "".join(
        f'<path class="series {name}" d="{_path(values, peak, scale)}"/>' for name, values in layers
    )
    for value in _grid(peak, scale):
        y = round(HEIGHT - _height(value, peak, scale), 1)
        paths += f'<path class="grid" d="M0,{y}H{WIDTH}"/>'

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
    scale = _scale_of(below)
    # The tallest layer first, so the lower ones are drawn over it and stay visible.
    title = "runs finished per minute, last 24 hours" + (", log scale" if scale == "log" else "")
    svg = _svg(list(reversed(stacked)), peak, title, scale)
    return Chart(svg, peak, ("succeeded", "dead", "cancelled"), scale, _grid(peak, scale))


def longest_wait(minutes: Sequence[ChartMinute], now: datetime) -> Chart:
    """For each minute of the last day, the longest a run that started in it had waited
    since it was due: the queue's age, as the runs that left it saw it."""
    values = [0.0] * MINUTES
    for row in minutes:
        slot = _slot(row.minute, now)
        if slot is not None and row.longest_wait is not None:
            values[slot] = row.longest_wait
    peak = max(values, default=0.0)
    scale = _scale_of(values)
    title = "longest wait before start, last 24 hours" + (", log scale" if scale == "log" else "")
    svg = _svg([("wait", values)], peak, title, scale)
    return Chart(svg, peak, ("wait",), scale, _grid(peak, scale))
