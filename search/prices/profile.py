"""The DeviceProfile: measured costs of one device type, read by the cost model (docs/cost-model.md, docs/cli.md).

`profiler/` produces profiles; `search/` owns the format because its cost model reads it. A
profile holds, for one catalog device:
- ops: forward and backward time (median, min and max over the repeats, sample count) per
  *op signature*, the canonical string of what a device actually computes for one op in one
  configuration: op kind and torch target, the local (sharded) shapes and dtypes of its inputs,
  parameters and output, and the few attributes shapes do not say (causal attention). Labels and
  op names are not part of it, so one signature stands for every layer of a stack and every mesh
  on which the op's local shapes coincide;
- collectives: alpha-beta fits (time = alpha + beta * bytes) per collective kind and group size,
  with the residual and the points measured. `bytes` follows the cost model's convention: the
  size of the tensor as if unsharded on the axis (all_gather: its output, reduce_scatter: its
  input, all_to_all: the whole tensor, of which each rank holds 1/n; send_recv and broadcast: the
  message);
- optimizer: an alpha-beta fit of one AdamW step per precision, over the parameter elements a
  rank updates;
- calibration (optional): factors fitted to measured runs - compute per op kind (and
  "optimizer"), communication per mesh axis name - a synchronisation cost per collective call,
  a framework cost per op and a memory overhead per rank;
- overheads (optional): framework costs the op timings do not see (the optimizer step per
  parameter tensor, DTensor dispatch per tensor-parallel op), timed by profiler.overheads.

The JSON form carries ``format: paretoplan.profile/1``; `load_profile`/`parse_profile` turn every
problem (missing file, corrupt JSON, another format version, bad values) into a one-line
InputError.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from search.errors import InputError, invalid, read_json
from search.models.graph import Op
from search.prices.mesh import Config, Mesh, input_placement, output_placement, param_placement

PROFILE_FORMAT = "paretoplan.profile/1"
# the first four are what every mesh axis needs; send_recv prices pipelines, broadcast ZeRO-1's
# parameter sync (ZeroRedundancyOptimizer broadcasts each updated parameter from its owner)
COLLECTIVE_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv", "broadcast")
CollectiveKind = Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv", "broadcast"]


def _finite_nonneg(value: float, what: str = "value") -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return value


class Stat(BaseModel):
    """A timing over repeats, seconds: the median and the spread (min and max)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    median: float
    lo: float
    hi: float

    @field_validator("median", "lo", "hi")
    @classmethod
    def _check(cls, v: float) -> float:
        return _finite_nonneg(v, "a time")

    @model_validator(mode="after")
    def _ordered(self) -> Stat:
        if not self.lo <= self.median <= self.hi:
            raise ValueError(f"needs lo <= median <= hi, got {self.lo}, {self.median}, {self.hi}")
        return self


class OpEntry(BaseModel):
    """One op signature's measured forward and backward time."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str
    fwd: Stat
    bwd: Stat
    samples: int = Field(ge=1)
    proxy: bool = Field(default=False, description="a stand-in op with the same shapes and memory traffic was timed")


class LinearFit(BaseModel):
    """time = alpha + beta * x, fitted by least squares on relative error; `residual` is the RMS
    relative residual over the points (`sizes`, `times`: the medians measured)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    alpha: float
    beta: float
    residual: float = 0.0
    sizes: list[float] = Field(default_factory=list)
    times: list[float] = Field(default_factory=list)

    @field_validator("alpha", "beta", "residual")
    @classmethod
    def _check(cls, v: float) -> float:
        return _finite_nonneg(v)

    @field_validator("sizes", "times")
    @classmethod
    def _check_points(cls, v: list[float]) -> list[float]:
        for x in v:
            _finite_nonneg(x, "a measured point")
        return v

    @model_validator(mode="after")
    def _same_length(self) -> LinearFit:
        if len(self.sizes) != len(self.times):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.times)} times")
        return self

    def __call__(self, x: float) -> float:
        return self.alpha + self.beta * x


class CollectiveFit(LinearFit):
    kind: CollectiveKind
    group_size: int = Field(ge=2)


