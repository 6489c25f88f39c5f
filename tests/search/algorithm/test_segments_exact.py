"""Segment reuse (search/algorithm/segments.py): a periodic stack whose period repeats a module
layer (A, A, B) eliminates each kind of module layer once per problem and reads the others back
through a renaming. FT with it equals FT without it and the exhaustive reference, and every
point, read back, re-prices to itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from search.algorithm import factor_graph
from search.algorithm.chain import find_chain
from search.algorithm.evaluate import mesh_costs
from search.algorithm.factor_graph import JoinMemo, MeshFactors, eliminate_all, eliminate_segmented, segment_index
from search.algorithm.frontier import Factor, assignments, leaf, renamed
from search.algorithm.ft import SearchOptions, search
from search.algorithm.segments import find_segments
from search.models.graph import OpGraph, block_layout
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from tests.search.algorithm.module_stacks import BATCH, DIM, stack_graph
from tests.search.algorithm.tied_exact import assert_ft_equals_exhaustive


class _A(nn.Module):
    """A module layer with ops of its own between its input and its output."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class _Gate(nn.Module):
    """The smallest module layer with an op of its own: small enough for the exhaustive reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class _Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


class _B(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def _graph(kinds: str) -> OpGraph:
    return stack_graph(kinds, {"A": _A, "G": _Gate, "T": _Tanh, "B": _B})


def _meshes(devices: int, tps: tuple[int, ...] = (1, 2)) -> tuple[Mesh, ...]:
    return tuple(Mesh(pp=1, axes=(MeshAxis("dp", devices // t, t, "data"), MeshAxis("tp", t, 1, "tensor")))
                 for t in tps)


def _job() -> TrainingJob:
    return TrainingJob(global_batch=BATCH, precision="bf16")


def test_the_period_repeats_a_module_layer() -> None:
    g = _graph("AAB" * 3)
    assert block_layout(g, g.blocks[0]) == (0, 3)
    assert set(segment_index(g).values()) == set(range(9))
    assert segment_index(_graph("A" * 4)) == {}  # not periodic: eliminated as before


def test_the_template_finds_one_kind_of_two() -> None:
    """In the template (module layers 3, 4, 5), layers 3 and 4 are one kind, read over (their
    input, their output); layer 5 is another."""
    g = _graph("AAB" * 3)
    chain = find_chain(g, solo=True)
    assert chain is not None
    cm = CostModel(g, make_cluster("h100-80gb", 4), _job())
    mesh = _meshes(4)[1]
    fg = MeshFactors(g, cm, mesh, mesh_costs(g, cm, mesh, 0, chain), {}, chain, 0.0, None)
    ops = [g.op(name) for name in chain.template]
    factors = fg.factors(ops, {})
    owners = fg.owners[(tuple(chain.template), ())]
    keep = (chain.boundary, chain.template[-1])
    segments, rest = find_segments(factors, owners, fg.segment_of, keep)
    assert len(segments) == 3 and not rest
    first, second, third = (seg.spelling(fg.domain) for seg in segments)
    assert first == second != third
    assert segments[0].interface == (chain.boundary, segments[1].interface[0])
    # the same frontier as eliminating everything at once
    whole = eliminate_all(factors, fg.domain, keep)
    seg = eliminate_segmented(factors, owners, fg.segment_of, fg.domain, keep, memo=JoinMemo())
    _assert_same_points(whole, seg, keep)
    # and every point reads back to an assignment of every op that re-prices to it
    cols = assignments(seg, np.arange(len(seg)))
    assert set(cols) == {v for f in factors for v in f.scope}
    t = sum(f.t[_rows(f, cols)] for f in factors)
    m = sum(f.m[_rows(f, cols)] for f in factors)
    np.testing.assert_allclose(t, seg.t, rtol=1e-9)
    np.testing.assert_allclose(m, seg.m, rtol=1e-9)


def _rows(f: Factor, cols: dict[str, np.ndarray]) -> np.ndarray:
    """Per point read back, the row of leaf f its assignment picks (every row of a leaf is one
    assignment of its scope)."""
    want = np.stack([cols[v] for v in f.scope], axis=1)
    index = {tuple(k): i for i, k in enumerate(f.keys.tolist())}
    return np.array([index[tuple(k)] for k in want.tolist()])


def _assert_same_points(a: Factor, b: Factor, keep: tuple[str, ...]) -> None:
    """Per assignment of `keep`, the same frontier points (to RTOL)."""
    def points(f: Factor) -> list[tuple[tuple[int, ...], float, float]]:
        cols = [f.scope.index(v) for v in keep]
        return sorted(zip(map(tuple, f.keys[:, cols].tolist()), f.t.tolist(), f.m.tolist(), strict=True))

    pa, pb = points(a), points(b)
    assert [p[0] for p in pa] == [p[0] for p in pb]
    np.testing.assert_allclose([p[1:] for p in pa], [p[1:] for p in pb], rtol=1e-9)


def test_a_renamed_view_reads_back_under_its_names() -> None:
    f = leaf(("a", "b"), np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0]), np.array([2.0, 1.0]))
    view = renamed(f, {"a": "x", "b": "y"})
    assert view.scope == ("x", "y")
    got = assignments(view, np.array([1, 0]))
    assert {k: v.tolist() for k, v in got.items()} == {"x": [1, 0], "y": [0, 1]}


def _count_reuse(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many views of a segment's elimination under another's names were made, counted as
    the search goes."""
    reused = [0]

    def counted(f: Factor, names: dict[str, str]) -> Factor:
        reused[0] += 1
        return renamed(f, names)

    monkeypatch.setattr(factor_graph, "renamed", counted)
    return reused


@pytest.mark.slow
def test_ft_equals_the_tied_exhaustive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The smallest periodic stack with a repeated module layer the reference can enumerate (with
    recomputation: without it, the two gates' outputs are kept by different readers and price
    apart, so nothing would be reused)."""
    g = _graph("GGT" * 3)
    cluster = make_cluster("h100-80gb", 4, devices_per_node=4)
    reused = _count_reuse(monkeypatch)
    ft = assert_ft_equals_exhaustive(g, cluster, _job(), _meshes(4, (2,)), True)
    assert ft.stats["block_reuse"] and reused[0]


@pytest.mark.parametrize("kinds", ["AAB" * 4, "ABAA" * 3])
def test_ft_with_segment_reuse_equals_ft_without(kinds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point, its time and memory to RTOL, and the assignment read back re-prices to it."""
    g = _graph(kinds)
    cluster = make_cluster("h100-80gb", 8, devices_per_node=8)
    options = SearchOptions(meshes=_meshes(8), zero_stages=(0, 3), recompute=True)
    with monkeypatch.context() as m:
        reused = _count_reuse(m)
        got = search(g, cluster, _job(), options)
    assert reused[0]
    with monkeypatch.context() as m:
        m.setattr(factor_graph, "segment_index", lambda graph: {})
        want = search(g, cluster, _job(), options)
    a = np.array([(p.time_s, p.memory_bytes) for p in got.points])
    b = np.array([(p.time_s, p.memory_bytes) for p in want.points])
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-9)
    for p in got.points:
        again = got.solutions[p.mesh_index].recost(g, {k: v[p.row:p.row + 1] for k, v in p.configs.items()}, [None])
        assert again["time"][0] == pytest.approx(p.time_s, rel=1e-9)
        assert again["memory"][0] == pytest.approx(p.memory_bytes, rel=1e-9)
