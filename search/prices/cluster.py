"""Hardware description: accelerator types and the cluster a plan is searched for.

The planner's cost model needs a handful of numbers per accelerator (memory, HBM bandwidth,
peak FLOP/s per dtype, link bandwidths and latencies) and the shape of the cluster (how many
devices, how many share a node). This module holds a catalog of common parts with figures
taken from the vendors' public datasheets, so a user can say ``--device h100-80gb --devices 64``
and get defensible numbers, plus a JSON format for custom or overridden hardware.

Conventions, applied to every catalog entry:

* ``peak_flops`` are DENSE tensor-core figures. NVIDIA datasheets print the 2:4-sparsity
  number with an asterisk ("Shown with sparsity. Specifications 1/2 lower without
  sparsity"); we store half of it, because training workloads are dense.
* Memory capacities printed as "80GB" on an HBM/GDDR datasheet are binary (80 GiB of DRAM);
  we store ``80 * 2**30`` bytes. (The driver reserves a few hundred MiB; planners keep a
  margin for that anyway.)
* Bandwidths are bytes/s in ONE direction per device. NVLink figures on datasheets are
  bidirectional totals (H100: "900GB/s"), so we store half.
* Inter-node bandwidth is the NIC share of one device in the vendor's reference node (DGX
  class), i.e. NIC line rate / 8 bits * NICs per node / devices per node.
* Latencies are per collective step (one hop of a ring), including the software overhead
  NCCL adds; they are order-of-magnitude assumptions, not datasheet figures, and say so.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from search.errors import InputError, invalid

__all__ = [
    "CATALOG",
    "Cluster",
    "DeviceSpec",
    "format_size",
    "get_device",
    "cluster_from_dict",
    "load_cluster",
    "make_cluster",
    "parse_size",
]

GiB = 2**30

# dtypes a peak FLOP/s figure may be given for; anything else is a typo in custom hardware.
KNOWN_DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


def _positive_finite(value: float, what: str) -> float:
    """Reject zero, negative, NaN and infinite figures: any of them poisons the cost model."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return value


