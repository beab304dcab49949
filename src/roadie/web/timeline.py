"""The run page's timeline: phases and steps laid out on one time axis, drawn as SVG.

Each step is a bar from its first dispatch to its end (or to now while it runs), split
into one segment per attempt, coloured by how that attempt ended; the space between
attempts is the retry backoff. Drawn on the server, so the page needs no charting code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from roadie.store.rows import RunRow, StepRow

WIDTH = 960
LABEL = 210  # the left column, for phase and step names
ROW = 24
PHASE_ROW = 26
AXIS = 28
COLOURS = {
    "succeeded": "#2e9d5b",
    "failed": "#d64545",
    "retry": "#e0a526",
    "running": "#2f7fd1",
    "ready": "#9aa7b8",
    "skipped": "#c3c9d1",
}


@dataclass
class Segment:
    x: float
    width: float
    colour: str
    title: str


@dataclass
class Row:
    y: float
    label: str
    note: str  # "3 attempts", "waiting"
    status: str
    segments: list[Segment] = field(default_factory=list)


@dataclass
class Band:
    y: float
    height: float
    label: str


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class Timeline:
    width: int
    height: int
    label_width: int
    bands: list[Band]
    rows: list[Row]
    ticks: list[Tick]
    now_x: float | None
    span: float


def _parse(value: object) -> datetime | None:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def layout(run: RunRow, steps: list[StepRow], now: datetime) -> Timeline:
    """Where everything goes, in SVG units. Times are seconds since the run started."""
    origin = run.started_at or run.created_at
    end = run.ended_at or now
    for s in steps:
        if s.ended_at and s.ended_at > end:
            end = s.ended_at
    span = max((end - origin).total_seconds(), 1.0)
    plot = WIDTH - LABEL - 16

    def x(t: datetime) -> float:
        return LABEL + max(0.0, (t - origin).total_seconds()) / span * plot

    phases = [p.get("name", f"phase {i + 1}") for i, p in enumerate(run.definition.get("phases", []))]
    bands: list[Band] = []
    rows: list[Row] = []
    y = float(AXIS)
    for index, name in enumerate(phases):
        of_phase = [s for s in steps if s.phase == index]
        height = PHASE_ROW + ROW * max(len(of_phase), 1)
        bands.append(Band(y, height, f"{index + 1}. {name}"))
        y += PHASE_ROW
        if not of_phase:
            rows.append(Row(y, "not begun", "", "ready"))
        for s in of_phase:
            row = Row(y, s.name, "", s.status)
            for entry in s.attempt_log or []:
                began, ended = _parse(entry.get("at")), _parse(entry.get("ended"))
                if began is None or ended is None:
                    continue
                result = str(entry.get("result", ""))
                title = f"attempt {entry.get('attempt')}: {result}, {(ended - began).total_seconds():.2f}s"
                if entry.get("error"):
                    title += f" — {entry['error']}"
                row.segments.append(
                    Segment(x(began), max(x(ended) - x(began), 2.0), COLOURS.get(result, "#888"), title)
                )
            if s.status == "running" and s.started_at:
                row.segments.append(
                    Segment(x(s.started_at), max(x(now) - x(s.started_at), 2.0), COLOURS["running"], "running")
                )
            if s.attempts > 1:
                row.note = f"{s.attempts} attempts"
            elif s.status == "ready":
                row.note = "waiting"
            rows.append(row)
            y += ROW
        if not of_phase:
            y += ROW
    ticks = [Tick(LABEL + plot * i / 5, f"{span * i / 5:.1f}s") for i in range(6)]
    now_x = x(now) if run.ended_at is None and run.started_at else None
    return Timeline(WIDTH, int(y + 8), LABEL, bands, rows, ticks, now_x, span)
