"""Pipelines and gradient accumulation over two block stacks (search/algorithm/stacks.py) equal
the exhaustive reference on small encoder-decoders: every cut, every assignment."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from search.algorithm import stacks
from search.algorithm.evaluate import micro_batch_graph
from search.algorithm.families import Family
from search.algorithm.stack_solution import StacksSolution
from search.algorithm.stack_stages import StageFactors, stage_families
from search.algorithm.stack_tables import StackTables, anchors, exhaustive_stacks, stack_tables
from search.algorithm.stacks import search_stacks, solve_stacks, stack_shapes
from search.models.capture import capture_module
from search.models.graph import OpGraph
from search.models.seq2seq import annotate_stacks
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from tests.search.algorithm.test_families_exact import _graph as _family_graph

BATCH, DIM = 8, 16


class _Cross(nn.Module):
    """A decoder layer at its smallest: its own stream and a cross edge from the encoder output."""

    def __init__(self) -> None:
        super().__init__()
        self.self_proj = nn.Linear(DIM, DIM, bias=False)
        self.cross_proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.self_proj(x) + self.cross_proj(memory)


class _TinyEncDec(nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.encoder = nn.ModuleList([nn.Linear(DIM, DIM, bias=False) for _ in range(2)])
        self.decoder = nn.ModuleList([_Cross() for _ in range(2)])
        if tied:  # one weight read on two stages: its layouts must agree across the cut (a pair constraint)
            self.decoder[1].self_proj.weight = self.encoder[0].weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        h = src
        for layer in self.encoder:
            h = layer(h)
        y = tgt
        for dec in self.decoder:
            y = dec(y, h)
        return (y * y).mean()


def _graph(tied: bool = False):
    with torch.device("meta"):
        m = _TinyEncDec(tied)
        x = torch.empty(BATCH, DIM)
    g = capture_module(m, (x, x), "tiny-encdec", [["batch", "h"], ["batch", "h"]])
    return annotate_stacks(g, ("encoder", "decoder"), (2, 2))


def _job() -> TrainingJob:
    return TrainingJob(global_batch=BATCH, seq_len=None, precision="fp32")


def _assert_exact(sol: StacksSolution, tabs: StackTables, g: OpGraph, recompute: bool,
                  tie: tuple[Family, ...] = ()) -> dict[str, np.ndarray]:
    """The solved frontier equals the exhaustive reference (tied as `tie` says), and each point's
    assignment and cut, read back and priced again, is the point. Returns the assignments."""
    ref_t, ref_m = exhaustive_stacks(tabs, recompute=recompute, tie=tie)
    order = np.argsort(sol.root.t, kind="stable")
    np.testing.assert_allclose(sol.root.t[order], ref_t, rtol=1e-9)
    np.testing.assert_allclose(sol.root.m[order], ref_m, rtol=1e-9)
    configs, splits = sol.read_back(np.arange(len(sol.root)))
    again = sol.recost(g, configs, splits)
    np.testing.assert_allclose(again["time"], sol.root.t, rtol=1e-9)
    np.testing.assert_allclose(again["memory"], sol.root.m, rtol=1e-9)
    return configs


def test_the_tiny_model_has_two_stacks_and_a_cross_edge() -> None:
    g = _graph()
    assert [len(b.layers) for b in g.blocks] == [2, 2]
    a = anchors(g)
    enc_out = g.blocks[0].layers[-1][-1]
    readers = [op for op in g.ops if any(t.source == enc_out for t in op.inputs)]
    assert {a[op.name] for op in readers} == {2, 3}  # both decoder layers read the encoder's output


@pytest.fixture(params=["by_cuts", "by_stages"])
def solver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both of solve_stacks' ways: each cut on its own (what these few cuts get), and the DP
    over the stages (what shapes of many cuts get)."""
    if request.param == "by_stages":
        monkeypatch.setattr(stacks, "MAX_CUTS", 0)
    return str(request.param)


@pytest.mark.parametrize("stages,recompute,tied", [(1, True, False), (2, False, False), (2, False, True)])
def test_frontier_equals_exhaustive(stages: int, recompute: bool, tied: bool, solver: str) -> None:
    g = _graph(tied)
    cluster = make_cluster("cpu", 2 * stages if stages > 1 else 2, devices_per_node=4)
    shapes = [s for s in stack_shapes(cluster, _job(), g, (0,), pipelines=stages > 1, accumulate=stages == 1)
              if s.stages == stages and s.micro_batches == 2]
    assert shapes
    checked = 0
    for shape in shapes:
        mg = micro_batch_graph(g, shape.micro_batches)
        cm = CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // shape.micro_batches}))
        tabs = stack_tables(mg, cm, shape)
        if tabs is None:
            continue
        sol = solve_stacks(tabs, recompute=recompute)
        assert sol is not None
        if tied:
            assert any(p.kind != "reader" for p in cm.bounds.pairs)
        _assert_exact(sol, tabs, g, recompute)
        checked += 1
    assert checked


