"""Fence marks kept in memory, for a module that runs inside the worker (docs/protocol.md
§4, rule 7): the highest fence accepted for each target, and the refusal of a lower one."""

from __future__ import annotations

from roadie.errors import Superseded


class FenceMarks:
    """The highest fence accepted per target: a step's key, or a lease's target (`lease`),
    the two kept apart, since a key may be spelt like a lease.

    `accept` is the check and the raise of the mark in one step, with no await between,
    so two calls of one process cannot both pass it out of order. A fence of 0 is a call
    no claim stands behind (a test, a conformance check): never refused, never a mark.
    Kept in memory, the marks see the calls of this process only: a module another process
    may drive too must keep them where both can see.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], int] = {}

    def accept(self, target: str, fence: int, *, lease: bool = False) -> None:
        """Take a call under `fence` for a step's key (a lease's target, with `lease`), or
        raise `Superseded`."""
        self._accept(("lease" if lease else "key", target), fence)

    def check(self, target: str, fence: int, *, lease: bool = False) -> None:
        """Raise `Superseded` when a newer owner has acted for `target` since `fence` was
        accepted: a call that sends several commands asks before each."""
        self._check(("lease" if lease else "key", target), fence)

    def mark(self, target: str, *, lease: bool = False) -> int:
        return self._marks.get(("lease" if lease else "key", target), 0)

    def _accept(self, target: tuple[str, str], fence: int) -> None:
        self._check(target, fence)
        if fence > 0:
            self._marks[target] = fence

    def _check(self, target: tuple[str, str], fence: int) -> None:
        mark = self._marks.get(target, 0)
        if 0 < fence < mark:
            raise Superseded(
                f"fence {fence} is older than fence {mark}, already accepted for {target[1]}: a newer owner has acted",
                mark=mark,
            )