class DeviceSpec(BaseModel):
    """One accelerator type, as its vendor's public datasheet describes it.

    Frozen so that a spec shared by many clusters (the catalog entries) cannot be altered by
    one of them; build a new one with ``model_copy(update=...)`` for variants.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Catalog key, e.g. ``"h100-80gb"``."""
    vendor_name: str
    """The vendor's product name, e.g. ``"NVIDIA H100 SXM5 80GB"``."""
    memory_bytes: int
    memory_bandwidth: float
    """Device memory (HBM/GDDR/DRAM) bandwidth, bytes/s."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype (no structured sparsity)."""
    intra_node_bandwidth: float
    """Bytes/s per device, one direction, to peers in the same node."""
    inter_node_bandwidth: float
    """Bytes/s per device, one direction, to other nodes (its share of the node's NICs)."""
    intra_node_latency: float
    """Seconds per collective step inside a node."""
    inter_node_latency: float
    """Seconds per collective step across nodes."""
    devices_per_node: int
    """The usual node size for this part (8 for DGX/HGX)."""
    # ---- achievable fractions (search/prices/compute.py): what kernels and NCCL reach, not peak ----
    gemm_efficiency: float = 0.75
    """Fraction of dense peak a large GEMM reaches (cuBLAS on big fp16/bf16 shapes)."""
    attention_efficiency: float = 0.5
    """Fraction of dense peak the fused attention kernel reaches (forward)."""
    memory_efficiency: float = 0.8
    """Fraction of memory bandwidth streaming (memory-bound) kernels reach."""
    kernel_overhead: float = 5e-6
    """Seconds each kernel costs beyond its work: launch, dispatch, the gap between kernels."""
    sm_count: int = 0
    """Streaming multiprocessors, for GEMM wave quantization (0: not modelled)."""
    intra_node_efficiency: float = 0.8
    """Fraction of the intra-node link NCCL's collectives reach (bus bandwidth / link)."""
    inter_node_efficiency: float = 0.9
    """Fraction of the NIC line rate NCCL's collectives reach across nodes."""
    comm_overlap: float = 1.0
    """How much of compute gradient and parameter collectives can hide behind: 1 where they run
    on their own streams (NCCL), 0 where they compete with compute for the same cores (gloo on
    a CPU host whose ranks outnumber its cores)."""
    source: str
    """Where the numbers come from (datasheet title + URL) and which are assumptions."""

    @field_validator("name", "vendor_name", "source")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("memory_bytes", "devices_per_node")
    @classmethod
    def _positive_int(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value

    @field_validator("comm_overlap")
    @classmethod
    def _overlap(cls, value: float) -> float:
        if isinstance(value, bool) or not math.isfinite(value) or not 0 <= value <= 1:
            raise ValueError(f"comm_overlap is a fraction in [0, 1], got {value!r}")
        return value

    @field_validator("gemm_efficiency", "attention_efficiency", "memory_efficiency", "intra_node_efficiency",
                     "inter_node_efficiency")
    @classmethod
    def _fraction(cls, value: float) -> float:
        _positive_finite(value, "an efficiency")
        if value > 1:
            raise ValueError(f"an efficiency is a fraction of peak in (0, 1], got {value}")
        return value

    @field_validator("kernel_overhead")
    @classmethod
    def _overhead(cls, value: float) -> float:
        if isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"kernel_overhead must be a finite number of seconds >= 0, got {value!r}")
        return value

    @field_validator("sm_count")
    @classmethod
    def _sms(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"sm_count must be >= 0, got {value}")
        return value

    @field_validator(
        "memory_bandwidth",
        "intra_node_bandwidth",
        "inter_node_bandwidth",
        "intra_node_latency",
        "inter_node_latency",
    )
    @classmethod
    def _positive_float(cls, value: float) -> float:
        return _positive_finite(value, "value")

    @field_validator("peak_flops")
    @classmethod
    def _check_flops(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("needs at least one dtype, e.g. {'bf16': 989.4e12}")
        for dtype, flops in value.items():
            if dtype not in KNOWN_DTYPES:
                raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(KNOWN_DTYPES)}")
            _positive_finite(flops, f"peak_flops[{dtype!r}]")
        return value

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; InputError when this part has no figure for it.

        The planner asks for the user's training dtype; a missing one (fp8 on an A100) is
        the user's choice of dtype not fitting the hardware, hence InputError, not KeyError.
        """
        try:
            return self.peak_flops[dtype.lower()]
        except KeyError:
            known = ", ".join(sorted(self.peak_flops))
            raise InputError(
                f"device '{self.name}' has no peak FLOP/s for dtype '{dtype}'; it has: {known}"
            ) from None


# --------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------

_H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
    "(product page https://www.nvidia.com/en-us/data-center/h100/); exact dense figures from "
    "the NVIDIA H100 Tensor Core GPU Architecture whitepaper, "
    "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet, "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_V100_DATASHEET = (
    "NVIDIA Tesla V100 GPU Accelerator datasheet, "
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "tesla-volta-v100-datasheet-letter-fnl-web.pdf"
)
_NVLINK_NOTE = "NVLink bandwidth halved to one direction"
_LATENCY_NOTE = "latencies are assumed per-ring-step NCCL costs, not datasheet figures"

_CATALOG_LIST: list[DeviceSpec] = [
    DeviceSpec(
        name="h100-80gb",
        vendor_name="NVIDIA H100 SXM5 80GB",
        memory_bytes=80 * GiB,
        memory_bandwidth=3.35e12,  # HBM3, 3.35 TB/s
        # datasheet: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958* TFLOPS (* = sparse)
        peak_flops={"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12,
                    "fp16": 989.4e12, "fp8": 1978.9e12},
        intra_node_bandwidth=450e9,  # NVLink 4 via NVSwitch: 900 GB/s bidirectional
        inter_node_bandwidth=50e9,  # DGX H100: 8x ConnectX-7 400 Gb/s NDR, one per GPU
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.72, attention_efficiency=0.45, memory_efficiency=0.85,
        kernel_overhead=4e-06, sm_count=132,
        source=(
            f"{_H100_DATASHEET}. H100 SXM column: 80GB HBM3 3.35TB/s, NVLink 900GB/s "
            f"({_NVLINK_NOTE}); sparse tensor figures halved. Inter-node: DGX H100 has "
            "8x 400 Gb/s ConnectX-7 InfiniBand NDR, one per GPU, "
            "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html; "
            f"{_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="h100-pcie",
        vendor_name="NVIDIA H100 PCIe 80GB",
        memory_bytes=80 * GiB,
        memory_bandwidth=2.0e12,  # HBM2e, 2 TB/s
        # datasheet: FP32 51, TF32 756*, BF16/FP16 1,513*, FP8 3,026* TFLOPS
        peak_flops={"fp32": 51e12, "tf32": 378e12, "bf16": 756e12,
                    "fp16": 756e12, "fp8": 1513e12},
        intra_node_bandwidth=64e9,  # PCIe Gen5 x16: 128 GB/s bidirectional
        inter_node_bandwidth=25e9,  # assumed: one 400 Gb/s NIC per two GPUs
        intra_node_latency=5e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.72, attention_efficiency=0.45, memory_efficiency=0.85,
        kernel_overhead=4e-06, sm_count=114,
        source=(
            f"{_H100_DATASHEET}. H100 PCIe column: 80GB HBM2e 2TB/s, PCIe Gen5 128GB/s; "
            "sparse tensor figures halved. Intra-node uses PCIe Gen5 x16 (64e9 B/s one "
            "direction): the 600GB/s NVLink bridge joins only pairs of cards, so an 8-card "
            "ring runs over PCIe. Inter-node is an assumption (one 400 Gb/s NIC shared by "
            f"two GPUs, typical of PCIe servers); {_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="h200",
        vendor_name="NVIDIA H200 SXM 141GB",
        memory_bytes=141 * GiB,
        memory_bandwidth=4.8e12,  # HBM3e, 4.8 TB/s
        # same GH100 compute as H100 SXM: datasheet FP32 67, BF16 1,979* ...
        peak_flops={"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12,
                    "fp16": 989.4e12, "fp8": 1978.9e12},
        intra_node_bandwidth=450e9,  # NVLink 900 GB/s bidirectional
        inter_node_bandwidth=50e9,  # DGX H200: 8x ConnectX-7 400 Gb/s
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.72, attention_efficiency=0.45, memory_efficiency=0.85,
        kernel_overhead=4e-06, sm_count=132,
        source=(
            "NVIDIA H200 Tensor Core GPU datasheet / product page, "
            "https://www.nvidia.com/en-us/data-center/h200/ : H200 SXM 141GB HBM3e, "
            "4.8TB/s, FP32 67 TFLOPS, TF32 989*, BF16/FP16 1,979*, FP8 3,958* TFLOPS "
            f"(* sparse, halved here), NVLink 900GB/s ({_NVLINK_NOTE}). Inter-node: DGX H200 "
            "has 8x 400 Gb/s ConnectX-7, one per GPU, "
            "https://www.nvidia.com/en-us/data-center/dgx-h200/ ; "
            f"{_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="a100-80gb",
        vendor_name="NVIDIA A100 SXM4 80GB",
        memory_bytes=80 * GiB,
        memory_bandwidth=2.039e12,  # HBM2e, 2,039 GB/s
        # datasheet: FP32 19.5, TF32 156 (312*), BF16/FP16 312 (624*) TFLOPS; no FP8
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        intra_node_bandwidth=300e9,  # NVLink 3 via NVSwitch: 600 GB/s bidirectional
        inter_node_bandwidth=25e9,  # DGX A100: 8x ConnectX-6 200 Gb/s HDR, one per GPU
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.8, attention_efficiency=0.6, memory_efficiency=0.85,
        kernel_overhead=4e-06, sm_count=108,
        source=(
            f"{_A100_DATASHEET}. A100 80GB SXM column: HBM2e 2,039GB/s, FP32 19.5, TF32 156, "
            f"BF16/FP16 312 TFLOPS dense, NVLink 600GB/s ({_NVLINK_NOTE}). Inter-node: DGX "
            "A100 has 8x 200 Gb/s ConnectX-6 HDR InfiniBand for compute, one per GPU, "
            "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html; "
            f"{_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="a100-40gb",
        vendor_name="NVIDIA A100 SXM4 40GB",
        memory_bytes=40 * GiB,
        memory_bandwidth=1.555e12,  # HBM2, 1,555 GB/s
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        intra_node_bandwidth=300e9,
        inter_node_bandwidth=25e9,
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.8, attention_efficiency=0.6, memory_efficiency=0.85,
        kernel_overhead=4e-06, sm_count=108,
        source=(
            f"{_A100_DATASHEET}. A100 40GB SXM column: HBM2 1,555GB/s, same compute as the "
            f"80GB part (FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense), NVLink 600GB/s "
            f"({_NVLINK_NOTE}). Inter-node: DGX A100, 8x 200 Gb/s HDR InfiniBand; "
            f"{_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="v100-32gb",
        vendor_name="NVIDIA Tesla V100 SXM2 32GB",
        memory_bytes=32 * GiB,
        memory_bandwidth=900e9,  # HBM2, 900 GB/s
        # datasheet SXM2: FP32 15.7, Tensor 125 TFLOPS (FP16 in, FP32 accumulate).
        # Volta has no BF16 or TF32 hardware: both run at the FP32 rate at best.
        peak_flops={"fp32": 15.7e12, "tf32": 15.7e12, "bf16": 15.7e12, "fp16": 125e12},
        intra_node_bandwidth=150e9,  # NVLink 2: 300 GB/s total, both directions
        inter_node_bandwidth=6.25e9,  # DGX-1: 4x 100 Gb/s EDR IB for 8 GPUs
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.75, attention_efficiency=0.4, memory_efficiency=0.85,
        kernel_overhead=5e-06, sm_count=80,
        source=(
            f"{_V100_DATASHEET}. V100 SXM2 column: 32/16GB HBM2 900GB/s, FP32 15.7, Tensor "
            f"125 TFLOPS, NVLink 300GB/s ({_NVLINK_NOTE}). Volta has no BF16/TF32 tensor "
            "cores: bf16 and tf32 are set to the FP32 rate (emulated; an upper bound). "
            "Inter-node: DGX-1 with V100 has 4x 100 Gb/s EDR InfiniBand for 8 GPUs "
            "(6.25e9 B/s per GPU), https://docs.nvidia.com/dgx/dgx1-user-guide/ ; "
            f"{_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="v100-16gb",
        vendor_name="NVIDIA Tesla V100 SXM2 16GB",
        memory_bytes=16 * GiB,
        memory_bandwidth=900e9,
        peak_flops={"fp32": 15.7e12, "tf32": 15.7e12, "bf16": 15.7e12, "fp16": 125e12},
        intra_node_bandwidth=150e9,
        inter_node_bandwidth=6.25e9,
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.75, attention_efficiency=0.4, memory_efficiency=0.85,
        kernel_overhead=5e-06, sm_count=80,
        source=(
            f"{_V100_DATASHEET}. V100 SXM2 16GB: same figures as the 32GB part (HBM2 "
            f"900GB/s, FP32 15.7, Tensor 125 TFLOPS, NVLink 300GB/s, {_NVLINK_NOTE}); "
            "bf16/tf32 at the FP32 rate (no Volta hardware support). Inter-node: DGX-1, "
            f"4x 100 Gb/s EDR for 8 GPUs; {_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="l4",
        vendor_name="NVIDIA L4 24GB",
        memory_bytes=24 * GiB,
        memory_bandwidth=300e9,  # GDDR6, 300 GB/s
        # datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* TFLOPS
        peak_flops={"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12,
                    "fp16": 121e12, "fp8": 242.5e12},
        intra_node_bandwidth=32e9,  # PCIe Gen4 x16: 64 GB/s bidirectional; no NVLink
        inter_node_bandwidth=1.5625e9,  # GCP g2-standard-96: 100 Gb/s for 8 L4
        intra_node_latency=5e-6,
        inter_node_latency=25e-6,
        devices_per_node=8,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.65, attention_efficiency=0.4, memory_efficiency=0.8,
        kernel_overhead=5e-06, sm_count=58,
        source=(
            "NVIDIA L4 Tensor Core GPU datasheet, "
            "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet "
            "(product page https://www.nvidia.com/en-us/data-center/l4/): 24GB GDDR6 300GB/s, "
            "FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* TFLOPS (* sparse, halved here), "
            "PCIe Gen4 x16 64GB/s (32e9 B/s one direction), no NVLink. Node and NIC: the "
            "largest common L4 host, Google Cloud g2-standard-96 (8 L4, 100 Gbps egress), "
            "https://cloud.google.com/compute/docs/gpus#l4-gpus ; Ethernet (TCP) latency "
            f"assumed higher; {_LATENCY_NOTE}."
        ),
    ),
    DeviceSpec(
        name="cpu",
        vendor_name="Generic x86 server socket (32 cores, AVX-512; modelled on Intel Xeon "
        "Platinum 8462Y+)",
        memory_bytes=256 * GiB,
        memory_bandwidth=307.2e9,  # 8 channels DDR5-4800 x 38.4 GB/s
        # 32 cores x 2 AVX-512 FMA units x 16 fp32 lanes x 2 FLOP x 2.8 GHz base = 5.73e12.
        # bf16/fp16: AVX512_BF16 / AVX512_FP16 dot products double the lane count.
        peak_flops={"fp32": 5.73e12, "tf32": 5.73e12, "bf16": 11.47e12, "fp16": 11.47e12},
        intra_node_bandwidth=50e9,  # assumed: socket-to-socket UPI, only if >1 per node
        inter_node_bandwidth=12.5e9,  # 100 GbE
        intra_node_latency=20e-6,
        inter_node_latency=50e-6,
        devices_per_node=1,
        # achievable, not datasheet: see search/prices/compute.py and docs/cost-model.md
        gemm_efficiency=0.6, attention_efficiency=0.3, memory_efficiency=0.6,
        kernel_overhead=2e-05, sm_count=0, comm_overlap=0.0,
        source=(
            "Assumed generic CPU socket, modelled on Intel Xeon Platinum 8462Y+ (4th gen Xeon "
            "Scalable): 32 cores, 2.8 GHz base, 8 channels DDR5-4800, "
            "https://www.intel.com/content/www/us/en/products/sku/232884/"
            "intel-xeon-platinum-8462y-processor-60m-cache-2-80-ghz/specifications.html . "
            "Peak fp32 = 32 cores x 2 AVX-512 FMA units x 16 lanes x 2 FLOP x 2.8 GHz = "
            "5.73e12 (real AVX-512 clocks run lower); bf16/fp16 = 2x via AVX512_BF16/FP16; "
            "AMX tiles (much higher bf16 peak) deliberately not counted, as framework "
            "training paths rarely sustain them; tf32 = fp32 (no TF32 on CPUs). Memory "
            "bandwidth 8 x 38.4 GB/s = 307.2e9 B/s theoretical. 256 GiB DRAM per socket, one "
            "socket per node, 100 GbE between nodes (12.5e9 B/s); intra-node 50e9 B/s is an "
            "order-of-magnitude assumption for UPI, used only with more than one socket per "
            "node; latencies (20/50 us) assumed for gloo over shared memory / TCP."
        ),
    ),
]

CATALOG: dict[str, DeviceSpec] = {spec.name: spec for spec in _CATALOG_LIST}
"""Known accelerators by catalog key. Do not mutate; specs are frozen."""

# Other spellings users type; they resolve to the canonical entry (whose ``name`` is the key).
_ALIASES: dict[str, str] = {
    "h100": "h100-80gb",
    "h100-sxm": "h100-80gb",
    "h100-sxm5": "h100-80gb",
    "h200-141gb": "h200",
    "h200-sxm": "h200",
}


def get_device(name: str) -> DeviceSpec:
    """Look up a catalog entry, forgiving case, surrounding spaces and ``_`` for ``-``.

    Users type device names on the command line; a typo must give a list of what exists
    rather than a KeyError.
    """
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    try:
        return CATALOG[key]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise InputError(f"unknown device '{name}'; known: {known}") from None


# --------------------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------------------

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    # decimal (SI), as on disk and network datasheets; bare letters follow the k8s convention
    "k": 10**3, "kb": 10**3,
    "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "p": 10**15, "pb": 10**15,
    # binary (IEC), as memory is actually built
    "ki": 2**10, "kib": 2**10,
    "mi": 2**20, "mib": 2**20,
    "gi": 2**30, "gib": 2**30,
    "ti": 2**40, "tib": 2**40,
    "pi": 2**50, "pib": 2**50,
}

_SIZE_RE = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Parse a byte count such as ``"40GiB"``, ``"80 GB"``, ``"1.5TiB"`` or ``"1024"``.

    ``GB`` is 10**9 and ``GiB`` is 2**30 (units are case-insensitive); a bare number is bytes.
    Ints pass through, as do integral floats (JSON writers emit ``8e10``). Fractions are
    rounded to the nearest byte. Zero, negative and unparseable sizes raise InputError,
    because a memory budget of zero is never what the user meant.
    """
    if isinstance(text, bool):
        raise InputError(f"size must be a number of bytes or a string like '40GiB', got {text!r}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, float):
        if not math.isfinite(text) or not text.is_integer():
            raise InputError(f"size in bytes must be a whole number, got {text!r}")
        value = int(text)
    elif isinstance(text, str):
        match = _SIZE_RE.match(text)
        if match is None or match.group(2).lower() not in _UNITS:
            raise InputError(
                f"cannot parse size {text!r}; use e.g. '40GiB', '80GB', '512MiB' or a byte count"
            )
        number, unit = match.groups()
        try:
            exact = Decimal(number) * _UNITS[unit.lower()]
        except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
            raise InputError(f"cannot parse size {text!r}") from None
        value = int(exact.to_integral_value())
    else:
        raise InputError(
            f"size must be a number of bytes or a string like '40GiB', got {type(text).__name__}"
        )
    if value <= 0:
        raise InputError(f"size must be positive, got {text!r}")
    return value


_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min)?\s*$", re.IGNORECASE)
_TIME_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0}