class Calibration(BaseModel):
    """Correction factors fitted to measured runs (profiler.calibrate)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    compute: dict[str, float] = Field(default_factory=dict, description="factor per op kind, or '*' for every kind; "
                                      "'optimizer' for the optimizer step, 'dtensor' for tensor parallelism's "
                                      "DTensor dispatch")
    comm: dict[str, float] = Field(default_factory=dict, description="factor per mesh axis name")
    memory_overhead_bytes: int = Field(default=0, description="added to every rank's peak memory")
    sync_s: float = Field(default=0.0, ge=0.0, description="seconds a collective waited on between two computations "
                          "costs beyond its back-to-back time (the ranks reach it apart); added to every such call")
    op_s: float = Field(default=0.0, ge=0.0, description="seconds every op of a step costs beyond its timed kernels "
                        "(module calls, autograd, hooks, the views and copies between ops), forward and backward; "
                        "half of it again when the op is recomputed")
    reports: int = Field(default=0, ge=0, description="how many measured runs the factors were fitted to")
    time_error_before: float | None = None
    time_error_after: float | None = None
    memory_error_before: float | None = None
    memory_error_after: float | None = None

    @field_validator("compute", "comm")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for k, f in v.items():
            if not math.isfinite(f) or f <= 0:
                raise ValueError(f"factor {k!r} must be a positive finite number, got {f!r}")
        return v


class Overheads(BaseModel):
    """Framework costs beside the ops' own compute (profiler.overheads), seconds: the AdamW
    step's cost per parameter tensor (foreach=False), on a plain tensor and on a DTensor, the
    extra cost of one op run under a tensor-parallel style (DTensor dispatch, forward and
    backward, with the conversions of its input and output), and activation checkpointing's
    own cost per recomputed op."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    optimizer_tensor: float = 0.0
    optimizer_dtensor: float = 0.0
    dtensor_op: float = 0.0
    recompute_op: float = Field(default=0.0, description="activation checkpointing's own cost per recomputed op, "
                                "beyond its forward run again")

    @field_validator("optimizer_tensor", "optimizer_dtensor", "dtensor_op", "recompute_op")
    @classmethod
    def _check(cls, v: float) -> float:
        return _finite_nonneg(v, "an overhead")


class HostInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    hostname: str = ""
    platform: str = ""
    processor: str = ""
    cpu_count: int = 0
    threads: int = Field(default=1, ge=1, description="torch threads per process while timing ops")
    torch: str = ""
    accelerator: str | None = None


