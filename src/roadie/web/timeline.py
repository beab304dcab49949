"""The run page's timeline: phases and steps laid out on one time axis, drawn as SVG.

Each step is a bar from its first dispatch to its end (or to now while it runs), split
into one segment per attempt, coloured by how that attempt ended; the space between
attempts is the retry backoff, and the row says how long the step took (a step of a few
milliseconds is a few pixels wide on an axis of seconds). A phase's `after:` wait is
drawn in its band, from the end of the phase before to its first dispatch; the run's
`duration:` hold and its cleanup are rows of their own after the phases. The axis is
marked at round values (1, 2 or 5 times a power of ten). Drawn on the server, so the page
needs no charting code.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from markupsafe import Markup, escape

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
    "wait": "#9aa7b8",
    "cleanup": "#7a5cc4",
}
MIN_WIDTH = 4.0  # px: the narrowest bar drawn, however short the attempt


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
    waits: list[Segment] = field(default_factory=list)  # its `after:` wait, drawn in its header


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


def draw(t: Timeline) -> Markup:
    """The timeline as an SVG element. Written here rather than in a template: a run page
    draws several elements per step, and Jinja escaping each number costs more than the
    rest of the page's markup together. Every text is escaped; numbers need not be."""
    out = [
        f'<svg class="timeline" viewBox="0 0 {t.width} {t.height}" width="100%" role="img" '
        'aria-label="timeline of the run\'s phases and steps">'
    ]
    for index, b in enumerate(t.bands, start=1):
        label = escape(b.label)
        out.append(f'<rect x="0" y="{b.y}" width="{t.width}" height="{b.height}" class="band{index % 2}"/>')
        out.append(f'<text x="8" y="{b.y + 17}" class="phase">{label}</text>')
        for w in b.waits:
            out.append(
                f'<rect x="{w.x:.1f}" y="{b.y + 8}" width="{w.width:.1f}" height="10" rx="3" '
                f'fill="{w.colour}" opacity="0.6"><title>{label} — {escape(w.title)}</title></rect>'
            )
    for k in t.ticks:
        out.append(f'<line x1="{k.x}" y1="18" x2="{k.x}" y2="{t.height}" class="tick"/>')
        out.append(f'<text x="{k.x}" y="13" class="axis" text-anchor="middle">{escape(k.label)}</text>')
    for r in t.rows:
        label = escape(r.label)
        out.append(f'<text x="20" y="{r.y + 16}" class="step">{escape(r.label[:28])}</text>')
        for s in r.segments:
            out.append(
                f'<rect x="{s.x:.1f}" y="{r.y + 5}" width="{s.width:.1f}" height="14" rx="3" '
                f'fill="{s.colour}"><title>{label} — {escape(s.title)}</title></rect>'
            )
        if r.note:
            last = r.segments[-1] if r.segments else None
            at = (last.x + last.width + 6) if last else t.label_width
            out.append(f'<text x="{at:.1f}" y="{r.y + 16}" class="note">{escape(r.note)}</text>')
    if t.now_x:
        out.append(f'<line x1="{t.now_x}" y1="18" x2="{t.now_x}" y2="{t.height}" class="now"/>')
    out.append("</svg>")
    return Markup("\n".join(out))


