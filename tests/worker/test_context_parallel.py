"""Context parallelism as planned: the search's own plans for llama-tiny on a context axis (cp4,
and dp2 x cp2 under FSDP) run on 4 gloo processes, reproduce the single-process losses step by
step, and perform exactly the ring hops the plan prices, per layer, forward and backward."""

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

MODEL, BATCH, SEQ, STEPS = "llama-tiny", 4, 16, 3
TOL = 2e-5  # fp32: ring attention merges the blocks' softmax by log-sum-exp, in another order
MESHES = {
    "cp4": (Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("cp", 4, 1, "context"),
                             MeshAxis("tp", 1, 1, "tensor"))), 0),
    "dp2 x cp2 fsdp": (Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("cp", 2, 1, "context"),
                                        MeshAxis("tp", 1, 1, "tensor"))), 3),
    "cp4 recompute": (Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("cp", 4, 1, "context"),
                                       MeshAxis("tp", 1, 1, "tensor"))), 0),
}


def plan_on(mesh: Mesh, zero: int, model: str = MODEL, recompute: bool = False) -> Plan:
    """The fastest plan the search finds on this mesh and ZeRO stage (with `recompute`, the leanest:
    every layer recomputed)."""
    return searched_plan(model, BATCH, SEQ, mesh, zero, recompute)


def _specs():
    from worker.analyze import analyze

    return {name: analyze(plan_on(*m, recompute="recompute" in name)) for name, m in MESHES.items()}


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
    assert job.spec.dim("context") is not None and "cp: seq 100%" in job.spec.summary
    got = raw["losses"]
    assert_losses_match(f"{name} ({job.spec.summary})", got, reference, STEPS, TOL)


@pytest.mark.parametrize("name", list(MESHES))
def test_ring_hops_equal_the_plan(name, runs):
    """Per layer on cp n: n - 1 hops of K and V forward, n backward (K, V and their gradients, then
    the gradients home) and, in a recomputed layer, the forward's n - 1 again; on every rank alike,
    and no all-to-all anywhere else."""
    job, raw = runs[name]
    n = job.spec.size("context")
    again = n - 1 if "recompute" in name else 0
    assert bool(job.spec.recompute) == bool(again)
    want = Counter((e.unit, e.phase) for e in job.spec.expected_comms if e.kind == "all_to_all")
    assert want == {(f"layers.{i}", p): k for i in range(2) for p, k in (("forward", n - 1), ("backward", n + again))}
    for rank in raw["ranks"]:
        got = layer_all_to_alls(rank["comm"])
        assert got == want, f"{name} rank {rank['rank']}: executed {dict(got)}, plan {dict(want)}"
        outside = all_to_alls_outside_layers(rank["comm"])
        assert not outside, f"all-to-alls outside the attention layers: {outside}"


def test_context_parallelism_beside_tensor_parallelism_is_refused_saying_why():
    """cp2 x tp2 is priced (the search offers it) but not executed: analyze says so before launch."""
    from worker.analyze import Unsupported, analyze

    plan = plan_on(Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("cp", 2, 2, "context"),
                                    MeshAxis("tp", 2, 1, "tensor"))), 0)
    with pytest.raises(Unsupported, match="context parallelism beside tensor or expert parallelism is not executed"):
        analyze(plan)


def test_a_learned_position_embedding_gets_no_context_axis_saying_why():
    """GPT-2 looks its position embedding up for 0 .. t - 1 of the tokens it holds: wrong on a share.
    The search offers it no context axis (the executor's analysis refuses such a plan too); asked
    for one, it says why."""
    from search.errors import InputError

    with pytest.raises(InputError, match="'pos_emb:embedding' is a learned position embedding"):
        plan_on(MESHES["cp4"][0], 0, model="gpt2-tiny")