class ProfiledModel(BaseModel):
    """Which model and cluster shape a run of the profiler covered (for humans and for reuse)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: str
    devices: int
    devices_per_node: int
    global_batch: int
    seq_len: int | None
    precision: str
    signatures: int


class DeviceProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str = PROFILE_FORMAT
    device: str = Field(description="catalog device name (see `paretoplan devices`)")
    backend: Literal["cpu", "cuda"] = "cpu"
    dist_backend: Literal["gloo", "nccl"] = "gloo"
    host: HostInfo = Field(default_factory=HostInfo)
    created: str = ""
    ops: dict[str, OpEntry] = Field(default_factory=dict)
    collectives: list[CollectiveFit] = Field(default_factory=list)
    optimizer: dict[str, LinearFit] = Field(default_factory=dict, description="AdamW step per precision; x = elements")
    overheads: Overheads | None = Field(default=None, description="framework costs per parameter tensor and per "
                                        "tensor-parallel op (profiler.overheads)")
    calibration: Calibration | None = None
    models: list[ProfiledModel] = Field(default_factory=list)
    seconds: float = Field(default=0.0, ge=0.0, description="profiling time spent on this profile, all runs")

    @model_validator(mode="after")
    def _check(self) -> DeviceProfile:
        if self.format != PROFILE_FORMAT:
            raise ValueError(f"unsupported profile format {self.format!r}; expected {PROFILE_FORMAT!r}")
        seen: set[tuple[str, int]] = set()
        for f in self.collectives:
            key = (f.kind, f.group_size)
            if key in seen:
                raise ValueError(f"two fits for {f.kind} over {f.group_size} ranks")
            seen.add(key)
        return self

    def collective(self, kind: str, group_size: int) -> CollectiveFit | None:
        for f in self.collectives:
            if f.kind == kind and f.group_size == group_size:
                return f
        return None

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    def dump(self, path: str | Path) -> None:
        try:
            Path(path).write_text(self.to_json())
        except OSError as e:
            raise InputError(f"cannot write profile {str(path)!r}: {e.strerror or e}") from None


# ---- reading -----------------------------------------------------------------------------------
def load_profile(path: str | Path) -> DeviceProfile:
    """Read a profile file; every problem becomes a one-line InputError naming the file."""
    return parse_profile(read_json(path, "profile"), origin=str(path))


def parse_profile(data: Any, origin: str = "profile") -> DeviceProfile:
    """A DeviceProfile from its JSON form (a dict); InputError on anything else."""
    if isinstance(data, DeviceProfile):
        return data
    if not isinstance(data, dict):
        raise InputError(f"{origin}: not a paretoplan profile (expected a JSON object)")
    fmt = data.get("format")
    if fmt is None:
        raise InputError(f"{origin}: not a paretoplan profile (no 'format' key; expected {PROFILE_FORMAT!r})")
    if fmt != PROFILE_FORMAT:
        raise InputError(f"{origin}: profile format {fmt!r} is not supported; this paretoplan reads "
                         f"{PROFILE_FORMAT!r} (profile the device again)")
    try:
        prof = DeviceProfile.model_validate(data)
    except ValidationError as e:
        raise invalid(e, f"{origin}: invalid profile") from None
    from search.prices.cluster import get_device

    prof.device = get_device(prof.device).name  # unknown: an InputError naming the known ones
    return prof


# ---- op signatures -----------------------------------------------------------------------------
def short_target(target: str) -> str:
    """'aten.gelu.default' -> 'gelu'."""
    parts = target.split(".")
    if len(parts) >= 2 and parts[0] == "aten":
        return parts[1]
    return target or "-"


def value_dtype(dtype: str, precision: str) -> str:
    """The dtype a tensor has when the job runs at `precision`: floats compute in it, integer
    and boolean tensors (ids, targets, masks) keep their own."""
    d = dtype.lower()
    if d.startswith(("int", "uint", "long")):
        return "i32" if d == "int32" else "i64"
    if d == "bool":
        return "bool"
    return precision


def local_shape(shape: tuple[int, ...], dims: tuple[str, ...], placement: tuple[str, ...], mesh: Mesh
                ) -> tuple[int, ...]:
    """The shape one device holds of a tensor in `placement` (Partial and Replicate: all of it)."""
    out = list(shape)
    for p, ax in zip(placement, mesh.axes, strict=True):
        if p.startswith("S:") and ax.size > 1:
            i = dims.index(p[2:])
            out[i] //= ax.size
    return tuple(out)


def is_causal(op: Op) -> bool:
    """Capture counts half the FLOPs for causal attention; that is how the op says it is causal."""
    if op.kind != "attention" or len(op.inputs) < 3:
        return False
    q, k, v = op.inputs[0].shape, op.inputs[1].shape, op.inputs[2].shape
    full = 2.0 * math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1])
    return op.flops < 0.75 * full


def _code(shape: tuple[int, ...], dtype: str) -> str:
    return ("x".join(str(s) for s in shape) or "scalar") + ":" + dtype


def op_signature(op: Op, mesh: Mesh, cfg: Config, precision: str) -> str:
    """The canonical signature of `op` in configuration `cfg` on `mesh` at `precision`:
    kind:target | local inputs | local params | local output | attributes. Equal signatures
    compute the same thing on one device."""
    ins = [_code(local_shape(t.shape, t.dims, input_placement(cfg, t), mesh), value_dtype(t.dtype, precision))
           for t in op.inputs]
    ps = [_code(local_shape(p.shape, p.dims, param_placement(cfg, p.dims), mesh), value_dtype(p.dtype, precision))
          for p in op.params]
    out = _code(local_shape(op.output.shape, op.output.dims, output_placement(cfg, op), mesh),
                value_dtype(op.output.dtype, precision))
    attrs = "causal" if is_causal(op) else "-"
    return f"{op.kind}:{short_target(op.target)}|{','.join(ins)}|{','.join(ps)}|{out}|{attrs}"


# ---- what the cost model reads -----------------------------------------------------------------
class ProfileLookup:
    """A profile as the cost model reads it for one job precision: op compute times by
    signature, collective alpha/beta by kind and group size, the optimizer step, calibration
    factors. It remembers which signatures it found and which fell back to the roofline."""

    def __init__(self, profile: DeviceProfile, precision: str) -> None:
        self.profile = profile
        self.precision = precision
        self._fits: dict[tuple[str, int], CollectiveFit] = {(f.kind, f.group_size): f for f in profile.collectives}
        cal = profile.calibration
        self.compute_factors: dict[str, float] = dict(cal.compute) if cal else {}
        self.comm_factors: dict[str, float] = dict(cal.comm) if cal else {}
        self.memory_overhead = float(cal.memory_overhead_bytes) if cal else 0.0
        self.sync = float(cal.sync_s) if cal else 0.0
        self.op_overhead = float(cal.op_s) if cal else 0.0
        self._sig: dict[tuple, str] = {}
        self.measured: set[str] = set()
        self.missing: set[str] = set()
        self.missing_collectives: set[tuple[str, int]] = set()

    def signature(self, op: Op, mesh: Mesh, cfg: Config) -> str:
        # the shapes are part of the key: one lookup serves the full graph and the pipeline's
        # micro-batch graphs, whose ops share names
        key = (op.name, op.output.shape, tuple(t.shape for t in op.inputs), mesh, cfg)
        sig = self._sig.get(key)
        if sig is None:
            sig = self._sig[key] = op_signature(op, mesh, cfg, self.precision)
        return sig

    def compute(self, op: Op, mesh: Mesh, cfg: Config, roofline_fwd: float) -> tuple[float, float, bool]:
        """(forward, forward + backward, measured) seconds of one op in one configuration;
        the roofline (backward = 2x forward) when the signature was not profiled."""
        sig = self.signature(op, mesh, cfg)
        entry = self.profile.ops.get(sig)
        f = self.compute_factor(op.kind)
        if entry is None:
            self.missing.add(sig)
            return f * roofline_fwd, f * 3.0 * roofline_fwd, False
        self.measured.add(sig)
        return f * entry.fwd.median, f * (entry.fwd.median + entry.bwd.median), True

    def contention(self, ranks_per_host: int) -> float:
        """How much slower a CPU op runs in a job than when the profiler timed it alone: the
        host's ranks share its cores (ranks x threads each over the cores, at least 1). Ops on
        an accelerator have it to themselves; collectives were timed with every rank running."""
        host = self.profile.host
        if host.accelerator is not None or host.cpu_count <= 0:
            return 1.0
        return max(1.0, ranks_per_host * host.threads / host.cpu_count)

    def compute_factor(self, kind: str) -> float:
        """The calibrated factor of an op kind (or 'optimizer'): its own, else the one every kind
        shares ('*'), else 1."""
        return self.compute_factors.get(kind, self.compute_factors.get("*", 1.0))

    def optimizer(self, elements: float, roofline: float, tensors: float = 0.0, dtensor: bool = False
                  ) -> tuple[float, bool]:
        """Seconds of the optimizer step over `elements` parameter elements in `tensors` parameter
        tensors on one rank (`dtensor`: DTensor parameters). With the profile's measured
        overheads, the per-element rate of the fit plus a cost per tensor; without them, the
        fit as it stands (its latency paid once per op)."""
        f = self.compute_factor("optimizer")
        if elements <= 0:
            return 0.0, True
        fit = self.profile.optimizer.get(self.precision)
        if fit is None:
            return f * roofline, False
        ov = self.profile.overheads
        if ov is None:
            return f * fit(elements), True
        per_tensor = ov.optimizer_dtensor if dtensor else ov.optimizer_tensor
        return f * (fit.beta * elements + per_tensor * tensors), True

    def recompute_op(self) -> float:
        """Seconds activation checkpointing adds per recomputed op beyond its forward (calibrated
        with 'dtensor', the other framework overhead); 0 without measured overheads."""
        ov = self.profile.overheads
        return self.compute_factor("dtensor") * ov.recompute_op if ov is not None else 0.0

    def dtensor_op(self) -> float:
        """Seconds one op run under a tensor-parallel style adds (DTensor dispatch, forward and
        backward), with its own calibration factor ('dtensor'); 0 without measured overheads."""
        ov = self.profile.overheads
        return self.compute_factor("dtensor") * ov.dtensor_op if ov is not None else 0.0

    def collective(self, kind: str, group_size: int) -> CollectiveFit | None:
        fit = self._fits.get((kind, group_size))
        if fit is None:
            self.missing_collectives.add((kind, group_size))
        return fit

    def has_collectives(self, group_size: int) -> bool:
        return all((k, group_size) in self._fits for k in COLLECTIVE_KINDS[:4])

    def comm_factor(self, axis_name: str) -> float:
        return self.comm_factors.get(axis_name, 1.0)

    def summary(self) -> dict[str, Any]:
        """What a search used: for the report's stats."""
        return {
            "device": self.profile.device,
            "signatures_measured": len(self.measured),
            "signatures_estimated": len(self.missing),
            "collectives_estimated": sorted(f"{k}/{n}" for k, n in self.missing_collectives),
            "calibrated": self.profile.calibration is not None,
        }


def as_lookup(profile: DeviceProfile | ProfileLookup | dict | None, precision: str) -> ProfileLookup | None:
    if profile is None or isinstance(profile, ProfileLookup):
        return profile
    return ProfileLookup(parse_profile(profile), precision)
