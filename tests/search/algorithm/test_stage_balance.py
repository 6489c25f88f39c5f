"""Stages balanced by cost: the stage search counts the ops before the stack on the first stage and
those after it on the last (the embedding and the head), so a heavy head takes layers off the last
stage, and a split the executor runs may be uneven (tests/worker family `pp uneven`)."""

from __future__ import annotations

import numpy as np

from search.algorithm.evaluate import evaluate_pipeline
from search.algorithm.pipeline import pipeline_shapes, search_pipelines
from search.models.graph import OpGraph, ParamRef
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from tests.search.graphs import H, stack

JOB = TrainingJob(global_batch=16, seq_len=None)


def with_head(g: OpGraph, vocab: int, flops_factor: float) -> OpGraph:
    """`g` whose head maps to `vocab` features and costs `flops_factor` x its FLOPs."""
    head = g.op("head")
    out = head.output.model_copy(update={"shape": head.output.shape[:-1] + (vocab,)})
    heavy = head.model_copy(update={"output": out, "flops": head.flops * flops_factor,
                                    "params": (ParamRef(name="head.weight", shape=(vocab, H), dims=("vocab", "hidden")),)})
    graph = g.model_copy(update={"ops": tuple(heavy if op.name == "head" else op for op in g.ops)})
    graph.__dict__.pop("_op_index", None)  # model_copy keeps the old name -> op cache
    return graph


def _two_stages(g: OpGraph):
    cl = make_cluster("h100-80gb", 2)
    shape = next(s for s in pipeline_shapes(cl, JOB, 8, (0,)) if s.stages == 2)
    sols = search_pipelines(g, cl, JOB, (0,), shapes=[shape])
    assert sols
    return sols[0]


def test_a_compute_heavy_head_takes_layers_off_the_last_stage():
    even = _two_stages(stack(8, batch=JOB.global_batch))
    assert set(even.partitions) == {(4, 4)}  # identical layers, light ends: the even split
    heavy = _two_stages(with_head(stack(8, batch=JOB.global_batch), H, 400.0))
    fastest = int(np.argmin(heavy.root.t))
    split = heavy.partitions[fastest]
    assert split[1] < split[0], split
    # and it is faster than the even split of the same choices: the head's time was counted
    one = {k: v[fastest:fastest + 1] for k, v in heavy.assigns.items()}
    assert evaluate_pipeline(heavy, one, (4, 4))["time"][0] > heavy.root.t[fastest]


def test_a_head_heavy_in_memory_trades_layers_for_memory():
    """A head with 16x the parameters: the leaner points move layers to the first stage."""
    sol = _two_stages(with_head(stack(8, batch=JOB.global_batch), 16 * H, 16.0))
    leanest = int(np.argmin(sol.root.m))
    assert sol.partitions[leanest][1] < 4
    one = {k: v[leanest:leanest + 1] for k, v in sol.assigns.items()}
    assert evaluate_pipeline(sol, one, (4, 4))["memory"][0] > sol.root.m[leanest]  # the head's bytes were counted


def test_the_band_widens_by_what_the_ends_are_worth():
    """A stage strays from n / p by STAGE_BAND layers plus the heavier end's worth in layers (by
    FLOPs or parameters): GPT-2 medium's head (50257 x 1024) is worth 4 of its layers."""
    from search.algorithm.chain import find_chain
    from search.algorithm.pipeline import STAGE_BAND, band_spread
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = stack(8)
    chain = find_chain(g)
    assert chain is not None
    assert band_spread(g, chain) == STAGE_BAND + 1  # the stack's head is one linear, less than a layer
    assert band_spread(with_head(g, 16 * H, 16.0), chain) == STAGE_BAND + 16
    medium = capture_model(get_model("gpt2-medium"), 8, 128)
    medium_chain = find_chain(medium)
    assert medium_chain is not None and band_spread(medium, medium_chain) == STAGE_BAND + 5


def test_a_wide_band_stays_exact():
    """The stage search over the widened band equals the exhaustive reference over the same
    splits (4 stages of 8 layers, a head worth 3 layers: every stage 1 to 5 layers)."""
    from search.algorithm.chain import find_chain
    from search.algorithm.exhaustive import exhaustive_pipeline
    from search.algorithm.pipeline import band_spread, partitions
    from tests.search.algorithm.test_pipeline import same_frontier

    g = with_head(stack(8, batch=JOB.global_batch), H, 3.0)
    chain = find_chain(g)
    assert chain is not None
    spread = band_spread(g, chain)
    cl = make_cluster("h100-80gb", 4)
    shape = next(s for s in pipeline_shapes(cl, JOB, 8, (0,), spread=spread) if s.stages == 4)
    assert (5, 1, 1, 1) in partitions(8, 4, 1, spread) and (5, 1, 1, 1) not in partitions(8, 4)
    sols = search_pipelines(g, cl, JOB, (0,), shapes=[shape])
    t, m = exhaustive_pipeline(g, cl, JOB, shape)
    assert sols and same_frontier(sols[0].root.t, sols[0].root.m, t, m)