@pytest.mark.parametrize("stages,recompute", [(1, True), (2, False), (2, True), (3, False)])
def test_block_reuse_equals_the_tied_reference(stages: int, recompute: bool, solver: str) -> None:
    """Three layers a stack (the block-family model of test_families_exact): each stack's copies
    are solved through its template (families.py), their outputs tied to the boundary's layout;
    the frontier equals the reference enumerating every tied assignment and cut, and the untied
    space (no reuse) holds every tied point."""
    g = _family_graph(3, 3)
    cluster = make_cluster("cpu", 2 * stages if stages > 1 else 2, devices_per_node=8)
    shapes = [s for s in stack_shapes(cluster, _job(), g, (0,), pipelines=stages > 1, accumulate=stages == 1)
              if s.stages == stages]
    shapes = [s for s in shapes if s.micro_batches == min(x.micro_batches for x in shapes)]
    assert shapes
    for shape in shapes:
        mg = micro_batch_graph(g, shape.micro_batches)
        cm = CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // shape.micro_batches}))
        tabs = stack_tables(mg, cm, shape)
        assert tabs is not None
        families = stage_families(tabs)
        assert [f.block for f in families] == [0, 1]  # both stacks solved through a template
        sol = solve_stacks(tabs, recompute=recompute)
        assert sol is not None
        assert sol.stats.joins  # the copies were joined by doubling, not eliminated op by op
        configs = _assert_exact(sol, tabs, g, recompute, families)
        for fam in families:  # every copy's output read back in its boundary's layout
            for layer in fam.chain.layers[1:]:
                np.testing.assert_array_equal(configs[layer[-1]], configs[fam.chain.boundary])
        untied = solve_stacks(tabs, recompute=recompute, reuse=False)
        assert untied is not None
        # the untied space (exact by test_frontier_equals_exhaustive) holds the tied one
        for t, m in zip(sol.root.t, sol.root.m, strict=True):
            assert np.any((untied.root.t <= t * (1 + 1e-9)) & (untied.root.m <= m * (1 + 1e-9)))


def test_the_encoder_output_is_sent_to_every_decoder_stage() -> None:
    """Cut between the two decoder layers: stage 1 receives the decoder stream and the encoder's
    output; cut between the stacks: stage 1 receives the encoder output only (the decoder's own
    inputs are graph inputs)."""
    g = _graph()
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    shape = next(s for s in stack_shapes(cluster, _job(), g, (0,)) if s.stages == 2 and s.micro_batches == 2)
    mg = micro_batch_graph(g, 2)
    tabs = stack_tables(mg, CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // 2})), shape)
    assert tabs is not None
    enc_out = g.blocks[0].layers[-1][-1]
    dec0_out = g.blocks[1].layers[0][-1]
    assert set(tabs.received(tabs.stage_of((3, 1)), 1)) == {enc_out, dec0_out}
    assert set(tabs.received(tabs.stage_of((2, 2)), 1)) == {enc_out}


def test_search_gives_pipelines_and_accumulation() -> None:
    g = _graph()
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    sols = search_stacks(g, cluster, _job(), (0, 1), pipelines=True, accumulate=True)
    assert {s.shape.stages for s in sols} >= {1, 2}  # accumulation and 2-stage pipelines (4 stages: 1 unit each)
    for sol in sols:
        assert len(sol.root) and all(sum(split) == 4 for split in sol.partitions)


def test_skipping_beaten_shapes_keeps_the_frontier() -> None:
    """The shape bound (stacks.shape_bound) skips only shapes whose every plan a known one beats:
    the merged frontier with the skip equals the one without it."""
    from search.algorithm.ft import SearchOptions, search

    g = _graph(tied=True)
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    got = {}
    for prune in (True, False):
        r = search(g, cluster, _job(), SearchOptions(zero_stages=(0, 1), recompute=True, pipeline=True,
                                                     accumulate=True, prune=prune))
        got[prune] = (np.array([p.time_s for p in r.points]), np.array([p.memory_bytes for p in r.points]))
        assert any(s.pipeline is not None for s in r.solutions)
    np.testing.assert_allclose(got[True][0], got[False][0], rtol=1e-9)
    np.testing.assert_allclose(got[True][1], got[False][1], rtol=1e-9)


def test_a_run_of_copies_alone_on_a_stage_reads_back_its_own_layers(solver: str) -> None:
    """Four stages over a five-layer encoder: stages holding only encoder copies start at several
    layers, and share one eliminated factor per (stage, run length) (`StageFactors._solve_run`); each
    point still reads back every layer's configuration under that layer's own names, so the
    frontier equals the tied reference and every point, priced again, is itself."""
    g = _family_graph(5, 2)
    cluster = make_cluster("cpu", 8, devices_per_node=8)
    shapes = [s for s in stack_shapes(cluster, _job(), g, (0,), pipelines=True) if s.stages == 4]
    shape = min(shapes, key=lambda s: s.micro_batches)
    mg = micro_batch_graph(g, shape.micro_batches)
    cm = CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // shape.micro_batches}))
    tabs = stack_tables(mg, cm, shape)
    assert tabs is not None
    families = stage_families(tabs)
    solved: list[tuple[int, int, int]] = []
    run_memo = StageFactors._solve_run

    def counted(self: StageFactors, s: int, run: tuple, recv: tuple, keep: tuple):  # type: ignore[no-untyped-def]
        solved.append((s, run[1], run[2]))
        return run_memo(self, s, run, recv, keep)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StageFactors, "_solve_run", counted)
        sol = solve_stacks(tabs, recompute=False)
    assert sol is not None
    # some stage and run length met at two starts: one factor, labelled twice
    assert len({(s, k) for s, _, k in solved}) < len(set(solved))
    configs = _assert_exact(sol, tabs, g, False, families)
    assert set(configs) >= {op.name for op in g.ops}
