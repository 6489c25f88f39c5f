"""Block reuse on stacks whose layers are not all one layer (search/models/capture.py): a
periodic stack (A, B, A, B, A, B) is one block-stack layer per period, and a stack of two
uniform runs (2 x A then 4 x B) is the long run alone, the short run priced with the rest of the
graph. On either, FT with block reuse equals the exhaustive reference under the same tie, and
each point re-costs to itself with every op priced."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from search.algorithm.chain import find_chain, layer_outputs
from search.algorithm.evaluate import tables
from search.models.graph import OpGraph, block_layout
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from tests.search.algorithm.module_stacks import BATCH, DIM, stack_graph
from tests.search.algorithm.tied_exact import assert_ft_equals_exhaustive


class _A(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _B(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _graph(kinds: str) -> OpGraph:
    return stack_graph(kinds, {"A": _A, "B": _B})


def test_a_periodic_stack_is_one_block_layer_per_period() -> None:
    g = _graph("ABABABAB")
    assert len(g.blocks) == 1 and len(g.blocks[0].layers) == 4
    assert block_layout(g, g.blocks[0]) == (0, 2)
    chain = find_chain(g, solo=True)
    assert chain is not None and chain.reused >= 2


def test_two_runs_make_the_long_run_the_block_stack() -> None:
    g = _graph("AABBBB")
    assert len(g.blocks) == 1 and len(g.blocks[0].layers) == 4
    assert block_layout(g, g.blocks[0]) == (2, 1)
    assert find_chain(g, solo=True) is not None


def test_a_stack_without_period_has_no_blocks() -> None:
    assert _graph("AABAB").blocks == ()


@pytest.mark.parametrize("kinds,devices,recompute", [("ABABAB", 4, True), ("ABABAB", 8, False),
                                                     ("AABBB", 4, True), ("AABBBB", 8, False)])
def test_ft_equals_the_tied_exhaustive(kinds: str, devices: int, recompute: bool) -> None:
    g = _graph(kinds)
    cluster = make_cluster("h100-80gb", devices, devices_per_node=devices)
    job = TrainingJob(global_batch=BATCH, precision="bf16")
    meshes = tuple(Mesh(pp=1, axes=(MeshAxis("dp", devices // t, t, "data"), MeshAxis("tp", t, 1, "tensor")))
                   for t in (1, 2))
    ft = assert_ft_equals_exhaustive(g, cluster, job, meshes, recompute)
    assert ft.stats["block_reuse"]


def test_a_recomputed_period_keeps_each_module_layers_input() -> None:
    """The executor checkpoints each module layer of a recomputed period (worker/parallelize.py),
    so it holds each one's input: the price keeps the output of every module layer (p per block
    layer), not only the period's last."""
    g = _graph("ABABAB")
    assert layer_outputs(g) == {f"layers.{i}.{'fc' if i % 2 == 0 else 'down'}:linear" for i in range(6)}
    cm = CostModel(g, make_cluster("h100-80gb", 1), TrainingJob(global_batch=BATCH, precision="fp32"))
    ops, _ = tables(g, cm, Mesh(pp=1, axes=(MeshAxis("dp", 1, 1, "data"),)))
    stack = [name for layer in g.blocks[0].layers for name in layer]
    kept = {name: float(ops[name].parts_rc[0, 3]) for name in stack if ops[name].parts_rc[0, 3] > 0}
    assert kept == {name: BATCH * DIM * 4.0 for name in layer_outputs(g)}  # one fp32 layer output each
