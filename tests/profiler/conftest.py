"""One real profile of gpt2-tiny on this machine, shared by the profiler tests (it spawns two
gloo processes for the collectives, so it is built once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny.py, shared by the test modules

from tiny import TINY  # noqa: E402

from profiler.run import run_profile  # noqa: E402


@pytest.fixture(scope="session")
def tiny_profile():
    prof, summary = run_profile(TINY["model"], TINY["devices"], device="cpu", devices_per_node=TINY["devices_per_node"],
                                global_batch=TINY["global_batch"], repeats=5, sizes=(4096, 1 << 16, 1 << 20),
                                collective_repeats=3, progress=False)
    return prof, summary
