"""One measured (or not measured) number, as reported and as written to results.json."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    section: str  # drain | idle | profile | growth | enqueue | rss | schedules | memory | async
    system: str  # registry name, e.g. "pgqueuer"
    label: str  # display name
    variant: str  # e.g. "default", "tuned", "empty"
    metric: str  # what the samples are, e.g. "jobs/s", "ms", "MiB"
    samples: list[float] = field(default_factory=list)
    status: str = "ok"  # "ok" | "not run: <why>" | "failed: <why>"
    settings: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.samples)

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["median"] = self.median
        return data


def find(rows: list[Row], section: str, system: str, variant: str, metric: str = "") -> Row | None:
    for row in rows:
        if (row.section, row.system, row.variant) == (section, system, variant) and (
            not metric or row.metric == metric
        ):
            return row
    return None
