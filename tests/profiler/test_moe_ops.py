"""The profiler times routed experts' ops as they run: every grouped GEMM signature the search
prices builds as a batched GEMM of the op's local output shape (it once fell to a matmul of the
stacked weight untransposed, which raised), and the dispatch and combine as their memory traffic."""

from __future__ import annotations

import math

from profiler.ops import build, enumerate_signatures
from search.prices.cluster import make_cluster
from search.prices.mesh import output_placement, shard_factor
from tests.search.graphs import moe_layer


def test_every_expert_signature_builds_at_its_local_shape():
    g = moe_layer(dim=8)
    sigs = enumerate_signatures(g, make_cluster("cpu", 4, devices_per_node=4), "fp32")
    experts = [i for i in sigs.items.values() if "experts" in i.op.name]
    grouped = [i for i in experts if i.op.kind == "linear"]
    # the search's expert-parallel meshes are profiled too (ep4 here; dp2 x ep2's signatures
    # coincide with others' local shapes and are timed once)
    assert any(a.role == "expert" and a.size > 1 for i in grouped for a in i.mesh.axes)
    for inst in experts:
        bench = build(inst, "fp32")
        out = bench.fn()
        local = inst.op.output.numel / shard_factor(output_placement(inst.cfg, inst.op), inst.mesh)
        if inst.op.kind == "linear":
            assert not bench.proxy and math.prod(out.shape) == local, (inst.op.name, inst.cfg, tuple(out.shape))
