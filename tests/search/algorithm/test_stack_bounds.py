"""The stage search's bounds (stack_bounds.py) never exceed what they bound: every stage of a
shape, solved, is at least as slow and as heavy as its bound; the transfers' part equals the
least price of what the stage receives."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm.evaluate import micro_batch_graph
from search.algorithm.pipeline import stage_band
from search.algorithm.stack_bounds import received_least, stage_bounds
from search.algorithm.stack_stages import StageFactors
from search.algorithm.stack_tables import STACKS_BAND, StackTables, stack_tables
from search.algorithm.stacks import stack_shapes
from search.models.graph import OpGraph
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel
from tests.search.algorithm.test_families_exact import _graph as _family_graph
from tests.search.algorithm.test_stacks_exact import BATCH, _graph, _job


def _tables(g: OpGraph, devices: int, stages: int) -> list[StackTables]:
    """Every shape of `stages` stages (accumulation for 1) at its fewest micro-batches."""
    cluster = make_cluster("cpu", devices, devices_per_node=8)
    shapes = [s for s in stack_shapes(cluster, _job(), g, (0, 3), pipelines=stages > 1, accumulate=stages == 1)
              if s.stages == stages]
    assert shapes
    fewest = min(s.micro_batches for s in shapes)
    out = []
    for shape in shapes:
        if shape.micro_batches != fewest:
            continue
        mg = micro_batch_graph(g, shape.micro_batches)
        cm = CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // shape.micro_batches}))
        tabs = stack_tables(mg, cm, shape)
        if tabs is not None:
            out.append(tabs)
    assert out
    return out


CASES = [("tiny", 1), ("tiny", 2), ("tiny", 4), ("families", 1), ("families", 2), ("families", 4)]


@pytest.mark.parametrize("tight", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("model,stages", CASES)
def test_no_stage_beats_its_bound(model: str, stages: int, recompute: bool, tight: bool) -> None:
    """Every stage (s, first unit, units held) of the band, solved exactly (`StageFactors.at`):
    its fastest point is no faster than the time bound and its leanest no leaner than the
    memory bound (`stage_bounds`: the loose ops with the edges into them by min-sum, the
    family copies at their template's least, the received transfers at their cheapest; or
    not `tight`, each loose op at its cheapest alone)."""
    g = _graph(tied=True) if model == "tiny" else _family_graph(5, 3)
    for tabs in _tables(g, 2 * stages if stages > 1 else 2, stages):
        S = StageFactors(tabs, 0.0, recompute)
        t_lb, m_lb = stage_bounds(S, tight)
        n = tabs.n_units
        checked = 0
        # one stage holds every unit; a pipeline's stages may start anywhere the band reaches
        spans = [(0, n)] if stages == 1 else [(a, k) for a in range(n) for k in stage_band(n, stages, 1, STACKS_BAND)
                                              if a + k <= n]
        for s in range(stages):
            for a, k in spans:
                f = S.at(s, a, k)
                if not len(f):
                    continue
                assert f.t.min() >= t_lb[s][a, a + k] * (1 - 1e-12), (s, a, k)
                assert f.m.min() >= m_lb[s][a, a + k] * (1 - 1e-12), (s, a, k)
                checked += 1
        assert checked


@pytest.mark.parametrize("model,stages", [("tiny", 2), ("tiny", 4), ("families", 4)])
def test_received_least_is_the_cheapest_transfers(model: str, stages: int) -> None:
    """For every span [a, e), the transfers' bound is the sum over what a stage holding it
    receives (`StackTables.received`, a tied output counted once as its boundary) of the
    cheapest transfer: zero for the first stage's spans, positive after a cut."""
    g = _graph() if model == "tiny" else _family_graph(5, 3)
    tabs = _tables(g, 2 * stages, stages)[0]
    S = StageFactors(tabs, 0.0, False)
    recv = received_least(S)
    n = tabs.n_units
    for a in range(n):
        for e in range(a + 1, n + 1):
            split = tuple(x for x in (a, e - a, n - e) if x)
            got = dict.fromkeys(S.var(x) for x in tabs.received(tabs.stage_of(split), 1 if a else 0))
            want = sum(float(tabs.p2p[v].min()) for v in got)
            np.testing.assert_allclose(recv[a, e], want, rtol=1e-12)
            assert (recv[a, e] > 0) == (a > 0)


@pytest.mark.parametrize("model", ["tiny", "families"])
def test_the_tight_bounds_are_never_looser(model: str) -> None:
    """The tight bounds hold at least the ops at their cheapest (edges and transfers cost >= 0),
    and are above them somewhere: the pipeline's middle stages receive the stream."""
    g = _graph(tied=True) if model == "tiny" else _family_graph(5, 3)
    for tabs in _tables(g, 8, 4):
        S = StageFactors(tabs, 0.0, True)
        (t_tight, m_tight), (t_ops, m_ops) = stage_bounds(S), stage_bounds(S, tight=False)
        spans = np.triu_indices(tabs.n_units + 1, 1)  # [a, e] with a < e
        for s in range(4):
            assert np.all(t_tight[s][spans] >= t_ops[s][spans] * (1 - 1e-12))
            assert np.all(m_tight[s][spans] >= m_ops[s][spans] * (1 - 1e-12))
        assert any(np.any(t_tight[s][spans] > t_ops[s][spans] * (1 + 1e-9)) for s in range(4))
