"""Model FLOPs and MFU: how much of the devices' peak a plan's predicted iteration would use.

MFU is counted as Megatron-LM and PaLM count it: the model's own work per iteration (forward and
backward, 3 x the forward FLOPs of every op for the whole global batch) over what the devices
could do in that time at the job's precision. Recomputation is work the plan chooses to redo,
not model work, so it is NOT counted: a plan that recomputes is slower at the same model FLOPs
and its MFU drops.

`op.flops` (search/models/graph.py) is the forward FLOPs of the whole, unsharded op for the
graph's batch; a block stack lists every layer's ops in `graph.ops` (block reuse prices layers
2.. through one template but the graph keeps them all), so the sum counts every layer.
"""

from __future__ import annotations

from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import PRECISION_BYTES

BACKWARD_FACTOR = 2.0  # backward = 2 x forward (input and weight gradients), as the cost model prices it


def model_flops(graph: OpGraph) -> float:
    """Forward + backward FLOPs of one training iteration of `graph` (its global batch)."""
    return (1.0 + BACKWARD_FACTOR) * graph.total_flops()


def peak_flops(cluster: Cluster, precision: str) -> float:
    """Peak FLOP/s of one device of the cluster at the job's precision (what the cost model's
    roofline uses: bf16/fp16 tensor cores, fp32 without TF32)."""
    return cluster.device.peak(PRECISION_BYTES[precision].compute_dtype)


def mfu(flops: float, time_s: float, cluster: Cluster, precision: str) -> float | None:
    """Model FLOPs utilisation: flops / (time_s x devices x peak FLOP/s); None when time_s is not
    a positive time."""
    if not time_s > 0.0:
        return None
    return flops / (time_s * cluster.num_devices * peak_flops(cluster, precision))


def format_mfu(m: float | None) -> str:
    """MFU as a percentage people read: '41.2%', '0.034%'; '-' when unknown."""
    if m is None:
        return "-"
    pct = 100 * m
    return f"{pct:.1f}%" if pct >= 1 else f"{pct:.2g}%"
