"""Expert parallelism as planned: the search's own plans for moe-tiny on an expert axis (ep4, and
dp2 x ep2 under FSDP) run on 4 gloo processes, reproduce the single-process losses step by step,
and perform exactly the all-to-alls the plan prices, per layer, forward and backward."""

from __future__ import annotations

from collections import Counter

import pytest

from search.plans.plan import Plan
from search.prices.mesh import Mesh, MeshAxis
from tests.worker.parity import (
    all_to_alls_outside_layers,
    assert_losses_match,
    layer_all_to_alls,
    searched_plan,
)
from tests.worker.shared import share
from worker.reference import reference_losses

MODEL, BATCH, SEQ, STEPS = "moe-tiny", 8, 16, 3
TOL = 2e-5  # fp32: the all-to-alls reorder each token's sum over its experts, nothing more
MESHES = {
    "ep4": (Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("ep", 4, 1, "expert"))), 0),
    "dp2 x ep2 fsdp": (Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("ep", 2, 1, "expert"))), 3),
}


def plan_on(mesh: Mesh, zero: int) -> Plan:
    """The fastest plan the search finds on this mesh and ZeRO stage (no recomputation)."""
    return searched_plan(MODEL, BATCH, SEQ, mesh, zero)


def _specs():
    from worker.analyze import analyze

    return {name: analyze(plan_on(*m)) for name, m in MESHES.items()}


share(__name__, "runs", _specs, STEPS, lambda name: True)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.fixture(scope="module")
def reference():
    return reference_losses(MODEL, STEPS, BATCH, SEQ, seed=0, lr=1e-3)


@pytest.mark.parametrize("name", list(MESHES))
def test_loss_matches_single_process(name, runs, reference):
    job, raw = runs[name]
    assert job.spec.dim("expert") is not None and "experts:" in job.spec.summary
    got = raw["losses"]
    assert_losses_match(f"{name} ({job.spec.summary})", got, reference, STEPS, TOL)


@pytest.mark.parametrize("name", list(MESHES))
def test_all_to_alls_equal_the_plan(name, runs):
    """Per layer: the token counts, the tokens in and the results out (forward), their gradients
    back (backward): 3 + 2, on every rank alike."""
    job, raw = runs[name]
    want = Counter((e.unit, e.phase) for e in job.spec.expected_comms if e.kind == "all_to_all")
    assert want == {(f"layers.{i}", p): n for i in range(2) for p, n in (("forward", 3), ("backward", 2))}
    for rank in raw["ranks"]:
        got = layer_all_to_alls(rank["comm"])
        assert got == want, f"{name} rank {rank['rank']}: executed {dict(got)}, plan {dict(want)}"
        outside = all_to_alls_outside_layers(rank["comm"])
        assert not outside, f"all-to-alls outside the MoE layers: {outside}"


def test_expert_parallelism_beside_tensor_parallelism_is_refused_saying_why():
    """ep2 x tp2 is not executed (the search does not offer it): a plan written by hand is refused
    before launch, saying why."""
    from worker.analyze import Unsupported, analyze

    plan = plan_on(Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("ep", 2, 2, "expert"),
                                    MeshAxis("tp", 2, 1, "tensor"))), 0)
    with pytest.raises(Unsupported, match="expert parallelism beside tensor parallelism is not executed"):
        analyze(plan)
