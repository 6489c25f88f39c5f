"""Compute at achievable speed (search/prices/compute.py): what kernels lose against peak."""

from __future__ import annotations

import pytest

from search.models.graph import Op, TensorRef
from search.prices.cluster import get_device
from search.prices.compute import K_HALF, TILE, Kernel, gemm_efficiency, op_time

A100 = get_device("a100-80gb")
PEAK = A100.peak("fp16")


def _op(kind: str) -> Op:
    return Op(name="x", kind=kind, output=TensorRef(source=None, shape=(4, 4), dims=("a", "b")))


def test_a_large_gemm_runs_at_the_catalog_efficiency_of_peak_not_at_peak():
    m = n = TILE * A100.sm_count  # whole waves: no quantization loss
    k = 8192
    eff = gemm_efficiency(A100, Kernel(flops=2.0 * m * n * k, bytes=0.0, rows=m, cols=n))
    assert eff == pytest.approx(A100.gemm_efficiency * k / (k + K_HALF))
    assert 0.7 < eff < 0.85


def test_a_last_wave_partly_empty_is_paid_whole():
    k = 4096
    full = Kernel(flops=2.0 * TILE * TILE * A100.sm_count * k, bytes=0.0, rows=TILE * A100.sm_count, cols=TILE)
    one_more = Kernel(flops=2.0 * TILE * TILE * (A100.sm_count + 1) * k, bytes=0.0,
                      rows=TILE * (A100.sm_count + 1), cols=TILE)
    # one tile more than the SMs: two waves for barely more work
    t_full = op_time(_op("linear"), full, A100, PEAK).forward
    t_more = op_time(_op("linear"), one_more, A100, PEAK).forward
    assert t_more > 1.9 * (t_full - A100.kernel_overhead)


def test_a_skinny_gemm_is_far_below_peak():
    k = 16  # a short reduction: the prologue and epilogue dominate
    skinny = Kernel(flops=2.0 * 4096 * 4096 * k, bytes=0.0, rows=4096, cols=4096)
    assert gemm_efficiency(A100, skinny) < 0.25 * A100.gemm_efficiency


def test_memory_bound_ops_stream_at_achievable_bandwidth_and_every_kernel_pays_its_launch():
    k = Kernel(flops=1e6, bytes=1e9)
    t = op_time(_op("elementwise"), k, A100, PEAK)
    assert t.forward == pytest.approx(1e9 / (A100.memory_bandwidth * A100.memory_efficiency) + A100.kernel_overhead)
    tiny = op_time(_op("elementwise"), Kernel(flops=10.0, bytes=64.0), A100, PEAK)
    assert tiny.forward == pytest.approx(A100.kernel_overhead, rel=0.01)  # launch-bound


def test_a_gemm_backward_is_two_gemms_and_attention_backward_recomputes():
    k = Kernel(flops=1e12, bytes=1e6, rows=8192, cols=8192)
    lin = op_time(_op("linear"), k, A100, PEAK)
    assert lin.backward == pytest.approx(2 * lin.forward)
    att = op_time(_op("attention"), Kernel(flops=1e12, bytes=1e6), A100, PEAK)
    assert att.forward == pytest.approx(1e12 / (A100.attention_efficiency * PEAK) + A100.kernel_overhead)
    assert att.backward > 2 * (att.forward - A100.kernel_overhead)


def test_efficiencies_outside_zero_to_one_are_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="fraction of peak"):
        A100.model_validate({**A100.model_dump(), "gemm_efficiency": 1.5})
    with pytest.raises(ValidationError):
        A100.model_validate({**A100.model_dump(), "kernel_overhead": -1e-6})
