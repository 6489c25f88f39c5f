"""The search's encoder-decoder plans before launch: gradient accumulation over both stacks runs as
planned, and so does a pipeline across the two stacks (its stages: worker/hfstages.py; its runs:
tests/worker/test_hf_pipelines.py)."""

from __future__ import annotations

from functools import cache

import numpy as np

from search.algorithm.ft import SearchOptions, search
from search.algorithm.results import FrontierPoint
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.plan import Plan, build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from worker.analyze import Unsupported, analyze

BATCH = 8


@cache
def plans() -> list[Plan]:
    """Every point of every pipeline and accumulation shape's frontier (not only those on the
    merged frontier: on 4 CPU processes a tiny model's accumulation is beaten outright)."""
    spec = get_model("bart-tiny")
    g = capture_model(spec, BATCH, spec.default_seq_len)
    dp4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
    r = search(g, make_cluster("cpu", 4, devices_per_node=4),
               TrainingJob(global_batch=BATCH, seq_len=spec.default_seq_len, precision="fp32"),
               SearchOptions(meshes=(dp4,), zero_stages=(0,), recompute=False, pipeline=True, accumulate=True))
    points = []
    for i, sol in enumerate(r.solutions):
        if sol.pipeline is None:
            continue
        rows = np.arange(len(sol.root))
        configs, splits = sol.read_back(rows)
        points += [FrontierPoint(time_s=float(sol.root.t[j]), memory_bytes=float(sol.root.m[j]), mesh_index=i,
                                 configs=configs, row=int(j), stages=splits[j]) for j in rows]
    return build_plans(r, points)


def test_the_frontier_holds_pipelines_across_both_stacks() -> None:
    piped = [p for p in plans() if p.pipeline.stages > 1]
    assert piped
    for p in piped:  # the cut covers the encoder's 2 layers and the decoder's 2, in that order
        assert p.pipeline.stage_layers[0][0] == 0 and p.pipeline.stage_layers[-1][1] == 4


def test_a_pipeline_across_the_stacks_is_launchable_as_planned() -> None:
    """Pipeline points are analysed with the search's cut (those the executor refuses are refused
    for their tensor-parallel layouts, not for the pipeline); the sends count the tuple crossing
    each cut (BART's encoder hidden states and the decoder's ids inside the encoder, the encoder's
    output and the decoder's hidden states past it), more than one tensor a cut."""
    launched = []
    for plan in (p for p in plans() if p.pipeline.stages > 1):
        try:
            launched.append((plan, analyze(plan)))
        except Unsupported as e:
            assert "tensor axis" in str(e), str(e)
    assert launched
    for plan, spec in launched:
        assert spec.pipeline.stage_layers == plan.pipeline.stage_layers
        cuts = plan.pipeline.stages - 1
        assert sum(spec.pipeline.p2p) > 2 * plan.pipeline.micro_batches * cuts
        assert sum(spec.pipeline.p2p) == sum(spec.pipeline.p2p_recv)


def test_gradient_accumulation_over_both_stacks_is_launchable() -> None:
    acc = [p for p in plans() if p.pipeline.stages == 1 and p.pipeline.micro_batches > 1]
    assert acc
    spec = analyze(acc[0])
    assert spec.pipeline.micro_batches == acc[0].pipeline.micro_batches
