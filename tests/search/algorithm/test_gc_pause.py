"""The collector paused for a search (gc_pause.py): restored after, and what the search made
moved out of the youngest generation, so that no collection walks it as the pause ends."""

from __future__ import annotations

import gc

from search.algorithm.gc_pause import gc_paused


def test_pause_restores_the_collector_and_sets_off_no_collection() -> None:
    was = gc.isenabled()
    gc.enable()
    collections: list[int] = []

    def heard(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    try:
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():  # nested: one pause
                held = [[i] for i in range(10_000)]  # what a search keeps: lists are tracked
            assert not gc.isenabled()
            gc.callbacks.append(heard)
        after = [[0]]  # the first allocations after the pause
        gc.callbacks.remove(heard)
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0
        assert collections == []  # the 10k lists went to the oldest generation, not the youngest
        assert gc.is_tracked(held[0]) and gc.is_tracked(after[0])
    finally:
        if heard in gc.callbacks:
            gc.callbacks.remove(heard)
        (gc.enable if was else gc.disable)()
