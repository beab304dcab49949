"""A run's steps and ledger rows a page at a time, with what they add up to.

A run of a thousand steps drawn a row per step was half a megabyte and fourteen
thousand elements, its ledger more, and the clean-up button hundreds of screens down.
So the run page and the ledger page count their rows by phase, action and state (each
count a link that filters by it) and show one page of the rows that match. Filters and
the page are query parameters, so every link works without JavaScript and a live redraw
fetches the same page it replaces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import urlencode

from roadie.states import ResourceState, StepStatus
from roadie.store.rows import ResourceRow, StepRow

PAGE_SIZE = 50
# Past this many steps the timeline draws a row per phase rather than one per step (and
# the pages show their counts): below it, a run looks as it always has.
COMPACT_AFTER = PAGE_SIZE
LIVE, FAILED = "live", "failed"
T = TypeVar("T")


@dataclass(frozen=True)
class Filter:
    """Which rows a page shows: by state (a step's or row's state; `live` for what has not
    ended or still holds its target, `failed` for a step that failed or a live row whose
    revert failed), by action, by phase (counted from 1), and which page of them."""

    state: str = ""
    action: str = ""
    phase: int | None = None
    page: int = 1

    @property
    def narrowed(self) -> bool:
        return bool(self.state or self.action or self.phase)

    def query(self, **change: Any) -> str:
        """This filter as a query string (`?state=failed&page=2`), with `change` made;
        a change of what is shown goes back to its first page."""
        if change and "page" not in change:
            change["page"] = 1
        shown = replace(self, **change)
        pairs = [
            (k, v)
            for k, v in (("state", shown.state), ("action", shown.action), ("phase", shown.phase))
            if v not in ("", None)
        ]
        if shown.page > 1:
            pairs.append(("page", shown.page))
        return "?" + urlencode(pairs) if pairs else "?"


@dataclass(frozen=True)
class Page:
    """One page of the rows that match a filter: `total` of them in `pages` pages."""

    rows: list[Any]
    total: int
    page: int
    pages: int
    first: int  # the 1-based position of its first row among the matches

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1


def page_of(rows: Sequence[T], keep: Callable[[T], bool], page: int, size: int = PAGE_SIZE) -> Page:
    matched = [r for r in rows if keep(r)]
    pages = max(1, -(-len(matched) // size))
    page = min(max(page, 1), pages)
    start = (page - 1) * size
    return Page(matched[start : start + size], len(matched), page, pages, start + 1)


def step_state(step: StepRow) -> str:
    return step.status


def step_matches(f: Filter) -> Callable[[StepRow], bool]:
    def keep(s: StepRow) -> bool:
        if f.state == LIVE:
            if StepStatus(s.status).ended:
                return False
        elif f.state and s.status != f.state:
            return False
        return (not f.action or s.action == f.action) and (f.phase is None or s.phase + 1 == f.phase)

    return keep


def row_state(row: ResourceRow) -> str:
    """A ledger row's state as the page counts it: `failed` for a live row whose revert
    failed (it says why), else its own."""
    return FAILED if ResourceState(row.state).holds_target and row.error else row.state


def row_matches(f: Filter, steps: dict[int, StepRow]) -> Callable[[ResourceRow], bool]:
    def keep(r: ResourceRow) -> bool:
        if f.state == LIVE:
            if not ResourceState(r.state).holds_target:
                return False
        elif f.state and row_state(r) != f.state:
            return False
        step = steps.get(r.step_id) if r.step_id is not None else None
        if f.action and (step is None or step.action != f.action):
            return False
        return f.phase is None or (step is not None and step.phase + 1 == f.phase)

    return keep


@dataclass(frozen=True)
class Tally:
    """How many of a run's rows are in each state, for one phase, one action, or all."""

    key: Any  # the phase (from 1) or action counted; None for the whole run
    label: str
    count: int
    states: dict[str, int]


def _tallies(items: Iterable[tuple[Any, str, str]], order: list[str]) -> list[Tally]:
    counts: dict[Any, Counter[str]] = {}
    labels: dict[Any, str] = {}
    for key, label, state in items:
        counts.setdefault(key, Counter())[state] += 1
        labels[key] = label
    ranked = {s: i for i, s in enumerate(order)}
    return [
        Tally(key, labels[key], sum(c.values()), dict(sorted(c.items(), key=lambda kv: ranked.get(kv[0], 99))))
        for key, c in counts.items()
    ]


STEP_ORDER = [s.value for s in (StepStatus.FAILED, StepStatus.RUNNING, StepStatus.READY, StepStatus.SUCCEEDED)]
ROW_ORDER = [FAILED, ResourceState.LIVE.value, ResourceState.PENDING.value, ResourceState.REVERTED.value]


def step_tallies(steps: list[StepRow], phase_names: list[str]) -> dict[str, list[Tally]]:
    """The run's steps counted by state: all of them, per phase (in order) and per action."""

    def named(phase: int) -> str:
        return f"{phase + 1}. {phase_names[phase]}" if phase < len(phase_names) else str(phase + 1)

    return {
        "all": _tallies(((None, "all", s.status) for s in steps), STEP_ORDER),
        "phases": _tallies(((s.phase + 1, named(s.phase), s.status) for s in steps), STEP_ORDER),
        "actions": sorted(_tallies(((s.action, s.action, s.status) for s in steps), STEP_ORDER), key=_by_key),
    }


def row_tallies(rows: list[ResourceRow], steps: dict[int, StepRow], phase_names: list[str]) -> dict[str, list[Tally]]:
    """The run's ledger rows counted by state: all of them, per phase and per action of
    the step that recorded each (a row of no step is counted only among all)."""
    made = [(r, steps.get(r.step_id) if r.step_id is not None else None) for r in rows]

    def named(phase: int) -> str:
        return f"{phase + 1}. {phase_names[phase]}" if phase < len(phase_names) else str(phase + 1)

    return {
        "all": _tallies(((None, "all", row_state(r)) for r, _ in made), ROW_ORDER),
        "phases": sorted(
            _tallies(((s.phase + 1, named(s.phase), row_state(r)) for r, s in made if s), ROW_ORDER), key=_by_key
        ),
        "actions": sorted(_tallies(((s.action, s.action, row_state(r)) for r, s in made if s), ROW_ORDER), key=_by_key),
    }


def _by_key(t: Tally) -> Any:
    return t.key
