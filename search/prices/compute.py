"""Compute at achievable speed: how long one op's kernels take on a device, from the catalog.

A roofline at peak (FLOPs / peak FLOP/s, bytes / memory bandwidth) prices a GPT-3 13B step at
~93% MFU where real runs reach 35-55%. What real kernels lose, and what this module charges:

- **GEMMs** (`linear`, `matmul`, `conv`) reach a fraction of peak (`DeviceSpec.gemm_efficiency`:
  cuBLAS on large fp16/bf16 shapes) and lose more to *wave quantization*: the output is cut into
  TILE x TILE tiles, one per streaming multiprocessor at a time, and the last wave runs partly
  empty (a 2048 x 2304 output on 108 SMs is 2.7 waves, paid as 3). A short reduction (small K)
  is paid for its prologue/epilogue: efficiency falls as K / (K + K_HALF).
- **Attention** (`attention`, the fused scaled-dot-product kernel) runs at its own fraction of
  peak (`attention_efficiency`); its backward recomputes the scores (2.5x the forward).
- **Everything else** (norms, pointwise ops, softmax, losses, embeddings) is memory-bound: the
  bytes it reads and writes at the bandwidth streaming kernels reach (`memory_efficiency`).
- **Every kernel** pays a launch/dispatch cost (`kernel_overhead`): it dominates small ops and
  CPU runs.

Backward is two kernels per GEMM (input and weight gradients) and twice the bytes for the rest.
Both objectives stay sums over ops: each op is priced alone, which keeps frontier tracking exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from search.models.graph import Op
from search.prices.cluster import DeviceSpec

TILE = 128      # cuBLAS's common output tile edge on tensor cores (128 x 128 or 128 x 256)
K_HALF = 64     # reduction length at which a GEMM's prologue/epilogue costs half its throughput
GEMM_KINDS = frozenset({"linear", "matmul", "conv"})
ATTENTION_BACKWARD = 2.5  # FlashAttention's backward: two GEMMs plus recomputing the scores


@dataclass(frozen=True)
class Kernel:
    """What one op asks of the device in its forward pass, on one rank."""

    flops: float          # FLOPs on this rank
    bytes: float          # bytes read and written on this rank
    rows: float = 0.0     # a GEMM's output rows (M, batch folded in) on this rank
    cols: float = 0.0     # a GEMM's output columns (N) on this rank


@dataclass(frozen=True)
class OpTime:
    forward: float
    backward: float


def gemm_efficiency(device: DeviceSpec, k: Kernel) -> float:
    """Fraction of peak a GEMM of this shape reaches: the large-GEMM figure, times the share of
    the last wave's SMs that work, times the short-reduction penalty."""
    return _gemm_efficiency(device, k.flops, k.rows, k.cols)


def _gemm_efficiency(device: DeviceSpec, flops: float, rows: float, cols: float) -> float:
    eff = device.gemm_efficiency
    if device.sm_count and rows > 0 and cols > 0:
        tiles = math.ceil(rows / TILE) * math.ceil(cols / TILE)
        waves = math.ceil(tiles / device.sm_count)
        eff *= tiles / (waves * device.sm_count)
    if rows > 0 and cols > 0 and flops > 0:
        reduction = flops / (2.0 * rows * cols)
        eff *= reduction / (reduction + K_HALF)
    return eff


def op_time(op: Op, k: Kernel, device: DeviceSpec, peak: float) -> OpTime:
    """Forward and backward seconds of one op on one rank at the device's achievable speed."""
    fwd, bwd = kernel_seconds(op.kind, k.flops, k.bytes, k.rows, k.cols, device, peak)
    return OpTime(forward=fwd, backward=bwd)


def kernel_seconds(kind: str, flops: float, nbytes: float, rows: float, cols: float, device: DeviceSpec,
                   peak: float) -> tuple[float, float]:
    """`op_time` of an op of this kind from its Kernel's fields, as (forward, backward): the cost
    model prices thousands of configurations, a Kernel and an OpTime made for each cost more
    than the arithmetic."""
    stream = nbytes / (device.memory_bandwidth * device.memory_efficiency)
    launch = device.kernel_overhead
    if kind in GEMM_KINDS and flops > 0:
        fwd = max(flops / (_gemm_efficiency(device, flops, rows, cols) * peak), stream)
        return fwd + launch, 2.0 * (fwd + launch)
    if kind == "attention" and flops > 0:
        fwd = max(flops / (device.attention_efficiency * peak), stream)
        return fwd + launch, ATTENTION_BACKWARD * fwd + 2.0 * launch
    fwd = max(flops / peak, stream)
    return fwd + launch, 2.0 * fwd + launch


def gemm_shape(out_local: float, out_cols: float) -> tuple[float, float]:
    """(rows, cols) of a GEMM's output on one rank: the last output dimension is N, the rest M."""
    cols = max(out_cols, 1.0)
    return out_local / cols, cols
