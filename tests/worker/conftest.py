"""Shared multi-process runs: every executor test module's plans (tests/worker/shared.py), the
plan families of the faithfulness and collective checks among them, run in ONE torchrun launch of
4 gloo processes (the plans one after the other in the same process group), so the suite pays the
process start-up once."""

from __future__ import annotations

import pytest

from tests.worker.families import COMM_FAMILIES, P2P_FAMILIES, STEPS, families
from tests.worker.shared import launch_groups, share, wanted


def _family_specs():
    from worker.analyze import analyze

    return {name: analyze(plan) for name, plan in families().items()}


share("", "family_runs", _family_specs, STEPS, lambda name: name in COMM_FAMILIES + P2P_FAMILIES)


@pytest.fixture(scope="session")
def shared_launch(request):
    """(module, fixture) -> name -> (Job, raw result), for every group a selected test reads."""
    return launch_groups(wanted(request.session.items))


@pytest.fixture(scope="session")
def family_runs(shared_launch):
    """name -> (Job, raw result) for every family, from the shared launch."""
    return shared_launch[("", "family_runs")]
