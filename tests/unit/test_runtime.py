"""What a long-running process does once it has started."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from roadie import runtime


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    gc.unfreeze()
    monkeypatch.setattr(runtime, "_frozen", False)
    yield
    gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.usefixtures("unfrozen")
def test_the_heap_a_process_started_with_is_frozen_once_and_its_garbage_collected_first() -> None:
    garbage = Cycle()
    gone = weakref.ref(garbage)
    del garbage
    kept = Cycle()
    runtime.freeze_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gone() is None, "garbage is collected, not frozen"
    assert not [o for o in gc.get_objects() if type(o) is Cycle], "what is kept is out of the collector's passes"
    assert kept.me is kept
    # What comes later is the collector's as before, and a second call freezes nothing more.
    later = Cycle()
    runtime.freeze_heap()
    assert gc.get_freeze_count() == frozen
    assert [o for o in gc.get_objects() if type(o) is Cycle] == [later]
