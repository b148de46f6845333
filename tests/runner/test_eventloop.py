"""runner.eventloop: the collector settings a run gets are the run's alone."""

from __future__ import annotations

import gc

from trajforge.runner.eventloop import tuned_collector


def test_a_run_freezes_what_exists_and_collects_young_objects_less_often_then_gives_the_defaults_back() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert before[0] != 10_000
    with tuned_collector():
        assert gc.get_threshold() == (10_000, *before[1:])
        assert gc.get_freeze_count() > frozen  # the start-up heap is out of the collector's scans
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_the_defaults_come_back_when_the_run_raises() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        with tuned_collector(young=5_000):
            assert gc.get_threshold()[0] == 5_000
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen


def test_a_caller_that_froze_its_own_heap_keeps_it_frozen() -> None:
    """An in-process caller's own gc.freeze() survives a run (unfreeze would thaw it too).

    Checked on an object of the caller's, not on the frozen count: frozen objects are still freed
    when their last reference goes, which other threads of the suite (a server finishing a
    previous test's requests) do at any time, so the count may drop by a few while a run is in
    progress (a loaded full run saw it). The process may already hold frozen objects here: that
    is a caller's frozen heap too, and only what this test froze is thawed after."""
    already = gc.get_freeze_count() != 0
    mine = [object()]  # a container the collector tracks, made before the freeze
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        with tuned_collector():
            assert gc.get_threshold()[0] == 10_000
        assert not any(o is mine for g in range(3) for o in gc.get_objects(g))  # still in the frozen set
        assert gc.is_tracked(mine)
    finally:
        if not already:
            gc.unfreeze()
