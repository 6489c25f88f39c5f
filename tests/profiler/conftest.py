"""One real profile of gpt2-tiny on this machine, shared by the profiler tests (it spawns two
gloo processes for the collectives, so it is built once per session)."""

from __future__ import annotations

import pytest

from profiler.run import run_profile
from tests.profiler.tiny import TINY


@pytest.fixture(scope="session")
def tiny_profile():
    prof, summary = run_profile(TINY["model"], TINY["devices"], device="cpu", devices_per_node=TINY["devices_per_node"],
                                global_batch=TINY["global_batch"], repeats=5, sizes=(4096, 1 << 16, 1 << 20),
                                collective_repeats=3, progress=False)
    return prof, summary
