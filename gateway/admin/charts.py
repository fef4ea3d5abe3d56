"""A job's logged metrics grouped into the charts of its page.

Any metric name may be logged, so names are sorted into the four panels a reader looks for
first (reward, loss, KL, throughput) by the words in them; every other name gets a chart of its
own. Each chart's data is aligned for uPlot: one shared list of steps and, per series, a value
or None at each step (series of one chart need not share steps).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.schemas import MetricSeries

# (panel title, what its names contain). Checked in order: `reward_loss` counts as reward.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("reward", "return", "accuracy", "score")),
    ("Loss", ("loss",)),
    ("KL", ("kl",)),
    ("Throughput", ("throughput", "per_s", "per_sec", "tokens_s", "samples_s", "per_second")),
)
_WORD = re.compile(r"[^a-z0-9]+")


@dataclass
class Chart:
    title: str
    slug: str
    series: list[MetricSeries] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(len(s.steps) for s in self.series)

    def uplot_data(self) -> dict[str, Any]:
        """{"names": [...], "data": [steps, values of series 1, ...]}, aligned on steps."""
        steps = sorted({step for s in self.series for step in s.steps})
        index = {step: i for i, step in enumerate(steps)}
        columns: list[list[float | None]] = []
        for line in self.series:
            column: list[float | None] = [None] * len(steps)
            for step, value in zip(line.steps, line.values, strict=True):
                column[index[step]] = value
            columns.append(column)
        return {"title": self.title, "names": [s.name for s in self.series],
                "data": [steps, *columns], "points": self.points}


def panel_of(name: str) -> str | None:
    lowered = name.lower()
    words = set(_WORD.split(lowered))
    for title, needles in PANELS:
        for needle in needles:
            # Short needles must be a whole word ("kl" in "kl/mean", not in "weekly").
            if (needle in words) if len(needle) <= 3 else (needle in lowered):
                return title
    return None


def build_charts(series: list[MetricSeries]) -> list[Chart]:
    """The four standard panels (empty ones included, so the page says nothing was logged),
    then one chart per metric that fits none of them, in name order."""
    charts = {title: Chart(title=title, slug=_slug(title)) for title, _ in PANELS}
    extra: list[Chart] = []
    slugs = {chart.slug for chart in charts.values()}
    for line in sorted(series, key=lambda s: s.name):
        title = panel_of(line.name)
        if title is not None:
            charts[title].series.append(line)
            continue
        slug = _slug(line.name)
        while slug in slugs:  # "a.b" and "a-b" slug alike; element ids must stay unique
            slug += "-x"
        slugs.add(slug)
        extra.append(Chart(title=line.name, slug=slug, series=[line]))
    return [*charts.values(), *extra]


def charts_payload(charts: list[Chart]) -> dict[str, Any]:
    """What the page's script draws, keyed by chart slug (also served as JSON for refreshes)."""
    return {chart.slug: chart.uplot_data() for chart in charts}


def _slug(text: str) -> str:
    return "chart-" + (_WORD.sub("-", text.lower()).strip("-") or "metric")
