"""FT stays exact on Tofu's models: on small captured LSTM LMs and wide ResNets its frontier
equals the exhaustive reference's. Whole models on a data-parallel mesh (with the block stack's
recomputation and every ZeRO stage); on dp x tp the parts where the space is wide - one LSTM
time step (the recurrent GEMM, its gates and the state update: Tofu's partitioning along the
hidden size lives here) and one wide bottleneck - cut out of the captured graph, because the
whole graph has 1e11 assignments there."""

from __future__ import annotations

import math

import pytest

from search.algorithm.exhaustive import MAX_ASSIGNMENTS, exhaustive_search
from search.algorithm.ft import SearchOptions, search
from search.models.capture import capture_model
from search.models.graph import Op, OpGraph, TensorRef
from search.models.zoo import ModelSpec, _lstm, _wrn
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis, op_configs
from tests.search.algorithm.test_ft_exact import check_points, same_frontier

CLUSTER = make_cluster("h100-80gb", 4, devices_per_node=4)
BATCH, SEQ = 8, 3
JOB = TrainingJob(global_batch=BATCH, seq_len=SEQ, precision="bf16")
DP4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
DP2_TP2 = Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("tp", 2, 1, "tensor")))
TP4 = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("tp", 4, 1, "tensor")))
LSTM = _lstm("lstm-test", "LSTM test", 2, 32, vocab=64, seq=SEQ)
# two steps: the exhaustive reference enumerates at most 64 free dimensions (one per op)
LSTM_SHORT = _lstm("lstm-test", "LSTM test", 2, 32, vocab=64, seq=2)
WRN = _wrn("wrn-test", [1, 1, 1, 1], 2, "WRN test", image_size=32, num_classes=10, base=4)


def captured(spec: ModelSpec) -> OpGraph:
    return capture_model(spec, BATCH, spec.default_seq_len)


def cut(g: OpGraph, names: list[str]) -> OpGraph:
    """The ops `names` as a graph of their own: inputs made elsewhere become graph inputs."""
    keep = set(names)

    def ref(t: TensorRef) -> TensorRef:
        return t if t.source in keep else t.model_copy(update={"source": None})

    ops: list[Op] = [op.model_copy(update={"inputs": tuple(ref(t) for t in op.inputs)})
                     for op in g.ops if op.name in keep]
    return OpGraph(name=f"{g.name}-cut", ops=tuple(ops), batch_label=g.batch_label, meta=dict(g.meta))


def lstm_step(g: OpGraph) -> OpGraph:
    """Layer 0's second time step: the recurrent GEMM and everything up to the next one."""
    names = [op.name for op in g.ops]
    start = names.index("layers.0.hh:linear")
    end = names.index("layers.0.hh:linear#1")
    return cut(g, [n for n in names[start:end] if n.startswith("layers.0")])


def bottleneck(g: OpGraph, stage: str) -> OpGraph:
    return cut(g, [op.name for op in g.ops if op.module.startswith(f"{stage}.")])


def assignments(g: OpGraph, mesh: Mesh) -> float:
    return math.prod(len(op_configs(op, mesh, g.batch_label)) for op in g.ops)


def test_the_lstm_step_splits_the_hidden_size_on_a_tensor_axis():
    """The cut is the interesting part of the space: the recurrent GEMM may split its gates
    (column) or the hidden state it reads (row), and the pointwise ops the hidden size."""
    g = lstm_step(captured(LSTM))
    hh = next(op for op in g.ops if op.name == "layers.0.hh:linear")
    gates, hidden = hh.params[0].dims
    assert gates != hidden, "the recurrent weight's two dimensions must stay two labels"
    labels = {c[-1] for c in op_configs(hh, DP2_TP2, g.batch_label)}
    assert {None, gates, hidden} <= labels
    assert any(hidden in op.splittable for op in g.ops if op.kind == "elementwise")
    assert 1e3 < assignments(g, DP2_TP2) * 4 < MAX_ASSIGNMENTS


@pytest.mark.parametrize("mesh", [DP2_TP2, TP4], ids=["dp2xtp2", "tp4"])
def test_ft_equals_exhaustive_on_an_lstm_time_step(mesh):
    g = lstm_step(captured(LSTM))
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(mesh,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[mesh])
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_ft_equals_exhaustive_on_a_whole_lstm_lm_data_parallel():
    """Both LSTM layers as a block stack: per-layer recomputation, every ZeRO stage."""
    g = captured(LSTM_SHORT)
    assert g.blocks and len(g.blocks[0].layers) == 2
    job = TrainingJob(global_batch=BATCH, seq_len=2, precision="bf16")
    ft = search(g, CLUSTER, job, SearchOptions(meshes=(DP4,)))
    ex = exhaustive_search(g, CLUSTER, job, meshes=[DP4], tie_blocks=True)
    same_frontier(ft.points, ex.points)
    check_points(ft)
    assert len(ft.points) > 1


@pytest.mark.parametrize("mesh", [DP2_TP2, TP4], ids=["dp2xtp2", "tp4"])
def test_ft_equals_exhaustive_on_a_wide_bottleneck(mesh):
    g = bottleneck(captured(WRN), "layer4")
    assert any(op.kind == "conv" for op in g.ops)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(mesh,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[mesh])
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_ft_equals_exhaustive_on_a_whole_wide_resnet_data_parallel():
    g = captured(WRN)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(DP4,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[DP4])
    same_frontier(ft.points, ex.points)
    check_points(ft)
