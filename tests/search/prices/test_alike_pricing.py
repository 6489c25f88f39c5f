"""Ops that price alike share one op table (`CostModel._alike_op_costs`): every op's table, got
through the signature memo, equals the table `_op_costs` prices for that op alone, array for
array, on HF families (tiny configs) and zoo models, several meshes and ZeRO stages, with and
without a profile (synthetic: collective fits, overheads, calibration and measured ops)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from search.algorithm.chain import layer_outputs
from search.algorithm.evaluate import micro_batch_graph
from search.models.capture import capture_model
from search.models.graph import OpGraph
from search.models.zoo import get_model, spec_from_hf_config
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, OpCosts, TrainingJob, effective_zero
from search.prices.mesh import TENSOR, Mesh, _op_configs, expert_meshes, mesh_candidates, op_configs, placeable_meshes
from search.prices.profile import (
    Calibration,
    CollectiveFit,
    DeviceProfile,
    HostInfo,
    LinearFit,
    OpEntry,
    Overheads,
    Stat,
    op_signature,
)
from tests.search.models.test_hf_families import JAMBA_PERIODIC, NARROW, QWEN3_NEXT_PERIODIC

DEVICES = 8


def _hf(cfg: dict) -> OpGraph:
    return capture_model(spec_from_hf_config(cfg, cfg["model_type"]), 8, 32)


GRAPHS = {
    "jamba": lambda: _hf(JAMBA_PERIODIC),
    "qwen3_next": lambda: _hf(QWEN3_NEXT_PERIODIC),
    "llama": lambda: _hf({"model_type": "llama", **NARROW, "num_hidden_layers": 4, "num_key_value_heads": 2}),
    "t5-tiny": lambda: capture_model(get_model("t5-tiny"), 8, None),
    "bart-tiny": lambda: capture_model(get_model("bart-tiny"), 8, None),
    "gpt2-tiny": lambda: capture_model(get_model("gpt2-tiny"), 8, None),
}


@functools.cache
def _graph(name: str) -> OpGraph:
    """Each model captured once for both parametrisations (graphs are never modified)."""
    return GRAPHS[name]()


def _meshes(g: OpGraph) -> list[Mesh]:
    """A few meshes: data only, data x tensor, tensor only, and an expert mesh where the model has one."""
    cluster = make_cluster("h100-80gb", DEVICES, devices_per_node=DEVICES)
    meshes = placeable_meshes(g, mesh_candidates(cluster))
    picked = meshes[:2] + meshes[-1:] + expert_meshes(g, meshes)[:1]
    return list(dict.fromkeys(picked))


def _profile(g: OpGraph, meshes: list[Mesh]) -> DeviceProfile:
    """Collective fits for every group size, overheads, calibration, and measured times for every
    other op's configurations (the rest fall back to the calibrated roofline)."""
    sizes = {ax.size for m in meshes for ax in m.axes if ax.size > 1}
    fits = [CollectiveFit(kind=k, group_size=n, alpha=1e-5 * n, beta=1e-10)
            for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast") for n in sizes]
    ops: dict[str, OpEntry] = {}
    for i, op in enumerate(g.ops):
        if i % 2:
            continue
        for m in meshes:
            for cfg in op_configs(op, m, g.batch_label):
                t = 1e-6 * (1 + len(ops) % 7)
                ops[op_signature(op, m, cfg, "bf16")] = OpEntry(kind=op.kind, fwd=Stat(median=t, lo=t, hi=t),
                                                                bwd=Stat(median=2 * t, lo=2 * t, hi=2 * t), samples=1)
    return DeviceProfile(device="h100-80gb", host=HostInfo(cpu_count=0), ops=ops, collectives=fits,
                         optimizer={"bf16": LinearFit(alpha=5e-4, beta=2e-9)},
                         overheads=Overheads(optimizer_tensor=1e-5, optimizer_dtensor=1e-4, dtensor_op=3e-4,
                                             recompute_op=5e-5),
                         calibration=Calibration(compute={"*": 1.2, "linear": 0.9}, comm={"dp": 1.1}, sync_s=1e-5,
                                                 op_s=2e-6, memory_overhead_bytes=1e6))


def _assert_same_table(got: OpCosts, fresh: OpCosts) -> None:
    assert got.configs == fresh.configs
    assert got.estimated == fresh.estimated
    for f in dataclasses.fields(OpCosts):
        a, b = getattr(got, f.name), getattr(fresh, f.name)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            assert np.array_equal(a, b), f.name


@pytest.mark.parametrize("profiled", [False, True], ids=["catalog", "profile"])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_op_priced_alike_gets_the_table_it_would_get_alone(name: str, profiled: bool) -> None:
    g = _graph(name)
    meshes = _meshes(g)
    cluster = make_cluster("h100-80gb", DEVICES, devices_per_node=DEVICES)
    job = TrainingJob(global_batch=8, precision="bf16")
    prof = _profile(g, meshes) if profiled else None
    cm = CostModel(g, cluster, job, profile=prof)
    # priced op by op (`_op_costs` consults no table memo), sharing nothing with `cm`
    alone = CostModel(g, cluster, job, profile=prof)
    outputs = layer_outputs(g)
    asked = 0
    for mesh in meshes:
        for zero in (0, 1, 3):
            for op in g.ops:
                checkpoint = op.name in outputs
                got = cm.op_costs(op, mesh, zero, checkpoint=checkpoint)
                fresh = alone._op_costs(op, mesh, effective_zero(op, mesh, zero), checkpoint)
                assert fresh.configs == op_configs(op, mesh, g.batch_label)
                _assert_same_table(got, fresh)
                asked += 1
    # the memo did share: fewer tables priced than asked for
    assert len(cm.__dict__["_alike_memo"]) < asked
    # and the profile's measured times were read
    assert cm.profile is None or cm.profile.measured


@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_op_configures_as_it_would_alone(name: str) -> None:
    """`op_configs` shares one list among ops that read alike and whose sizes divide alike (their
    gcd with the mesh's device count): every op of the graph and of its micro-batch graphs, on
    meshes that split the batch and on tensor meshes (whose shards need not divide every
    micro-batch), gets the configurations `_op_configs` finds for it alone; and ZeRO-1 on a
    tensor-parallel mesh prices an op without parameters as stage 0 does."""
    g = _graph(name)
    cluster = make_cluster("h100-80gb", DEVICES, devices_per_node=DEVICES)
    meshes = list(dict.fromkeys(mesh_candidates(cluster) + expert_meshes(g, mesh_candidates(cluster))))
    for m in (1, 2, 4, 8):
        mg = micro_batch_graph(g, m)
        for mesh in meshes:
            for op in mg.ops:
                assert op_configs(op, mesh, mg.batch_label) == _op_configs(op, mesh, mg.batch_label), (m, op.name)
    cm = CostModel(g, cluster, TrainingJob(global_batch=8, seq_len=32, precision="bf16"))
    for mesh in meshes:
        if any(ax.role == TENSOR and ax.size > 1 for ax in mesh.axes):
            for op in g.ops:
                if not op.params and op_configs(op, mesh, g.batch_label):
                    assert effective_zero(op, mesh, 1) == 0
                    _assert_same_table(cm._op_costs(op, mesh, 0, False), cm._op_costs(op, mesh, 2, False))