def _parse(value: object) -> datetime | None:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def layout(run: RunRow, steps: list[StepRow], now: datetime, *, compact: bool = False) -> Timeline:
    """Where everything goes, in SVG units. Times are seconds since the run started.
    `compact` draws a row per phase rather than per step (a run of a thousand steps
    would be a picture tens of thousands of pixels tall): one bar from the phase's first
    dispatch to its last end, coloured by the worst of its steps, saying their counts."""
    origin = run.started_at or run.created_at
    end = run.cleanup_ended_at or run.ended_at or now
    if run.cleanup_started_at and not run.cleanup_ended_at:
        end = now
    for s in steps:
        if s.ended_at and s.ended_at > end:
            end = s.ended_at
    span = max((end - origin).total_seconds(), 1.0)
    plot = WIDTH - LABEL - 16

    def x(t: datetime) -> float:
        return LABEL + max(0.0, (t - origin).total_seconds()) / span * plot

    def segment(began: datetime, ended: datetime, colour: str, title: str) -> Segment:
        return Segment(x(began), max(x(ended) - x(began), MIN_WIDTH), colour, title)

    phases = run.definition.get("phases", [])
    bands: list[Band] = []
    rows: list[Row] = []
    y = float(AXIS)
    previous_end: datetime | None = run.started_at
    for index, phase in enumerate(phases):
        name = phase.get("name", f"phase {index + 1}")
        of_phase = [s for s in steps if s.phase == index]
        height = PHASE_ROW + ROW * (1 if compact else max(len(of_phase), 1))
        band = Band(y, height, f"{index + 1}. {name}")
        bands.append(band)
        first = min((b for s in of_phase if (b := _first_dispatch(s)) is not None), default=None)
        after = phase.get("after")
        if after and previous_end is not None and first is not None and first > previous_end:
            band.waits.append(
                segment(previous_end, first, COLOURS["wait"], f"after: waited {_took(first - previous_end)}")
            )
        y += PHASE_ROW
        if not of_phase:
            rows.append(Row(y, "not begun", "", "ready"))
        elif compact:
            rows.append(_phase_row(of_phase, y, now, segment))
        else:
            for s in of_phase:
                rows.append(_step_row(s, y, now, segment))
                y += ROW
        if not of_phase or compact:
            y += ROW
        ends = [s.ended_at for s in of_phase if s.ended_at]
        previous_end = max(ends) if ends and len(ends) == len(of_phase) else None
    last_step = max((s.ended_at for s in steps if s.ended_at), default=None)
    if run.definition.get("duration") and run.ended_at and last_step and run.ended_at > last_step:
        held = Row(y, "held (duration)", _took(run.ended_at - last_step), "wait")
        held.segments.append(segment(last_step, run.ended_at, COLOURS["wait"], "the run held until its duration ended"))
        rows.append(held)
        y += ROW
    if run.cleanup_started_at:
        until = run.cleanup_ended_at or now
        cleanup = Row(y, "cleanup", _took(until - run.cleanup_started_at), run.cleanup_status)
        cleanup.segments.append(
            segment(run.cleanup_started_at, until, COLOURS["cleanup"], f"cleanup: {run.cleanup_status}")
        )
        rows.append(cleanup)
        y += ROW
    ticks = [Tick(LABEL + t / span * plot, label) for t, label in _ticks(span)]
    now_x = x(now) if run.ended_at is None and run.started_at else None
    return Timeline(WIDTH, int(y + 8), LABEL, bands, rows, ticks, now_x, span)


def _first_dispatch(step: StepRow) -> datetime | None:
    began = [b for entry in step.attempt_log or [] if (b := _parse(entry.get("at"))) is not None]
    return min(began) if began else step.started_at


def _phase_row(of_phase: list[StepRow], y: float, now: datetime, segment: Callable[..., Segment]) -> Row:
    """A phase's steps as one row: a bar over the time they took, its colour the worst
    of them (failed, then running, then retried, else succeeded), its note their counts."""
    counts = Counter(s.status for s in of_phase)
    said = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    row = Row(y, f"{len(of_phase)} steps", said, "")
    began = [b for s in of_phase if (b := _first_dispatch(s)) is not None]
    if began:
        running = counts.get("running", 0)
        ended = max((s.ended_at for s in of_phase if s.ended_at), default=None)
        until = now if running or ended is None else ended
        worst = (
            "failed"
            if counts.get("failed")
            else "running"
            if running
            else "retry"
            if any(s.attempts > 1 for s in of_phase)
            else "succeeded"
        )
        row.segments.append(segment(min(began), until, COLOURS[worst], f"{said}, {_took(until - min(began))}"))
    return row


def _step_row(s: StepRow, y: float, now: datetime, segment: Callable[..., Segment]) -> Row:
    row = Row(y, s.name, "", s.status)
    for entry in s.attempt_log or []:
        began, ended = _parse(entry.get("at")), _parse(entry.get("ended"))
        if began is None or ended is None:
            continue
        result = str(entry.get("result", ""))
        title = f"attempt {entry.get('attempt')}: {result}, {_took(ended - began)}"
        if entry.get("error"):
            title += f" — {entry['error']}"
        row.segments.append(segment(began, ended, COLOURS.get(result, "#888"), title))
    if s.status == "running" and s.started_at:
        row.segments.append(segment(s.started_at, now, COLOURS["running"], "running"))
    said = []
    first = _first_dispatch(s)
    if first is not None and s.ended_at is not None:
        said.append(_took(s.ended_at - first))
    if s.attempts > 1:
        said.append(f"{s.attempts} attempts")
    elif s.status == "ready":
        said.append("waiting")
    row.note = " · ".join(said)
    return row


def _took(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _ticks(span: float) -> list[tuple[float, str]]:
    """Marks at round values: 1, 2 or 5 times a power of ten seconds, or whole minutes
    (1, 2, 5, 10, 15, 30, 60...) once a mark is a minute or more apart; four to ten."""
    raw = span / 6
    if raw > 86400:
        step = 86400.0 * math.ceil(raw / 86400)
    elif raw >= 60:
        step = float(next(m for m in (60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400) if m >= raw))
    else:
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = int(span // step)
    return [(i * step, _tick_label(i * step, step)) for i in range(count + 1)]


def _tick_label(t: float, step: float) -> str:
    if step < 1:
        return f"{t * 1000:.0f} ms" if t else "0"
    if step < 60:
        return f"{t:g} s"
    if step < 3600:
        return f"{t / 60:g} min"
    if step < 86400:
        return f"{t / 3600:g} h"
    return f"{t / 86400:g} d"
