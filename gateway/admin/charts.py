"""A job's logged metrics grouped into the charts of its page.

A name `phase/metric` belongs to a phase (`sft/loss`, `rl/reward`, `eval/accuracy`) unless its
prefix is itself a panel word (`kl/mean`, `throughput/samples_per_s` stay unphased): phases run
one after another, each counting its own steps, so each gets its own charts and step axis.
Within a phase, names are sorted into the four panels a reader looks for first (reward, loss,
KL, throughput) by the words in them; every other name gets a chart of its own. Each chart's
data is aligned for uPlot: one shared list of steps and, per series, a value or None at each
step (series of one chart need not share steps).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gateway.jobs.metric_names import PANELS, PHASE_ORDER, panel_of, phase_of
from gateway.schemas import MetricSeries

_WORD = re.compile(r"[^a-z0-9]+")


@dataclass
class Chart:
    title: str
    slug: str
    phase: str = ""
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
        return {
            "title": self.title,
            "names": [s.name for s in self.series],
            "axis": f"{self.phase} step".lstrip(),
            "data": [steps, *columns],
            "points": self.points,
        }


def build_charts(series: list[MetricSeries]) -> list[Chart]:
    """Per phase (unphased first, then `PHASE_ORDER`, then by name): its standard panels that
    hold data, then one chart per metric that fits none of them, in name order. With no
    phased metric the four standard panels all show, empty ones included, so the page says
    nothing was logged."""
    phases: dict[str, list[MetricSeries]] = {}
    for line in series:
        phases.setdefault(phase_of(line.name), []).append(line)
    order = sorted(
        phases, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER), p)
    )
    keep_empty = set(phases) <= {""}
    slugs: set[str] = set()
    charts: list[Chart] = []
    for phase in order or [""]:
        charts += _phase_charts(phase, phases.get(phase, []), slugs, keep_empty)
    return charts


def _phase_charts(
    phase: str, series: list[MetricSeries], slugs: set[str], keep_empty: bool
) -> list[Chart]:
    prefix = f"{phase} " if phase else ""
    panels = {
        title: Chart(title=title, slug=_unique(prefix + title, slugs), phase=phase)
        for title, _ in PANELS
    }
    extra: list[Chart] = []
    for line in sorted(series, key=lambda s: s.name):
        short = line.name.removeprefix(f"{phase}/") if phase else line.name
        title = panel_of(short)
        if title is not None:
            panels[title].series.append(line)
            continue
        extra.append(
            Chart(title=line.name, slug=_unique(line.name, slugs), phase=phase, series=[line])
        )
    return [c for c in panels.values() if keep_empty or c.series] + extra


def charts_payload(charts: list[Chart]) -> dict[str, Any]:
    """What the page's script draws, keyed by chart slug (also served as JSON for refreshes)."""
    return {chart.slug: chart.uplot_data() for chart in charts}


def _unique(text: str, taken: set[str]) -> str:
    """An element id for `text`: "a.b" and "a-b" slug alike, so a repeat gets "-x" added."""
    slug = "chart-" + (_WORD.sub("-", text.lower()).strip("-") or "metric")
    while slug in taken:
        slug += "-x"
    taken.add(slug)
    return slug