def parse_duration(text: str | int | float) -> float:
    """Parse a time such as ``"250ms"``, ``"1.5s"``, ``"2min"`` or ``0.25`` into seconds (a bare
    number is seconds). Zero, negative, infinite and unparseable times raise InputError."""
    if isinstance(text, bool):
        raise InputError(f"time must be seconds or a string like '250ms', got {text!r}")
    if isinstance(text, int | float):
        value = float(text)
    elif isinstance(text, str):
        match = _TIME_RE.match(text)
        if match is None:
            raise InputError(f"cannot parse time {text!r}; use e.g. '250ms', '1.5s', '2min' or seconds")
        value = float(match.group(1)) * _TIME_UNITS[(match.group(2) or "s").lower()]
    else:
        raise InputError(f"time must be seconds or a string like '250ms', got {type(text).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"time must be positive and finite, got {text!r}")
    return value


_BINARY_PREFIXES: tuple[str, ...] = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_size(n: int) -> str:
    """Render a byte count with a binary unit and one decimal: ``"40.0 GiB"``, ``"512 B"``.

    Binary units because device memory is built in powers of two, so catalog sizes print
    exactly (80 GiB, not 85.9 GB).
    """
    sign = "-" if n < 0 else ""
    size = float(abs(n))
    if size < 1024:
        return f"{sign}{int(size)} B"
    for prefix in _BINARY_PREFIXES[1:]:
        size /= 1024
        if size < 1024 or prefix == _BINARY_PREFIXES[-1]:
            # 1023.96 GiB would print as "1024.0 GiB"; step up a unit instead.
            if round(size, 1) >= 1024 and prefix != _BINARY_PREFIXES[-1]:
                continue
            return f"{sign}{size:.1f} {prefix}"
    raise AssertionError("unreachable")  # pragma: no cover


def _compact_size(n: int) -> str:
    """``format_size`` without a trailing ``.0``, for one-line summaries ("80 GiB")."""
    text = format_size(n)
    return text.replace(".0 ", " ")


# --------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------

_DEVICE_DEFAULTED = (
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "intra_node_latency",
    "inter_node_latency",
    "devices_per_node",
)


class Cluster(BaseModel):
    """The hardware a plan is searched for: ``num_devices`` of one type in equal nodes.

    Per-cluster link figures default to the device's but can be overridden, because the
    same GPU ships in very different fabrics (an H100 node with 2 NICs instead of 8).
    Construct through ``make_cluster``/``load_cluster`` to get user-facing error messages;
    direct construction validates the same invariants but raises pydantic's ValidationError.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceSpec
    num_devices: int
    devices_per_node: int
    memory_per_device: int
    """Bytes the planner may use per device; defaults to ``device.memory_bytes``."""
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    intra_node_latency: float
    inter_node_latency: float

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_device(cls, data: Any) -> Any:
        """Fill unset figures from the device, so callers only state what differs."""
        if not isinstance(data, dict):
            return data
        device = data.get("device")
        if isinstance(device, dict):
            try:
                device = DeviceSpec.model_validate(device)
            except ValidationError:
                return data  # field validation reports it with the field path
        if not isinstance(device, DeviceSpec):
            return data  # let field validation report the bad device
        filled = dict(data)
        filled["device"] = device
        for field in _DEVICE_DEFAULTED:
            if filled.get(field) is None:
                filled[field] = getattr(device, field)
        if filled.get("memory_per_device") is None:
            filled["memory_per_device"] = device.memory_bytes
        return filled

    @model_validator(mode="after")
    def _check_shape(self) -> Cluster:
        """Nodes must be equal and figures positive: the cost model divides by all of them."""
        if self.num_devices < 1 or self.devices_per_node < 1:
            raise ValueError("num_devices and devices_per_node must be >= 1")
        if self.num_devices % self.devices_per_node != 0:
            raise ValueError(
                f"num_devices {self.num_devices} is not a multiple of devices_per_node "
                f"{self.devices_per_node}"
            )
        if self.memory_per_device <= 0:
            raise ValueError("memory_per_device must be positive")
        for field in _DEVICE_DEFAULTED[:4]:
            _positive_finite(getattr(self, field), field)
        return self

    @property
    def nodes(self) -> int:
        """Number of nodes (every node holds ``devices_per_node`` devices)."""
        return self.num_devices // self.devices_per_node

    def link(self, group_size: int, stride: int) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of a communicator group of ``group_size`` devices
        whose members are ``stride`` apart in device order (devices are numbered node-major).

        The group lies inside one node when ``stride * group_size <= devices_per_node`` and
        ``devices_per_node % (stride * group_size) == 0`` (then every group of this layout
        tiles a node exactly); otherwise at least one group crosses nodes and runs at the
        inter-node figures, through as many NICs at once as it has members in a node (NCCL's
        rings, one per NIC). Bandwidths are achievable ones: the link times the device's
        NCCL efficiency. A group of one never communicates; it gets the intra-node figures
        so costs stay finite.
        Bad arguments are a planner bug, not user input, hence plain ValueError.
        """
        if group_size < 1 or stride < 1:
            raise ValueError(f"group_size and stride must be >= 1, got {group_size}, {stride}")
        if (group_size - 1) * stride >= self.num_devices:
            raise ValueError(
                f"a group of {group_size} with stride {stride} does not fit in "
                f"{self.num_devices} devices"
            )
        span = stride * group_size
        intra = self.intra_node_bandwidth * self.device.intra_node_efficiency
        if group_size == 1 or (span <= self.devices_per_node and self.devices_per_node % span == 0):
            return (intra, self.intra_node_latency)
        # NCCL runs one ring per NIC: a group with k members in a node crosses nodes through
        # their k NICs at once (hierarchical), capped by the intra-node link the rings also use
        members = max(1, self.devices_per_node // stride) if stride < self.devices_per_node else 1
        inter = self.inter_node_bandwidth * self.device.inter_node_efficiency * min(members, group_size)
        return (min(intra, inter), self.inter_node_latency)

    def describe(self) -> str:
        """One line for logs and reports, e.g. ``"128 nodes x 8 h100-80gb (80 GiB)"``."""
        noun = "node" if self.nodes == 1 else "nodes"
        return (
            f"{self.nodes} {noun} x {self.devices_per_node} {self.device.name} "
            f"({_compact_size(self.memory_per_device)})"
        )


MAX_DEVICES = 1_000_000  # the search factors counts and node sizes by trial division: bounded, it stays instant


def _check_count(value: Any, flag: str) -> int:
    """Reject non-integers (including bools and '16' strings), counts below one and above MAX_DEVICES."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{flag} must be a whole number, got {value!r}")
    if value < 1:
        raise InputError(f"{flag} must be at least 1, got {value}")
    if value > MAX_DEVICES:
        raise InputError(f"{flag} {value} is over the limit of {MAX_DEVICES:,} devices")
    return value


def _build_cluster(
    device: str | DeviceSpec,
    num_devices: int,
    devices_per_node: int | None,
    memory_per_device: int | float | str | None,
    overrides: dict[str, float | None],
    devices_flag: str,
    per_node_flag: str,
) -> Cluster:
    """Shared body of make_cluster/load_cluster; the flag names go into error messages so
    that each front end names the option or JSON key the user actually wrote."""
    spec = device if isinstance(device, DeviceSpec) else get_device(device)
    num = _check_count(num_devices, devices_flag)
    per_node = spec.devices_per_node if devices_per_node is None else _check_count(
        devices_per_node, per_node_flag
    )
    if num < per_node:
        per_node = num  # one partial node: e.g. 4 GPUs of an 8-GPU server
    elif num % per_node != 0:
        raise InputError(
            f"{devices_flag} {num} is not a multiple of the node size {per_node} "
            f"(use {per_node_flag})"
        )
    memory = spec.memory_bytes if memory_per_device is None else parse_size(memory_per_device)
    for field, value in overrides.items():
        if value is None:
            continue
        try:
            _positive_finite(value, field)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    try:
        return Cluster(
            device=spec,
            num_devices=num,
            devices_per_node=per_node,
            memory_per_device=memory,
            **overrides,
        )
    except ValidationError as exc:  # pragma: no cover - the checks above should catch all
        raise invalid(exc, "cluster") from None


def make_cluster(
    device: str | DeviceSpec,
    num_devices: int,
    devices_per_node: int | None = None,
    memory_per_device: int | str | None = None,
    *,
    intra_node_bandwidth: float | None = None,
    inter_node_bandwidth: float | None = None,
    intra_node_latency: float | None = None,
    inter_node_latency: float | None = None,
) -> Cluster:
    """Build a validated cluster from command-line style arguments.

    ``device`` is a catalog name (or a DeviceSpec for custom hardware). ``devices_per_node``
    defaults to the device's usual node size; fewer devices than that make one partial node.
    ``memory_per_device`` (bytes or a size string like ``"40GiB"``) caps what the planner may
    use, e.g. to leave room for another job. Every invalid combination raises InputError
    naming the command-line option to fix.
    """
    return _build_cluster(
        device,
        num_devices,
        devices_per_node,
        memory_per_device,
        {
            "intra_node_bandwidth": intra_node_bandwidth,
            "inter_node_bandwidth": inter_node_bandwidth,
            "intra_node_latency": intra_node_latency,
            "inter_node_latency": inter_node_latency,
        },
        devices_flag="--devices",
        per_node_flag="--devices-per-node",
    )


_CLUSTER_KEYS = {
    "device",
    "devices",
    "devices_per_node",
    "memory_per_device",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "intra_node_latency",
    "inter_node_latency",
}


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster description from a JSON file.

    Format::

        {"device": "h100-80gb", "devices": 16, "devices_per_node": 8,
         "memory_per_device": "40GiB", "inter_node_bandwidth": 25e9}

    ``device`` may instead be a full DeviceSpec object for hardware not in the catalog (its
    ``memory_bytes`` may be a size string; ``source`` defaults to the file name). Unknown
    keys are errors rather than ignored, because a misspelt override silently falling back
    to the default would produce a plausible but wrong plan. Every problem raises
    InputError prefixed with the file name.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"cluster file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read cluster file {path}: {exc}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise InputError(f"{path}: invalid JSON: {exc}") from None
    return cluster_from_dict(data, str(path))


def cluster_from_dict(data: Any, origin: str = "cluster") -> Cluster:
    """A cluster from its JSON form (already parsed); problems raise InputError naming `origin`."""
    path = origin
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _CLUSTER_KEYS)
    if unknown:
        raise InputError(
            f"{path}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(_CLUSTER_KEYS))}"
        )
    for required in ("device", "devices"):
        if required not in data:
            raise InputError(f"{path}: missing required key '{required}'")

    try:
        device = _device_from_json(data["device"], path)
        overrides: dict[str, float | None] = {}
        for key in ("intra_node_bandwidth", "inter_node_bandwidth",
                    "intra_node_latency", "inter_node_latency"):
            value = data.get(key)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
                raise InputError(f'"{key}" must be a number, got {value!r}')
            overrides[key] = None if value is None else float(value)
        memory = data.get("memory_per_device")
        if memory is not None and (isinstance(memory, bool)
                                   or not isinstance(memory, (int, float, str))):
            raise InputError(
                f'"memory_per_device" must be a byte count or a size string, got {memory!r}'
            )
        return _build_cluster(
            device,
            data["devices"],
            data.get("devices_per_node"),
            memory,
            overrides,
            devices_flag='"devices"',
            per_node_flag='"devices_per_node"',
        )
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def _reject_constant(name: str) -> float:
    """json accepts NaN/Infinity by default; no hardware figure may be either."""
    raise ValueError(f"{name} is not allowed")


def _device_from_json(value: Any, path: str) -> DeviceSpec:
    """A catalog name, or an inline DeviceSpec object for custom hardware."""
    if isinstance(value, str):
        return get_device(value)
    if not isinstance(value, dict):
        raise InputError(
            f'"device" must be a catalog name or a device object, got {type(value).__name__}'
        )
    fields = dict(value)
    if isinstance(fields.get("memory_bytes"), (str, float)) and not isinstance(
        fields.get("memory_bytes"), bool
    ):
        fields["memory_bytes"] = parse_size(fields["memory_bytes"])
    fields.setdefault("source", f"custom device from {path}")
    try:
        # strict: "16" for an int or true for a number is a mistake in the file, not a value
        return DeviceSpec.model_validate(fields, strict=True)
    except ValidationError as exc:
        raise invalid(exc, "device") from None
