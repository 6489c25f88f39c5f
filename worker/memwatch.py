"""A run's memory limit: the resident memory of torchrun and of every rank it started, summed and
checked a few times a second; past the limit every one of them is killed and the run fails
saying so (final: the same plan would pass it again).

    PARETOPLAN_RUN_MAX_MEMORY   bytes or a size such as '16GiB' (unset: no limit)

An rlimit would not do: it bounds each process's address space, which torch reserves far beyond
what it touches, and a plan's ranks share one budget on a CPU host. Read from the environment by
`worker.launch.run_jobs`, so a worker's runs and `paretoplan run` honour it alike.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from search import InputError
from search.prices.cluster import parse_size

ENV = "PARETOPLAN_RUN_MAX_MEMORY"


def run_memory_limit() -> int | None:
    """The limit in bytes from PARETOPLAN_RUN_MAX_MEMORY, or None when unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        return parse_size(raw)
    except InputError as e:
        raise InputError(f"{ENV}={raw!r} is not a memory size: {e}") from None


def resident_bytes(pids: set[int]) -> int:
    """The summed resident memory (VmRSS) of these processes; gone ones count 0."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError):
            continue
    return total


class MemoryWatch:
    """Watches the process tree under `root` (found by `tree`) in a thread; past `limit` bytes it
    SIGKILLs the whole tree once and records what it saw in `exceeded`."""

    def __init__(self, root: int, limit: int, tree: Callable[[int], set[int]], interval: float = 0.25) -> None:
        self.root, self.limit, self.tree, self.interval = root, limit, tree, interval
        self.exceeded: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="run-memory-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            pids = self.tree(self.root)
            held = resident_bytes(pids)
            if held > self.limit:
                self.exceeded = held
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
