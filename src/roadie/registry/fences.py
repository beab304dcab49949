"""Fence marks kept in memory, for a module that runs inside the worker (docs/protocol.md
§4, rule 7): the highest fence accepted for each target, and the refusal of a lower one."""

from __future__ import annotations

from roadie.errors import Superseded


class FenceMarks:
    """The highest fence accepted per target (a step's key, a `lease#target`).

    `accept` is the check and the raise of the mark in one step, with no await between,
    so two calls of one process cannot both pass it out of order. A fence of 0 is a call
    no claim stands behind (a test, a conformance check): never refused, never a mark.
    Kept in memory, the marks see the calls of this process only: a module another process
    may drive too must keep them where both can see.
    """

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def accept(self, target: str, fence: int) -> None:
        """Take a call under `fence` for `target`, or raise `Superseded`."""
        self.check(target, fence)
        if fence > 0:
            self._marks[target] = fence

    def check(self, target: str, fence: int) -> None:
        """Raise `Superseded` when a newer owner has acted for `target` since `fence` was
        accepted: a call that sends several commands asks before each."""
        mark = self._marks.get(target, 0)
        if 0 < fence < mark:
            raise Superseded(
                f"fence {fence} is older than fence {mark}, already accepted for {target}: a newer owner has acted"
            )

    def mark(self, target: str) -> int:
        return self._marks.get(target, 0)
