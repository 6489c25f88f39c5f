"""The profiler times what the search prices on context axes: for a long-sequence graph the
context-parallel meshes' signatures are enumerated, and the attention's local block (local
queries against local keys, causal) builds and runs at its local shape - the block the cost model
counts once per ring step."""

from __future__ import annotations

from profiler.ops import build, enumerate_signatures
from search.prices.cluster import make_cluster
from search.prices.mesh import CONTEXT, SEQ_LABEL
from tests.search.graphs import attention_lm


def test_ring_attention_blocks_are_profiled_at_their_local_shape():
    seq = 8192
    g = attention_lm(batch=4, seq=seq, dim=8, heads=2)
    sigs = enumerate_signatures(g, make_cluster("cpu", 4, devices_per_node=4), "fp32")
    ring = [i for i in sigs.items.values() if i.op.kind == "attention"
            and any(a.role == CONTEXT and a.size > 1 and lab == SEQ_LABEL
                    for a, lab in zip(i.mesh.axes, i.cfg, strict=True))]
    assert ring, "no attention signature on a context mesh"
    for inst in ring:
        cp = next(a.size for a, lab in zip(inst.mesh.axes, inst.cfg, strict=True) if a.role == CONTEXT and lab == SEQ_LABEL)
        assert "|causal" in inst.signature
        q = build(inst, "fp32")
        out = q.fn()
        assert out.shape[-2] == seq // cp, (inst.signature, tuple(out.shape))
