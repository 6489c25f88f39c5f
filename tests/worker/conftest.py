"""Shared multi-process runs: every plan family of the faithfulness and collective checks runs in
ONE torchrun launch of 4 gloo processes (the plans one after the other in the same process
group), so the suite pays the process start-up once."""

from __future__ import annotations

import pytest

from tests.worker.families import COMM_FAMILIES, P2P_FAMILIES, STEPS, families
from tests.worker.parity import launch


@pytest.fixture(scope="session")
def family_plans():
    return families()


@pytest.fixture(scope="session")
def family_runs(family_plans):
    """name -> (Job, raw result) for every family, from one launch."""
    from worker.analyze import analyze

    return launch({name: analyze(plan) for name, plan in family_plans.items()}, STEPS,
                  lambda name: name in COMM_FAMILIES + P2P_FAMILIES)
