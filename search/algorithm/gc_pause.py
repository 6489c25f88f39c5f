"""The cyclic garbage collector paused while a search runs.

A search allocates hundreds of thousands of small objects (frontier arrays, factors, the
micro-batch graphs' tensors and ops) and frees almost none of them until it returns, and none
of them form cycles that need the collector. Each of CPython's full collections walks every
live object - the captured graph included - so with the collector on, building one micro-batch
graph took 4-5x longer and the whole search ~25% longer (bench/search_speed.py). Objects alive
before the search are frozen (gc.freeze: moved out of the collector's sight) and collection is
off until the outermost pause ends; then both are restored. Nested and concurrent searches (the
service runs several in threads) share one pause: the last to leave restores the collector.

What the search allocated and still holds at the end (its result, the memos) is moved to the
oldest generation with the frozen objects: left in the youngest, the first allocation after the
pause set off a collection that walked all of it (~0.09 s of gpt3-175b@1024's 2.8 CPU s) and,
there being no cycles, freed nothing.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.freeze()  # the objects made during the pause join the frozen ones (counts reset) ...
                gc.unfreeze()  # ... and all go back to the oldest generation
                if _was_enabled:
                    gc.enable()
