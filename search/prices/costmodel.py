"""Cost model (docs/cost-model.md): time and memory per op configuration and per edge.

Both objectives are sums over ops and edges, which is what makes frontier tracking exact:
- an op in configuration c costs its compute at the device's achievable speed
  (search/prices/compute.py: GEMMs by shape, attention by its kernel, memory-bound ops by
  bandwidth, a launch cost per kernel), the collectives that synchronise its parameters'
  gradients over every axis that splits a dimension the parameter does not carry, as far as
  they outlast the compute they hide behind (the device's `comm_overlap`), and its optimizer
  step; its memory is its share of parameters, gradients and optimizer state plus the
  activations autograd keeps for backward;
- an edge (u -> v) costs the collectives that turn u's output placement into v's input
  placement in the forward pass and v's input-gradient placement back into what u needs in the
  backward pass, and the memory of the redistributed copy when v keeps its input for backward.
The transient workspace is a per-mesh constant (the largest op output under its leanest
configuration, with its gradient), so it shifts the whole frontier and keeps it exact.

Collectives are priced alpha-beta: time = alpha + beta * bytes, with alpha and beta from the
cluster's achievable links.

With a DeviceProfile (search/prices/profile.py), an op's compute is its measured forward + backward at
its local signature and the optimizer step its measured fit, collectives take the profile's fit
for their kind and group size, and calibration adds a compute factor, a sync cost per collective
call, a framework cost per op and a memory overhead per rank; whatever the profile lacks falls
back to the catalog's figures, and the op or edge is flagged `estimated`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from search.models.graph import Op, OpGraph, ParamRef, TensorRef
from search.prices.boundaries import INFEASIBLE, Boundaries, Pair, exit_allowed
from search.prices.cluster import Cluster
from search.prices.compute import gemm_shape, kernel_seconds
from search.prices.mesh import (
    CONTEXT,
    DATA,
    EXPERT,
    EXPERT_LABEL,
    SEQ_LABEL,
    TENSOR,
    Config,
    Mesh,
    context_code,
    input_grad_placement,
    input_placement,
    op_configs,
    output_grad_placement,
    output_placement,
    param_placement,
    shard_factor,
)
from search.prices.profile import DeviceProfile, ProfileLookup, as_lookup

Precision = Literal["fp32", "bf16", "fp16"]


class TrainingJob(BaseModel):
    """What is trained: batch per iteration, sequence length and numeric precision."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    global_batch: int = Field(gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    precision: Precision = "bf16"


@dataclass(frozen=True)
class Bytes:
    """Bytes per element of each kind of state under a precision (Adam optimizer).

    `param`, `grad` and `optimizer` are what kernels and collectives move (time and traffic: the
    compute copy of a weight, a gradient as Megatron-LM reduces it, fp32 master weights with the
    moments). The `held_*` fields are what the executor keeps in memory: under mixed precision
    the parameters stay fp32 and so do their gradients (torch.autocast casts each weight for the
    matmuls that read it; FSDP2's MixedPrecisionPolicy reduces gradients in fp32 into fp32
    shards), AdamW keeps two fp32 moments, and `cast` is the low-precision copy of a weight that
    lives from its first use in the forward to the end of the backward (autocast's weight cache,
    FSDP2's unsharded parameters). Same sum as the compute view for the states (4 + 4 + 8 =
    2 + 2 + 12) plus the 2-byte copy."""

    activation: int
    param: int
    grad: int
    optimizer: int  # Adam's two fp32 moments, plus fp32 master weights under mixed precision
    compute_dtype: str
    held_param: int = 4
    held_grad: int = 4
    held_optimizer: int = 8
    cast: int = 0


PRECISION_BYTES: dict[str, Bytes] = {
    "fp32": Bytes(activation=4, param=4, grad=4, optimizer=8, compute_dtype="fp32"),
    "bf16": Bytes(activation=2, param=2, grad=2, optimizer=12, compute_dtype="bf16", cast=2),
    "fp16": Bytes(activation=2, param=2, grad=2, optimizer=12, compute_dtype="fp16", cast=2),
}
# Op kinds torch.autocast runs in the low precision: it casts their inputs (each call its own
# copy of an fp32 activation; weights once, cached until autocast exits) and they return bf16
CAST_KINDS = ("linear", "matmul", "conv", "attention")
# Op kinds whose output is fp32 whatever their input under autocast: the fp32 embedding table,
# norms and softmax (autocast's fp32 list on CUDA), the loss
FP32_KINDS = ("embedding", "norm", "softmax", "loss")

BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
# Axes that split the batch (or, on a context axis, the sequence): a parameter replicated there has
# its gradient synchronised by DDP / FSDP over them (an expert axis splits the experts' own
# weights, which need none there); ZeRO shards over all of them (torchtitan's dp_shard x cp)
BATCH_ROLES = (DATA, EXPERT, CONTEXT)
# Cross entropy keeps its log-probabilities (one copy of its input, the logits) for backward; its
# backward, the step's first, while every activation is still kept, makes the gradient of the
# log-probabilities and of the logits: two more. For a language model that moment is the peak,
# so the three copies are priced with the loss's activations, at its input's local shape (full
# logits wherever the configuration leaves the vocabulary whole, as under tensor parallelism).
# All three are fp32 whatever the precision: every model's loss upcasts the logits first
# (`F.cross_entropy(logits.float(), ...)`, as transformers' loss does), 4 bytes per token and
# vocabulary entry each (GPT-2's 50,257 entries: 201 KB per token per copy).
LOSS_COPIES = 3
LOSS_BYTES = 4

# Collective kinds, indices into the coefficient tables below.
NONE, ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL = range(5)
COLLECTIVE_NAMES = ("none", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def forward_collective(src: str, dst: str) -> int:
    """Which collective turns a tensor in placement `src` into `dst` on one axis."""
    if src == dst:
        return NONE
    if dst == "R":
        return ALL_REDUCE if src == "P" else ALL_GATHER
    if dst == "P":
        return NONE  # R -> P is a local zeroing; S -> P never arises from the rules in mesh.py
    # dst is a shard
    if src == "R":
        return NONE  # local slice
    if src == "P":
        return REDUCE_SCATTER
    return ALL_TO_ALL


@dataclass
class OpCosts:
    configs: list[Config]
    time: np.ndarray          # [C] seconds per iteration
    mem: np.ndarray           # [C] bytes per device
    parts: np.ndarray         # [C, 4] params, grads, optimizer, activations
    comm: np.ndarray          # [C, n_axes] bytes communicated per device per axis
    time_rc: np.ndarray       # [C] the same inside a recomputed block
    mem_rc: np.ndarray        # [C]
    parts_rc: np.ndarray      # [C, 4]
    estimated: bool = True    # priced from the roofline, not a measured profile
    step: np.ndarray | None = None  # [C] the part of `time` paid once per iteration however many
    #                                 micro-batches run (gradient synchronisation, optimizer step)


@dataclass
class EdgeCosts:
    src: str
    dst: str
    time: np.ndarray          # [Cu, Cv]
    mem: np.ndarray           # [Cu, Cv] activation bytes
    comm: np.ndarray          # [Cu, Cv, n_axes]
    estimated: bool = True    # collectives priced from the cluster's links, not a measured profile
    time_rc: np.ndarray | None = None  # [Cu, Cv] when the consumer's layer is recomputed: its forward
    #                                    collectives run again in the recomputation (None: as `time`)

    @property
    def recomputed_time(self) -> np.ndarray:
        return self.time if self.time_rc is None else self.time_rc


def recomputed_mem(mem: np.ndarray) -> np.ndarray:
    """An edge's memory inside a recomputed block: no kept copy, but an INFEASIBLE pair stays so."""
    return np.where(mem >= INFEASIBLE, mem, 0.0)


def add_edges(a: EdgeCosts | None, b: EdgeCosts) -> EdgeCosts:
    """Two tables over the same pair of ops as one (an edge and a pair constraint between them)."""
    if a is None:
        return b
    time_rc = None if a.time_rc is None and b.time_rc is None else a.recomputed_time + b.recomputed_time
    return EdgeCosts(src=a.src, dst=a.dst, time=a.time + b.time, mem=a.mem + b.mem, comm=a.comm + b.comm,
                     estimated=a.estimated, time_rc=time_rc)


@dataclass(frozen=True)
class ParamTerms:
    """What one op configuration costs that reads neither shapes nor FLOPs (`CostModel._param_terms`):
    its shard factors and its parameters' sums, the same at every micro-batch count."""

    shards: int                       # product of the axes that split the op (its FLOPs' divisor)
    out_shards: int                   # the output's shard factor
    in_shards: tuple[int, ...]        # each input's
    col_shards: int                   # the output's last dimension's
    param_moved: tuple[float, ...]    # each parameter's local bytes read, in the op's order
    t_sync: float                     # per micro-batch gradient collectives
    t_once: float                     # once an iteration (after the last micro-batch)
    t_gather: float                   # ZeRO-3's forward all-gather, per micro-batch
    t_after: float                    # after the step
    held: tuple[float, float, float]  # parameters, gradients, optimizer state held per device
    comm: np.ndarray                  # [n_axes] bytes of those collectives (read, never written)


# `CostModel._compute_terms`: per configuration (each input's local elements, forward seconds,
# backward seconds), and the saved and kept activation bytes per configuration (read, never written)
_ComputeTerms = tuple[list[tuple[list[float], float, float]], np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ReadLayout:
    """One tensor an edge reads, as `CostModel._edge_layout` finds it: per axis it pays
    collectives on, (axis, per producer configuration the product of the other axes sharding
    the tensor, (forward, backward) as (collective or not, alpha, beta, traffic per byte) per
    configuration pair), the pairs that keep a converted copy, and the consumer's shard factors."""

    axes: tuple[tuple[int, tuple[int, ...], tuple[tuple[np.ndarray, ...], ...]], ...]
    changed: np.ndarray       # [Cu, Cv] bool
    in_shards: tuple[int, ...]


@dataclass
class EdgeLayout:
    """An edge's placement logic on one mesh, the same at every micro-batch count (its arrays
    are read, never written)."""

    reads: tuple[ReadLayout, ...]
    blocked: np.ndarray       # [Cu, Cv] bool: no module boundary converts between the two
    keeps: bool               # the edge carries the conversion and a reader keeps its input
    free: EdgeCosts | None = None  # the table, once priced, of an edge that pays no collective


class CostModel:
    """Prices ops and edges of one graph for one cluster and job, on any mesh."""

    # what reads neither shapes nor FLOPs (shared by the cost models made `like` one another)
    profile: ProfileLookup | None
    contention: float
    bounds: Boundaries
    _coef: dict[tuple[Mesh, int], tuple[np.ndarray, np.ndarray]]
    _unit_share: dict[str, float]
    _unit_share_ep: dict[str, float]
    _grad_bytes: float
    _output_saved: dict[str, bool]
    _held: dict[str, float]
    _cast_params: set[str]
    _shared_memos: dict[str, dict]

    def __init__(self, graph: OpGraph, cluster: Cluster, job: TrainingJob,
                 profile: DeviceProfile | ProfileLookup | dict | None = None,
                 bounds: Boundaries | None = None, like: CostModel | None = None) -> None:
        """`bounds`: the Boundaries of a graph with the same ops, modules and parameters as this one
        (a micro-batch graph's full-batch graph: only shapes and FLOPs differ, and Boundaries reads
        neither but in `ambiguous_entry`, which is handed this graph to read its shapes from),
        shared instead of found again. `like`: a cost model of such a graph (another
        micro-batch count's) for the same cluster, precision and profile: what it holds that reads
        neither shapes nor FLOPs is taken from it, its Boundaries included, and its memos of the
        parts of op and edge tables that read neither (`_param_terms`, `_edge_layout`) are shared,
        so the pipeline search finds each once for every micro-batch count."""
        self.graph = graph
        self.cluster = cluster
        self.job = job
        self.bytes = PRECISION_BYTES[job.precision]
        self.device = cluster.device
        self.peak = cluster.device.peak(self.bytes.compute_dtype)
        self.mem_bw = cluster.device.memory_bandwidth * cluster.device.memory_efficiency
        if like is not None:
            assert like.cluster == cluster and like.job.precision == job.precision, "`like` prices another cluster"
            self.profile, self.contention, self.bounds = like.profile, like.contention, like.bounds
            self._coef = like._coef
            self._unit_share, self._unit_share_ep = like._unit_share, like._unit_share_ep
            self._grad_bytes, self._output_saved = like._grad_bytes, like._output_saved
            self._held, self._cast_params = like._held, like._cast_params
            self._dtypes: dict[str, int] = like._dtypes
            self._shared_memos = like._shared_memos
            # read by name only, and the names are the same: walks of every op, made once
            self.__dict__["_param_readers"], self.__dict__["_layer_of"] = like._param_readers, like._layer_of
            return
        self.profile = as_lookup(profile, job.precision)
        self.contention = self.profile.contention(cluster.devices_per_node) if self.profile is not None else 1.0
        self._coef = {}
        consumers = graph.consumers()
        self.bounds = bounds if bounds is not None else Boundaries.of(graph)
        self._unit_share = sync_unit_shares(graph)
        self._unit_share_ep = sync_unit_shares(graph, experts_apart=True)
        self._grad_bytes = graph.param_count() * self.bytes.grad  # what DDP's buckets hold
        self._output_saved = {
            op.name: op.saves in ("output", "attention")
            or any(graph.op(c).saves in ("inputs", "attention") for c, _ in consumers[op.name])
            for op in graph.ops
        }
        self._held = autocast_held(graph) if self.bytes.cast else {}
        self._dtypes = autocast_dtypes(graph) if self.bytes.cast else {}
        # weights autocast casts (each once, cached): those an op of a CAST_KINDS kind reads
        self._cast_params = {p.name for op in graph.ops if op.kind in CAST_KINDS for p in op.params}
        self._shared_memos = {"param_terms": {}, "param_terms_alike": {}, "param_signatures": {}, "edge_layout": {},
                              "edge_logic": {}}

    # ---- element sizes ----------------------------------------------------------------------
    def esize(self, t: TensorRef) -> int:
        if t.dtype.startswith(("int", "uint", "bool", "long")):
            return 8 if t.dtype in ("int64", "long") else (1 if t.dtype == "bool" else 4)
        return self.bytes.activation

    # ---- collectives ------------------------------------------------------------------------
    def link(self, mesh: Mesh, axis: int) -> tuple[float, float]:
        ax = mesh.axes[axis]
        return self.cluster.link(ax.size, ax.stride)

    def collective_coefficients(self, mesh: Mesh, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha[kind], beta[kind]) on one axis; time = alpha + beta * bytes, where bytes is the
        size of the tensor as if unsharded on this axis (all_to_all moves 1/n of it). Found once
        per (mesh, axis) - the op and edge tables ask per parameter and per edge - and read,
        never written, by the callers."""
        hit = self._coef.get((mesh, axis))
        if hit is not None:
            return hit
        n = mesh.axes[axis].size
        bw, lat = self.link(mesh, axis)
        steps = math.ceil(math.log2(n)) if n > 1 else 0
        frac = (n - 1) / n if n > 1 else 0.0
        alpha = np.array([0.0, lat * steps, lat * steps, 2 * lat * steps, lat * steps])
        beta = np.array([0.0, frac / bw, frac / bw, 2 * frac / bw, frac / n / bw])
        if self.profile is not None:
            return self._profiled_coefficients(self.profile, mesh, axis, alpha, beta)
        self._coef[(mesh, axis)] = (alpha, beta)
        return alpha, beta

    def _profiled_coefficients(self, profile: ProfileLookup, mesh: Mesh, axis: int, alpha: np.ndarray,
                               beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The profile's fit for each kind at this group size (the link figures where it has
        none), scaled by the axis's calibration factor."""
        key = (mesh, axis)
        if key not in self._coef:
            ax = mesh.axes[axis]
            if ax.size > 1:
                for kind in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL):
                    fit = profile.collective(COLLECTIVE_NAMES[kind], ax.size)
                    if fit is not None:
                        alpha[kind], beta[kind] = fit.alpha, fit.beta
            f = profile.comm_factor(ax.name)
            # a collective waited on between two computations also pays the calibrated sync cost
            sync = np.where(np.arange(len(alpha)) != NONE, profile.sync, 0.0) if ax.size > 1 else 0.0
            self._coef[key] = (alpha * f + sync, beta * f)
        return self._coef[key]

    def _comm_measured(self, mesh: Mesh) -> bool:
        """Every axis that communicates has measured fits of every collective kind."""
        return self.profile is not None and all(self.profile.has_collectives(ax.size) for ax in mesh.axes
                                                if ax.size > 1)

    def bucketed_time(self, mesh: Mesh, axis: int, kind: int, nbytes: float, share: float | None = None) -> float:
        """A gradient (or ZeRO parameter) collective that fuses many parameters into one call: each
        parameter pays the latency in proportion to its `share` of the call (additive, so
        frontiers stay exact). FSDP2 (fully_shard, and replicate for ZeRO-0) issues one collective
        per wrapped unit - each block layer and the root - whatever its size: `share` is the
        parameter's share of its unit's elements. Without `share`, DDP's buckets: its share of the
        model's gradients times the number of 25 MiB buckets they fill."""
        if kind == NONE or mesh.axes[axis].size == 1:
            return 0.0
        alpha, beta = self.collective_coefficients(mesh, axis)
        if share is None:  # DDP's buckets: the last one, however small, is a call of its own
            total = self._grad_bytes
            share = nbytes / total * math.ceil(total / BUCKET_BYTES) if total > 0 else min(1.0, nbytes / BUCKET_BYTES)
        return float(alpha[kind] * share + beta[kind] * nbytes)

    def broadcast_time(self, mesh: Mesh, axis: int, nbytes: float) -> float:
        """One of ZeRO-1's parameter broadcasts of `nbytes` on an axis: the profile's fit for the
        axis size when it has one, else priced as an all-gather of the message. ZeroRedundancy-
        Optimizer issues them all asynchronously and waits once, back to back as the profiler
        times them, so the axis's calibration factor - what a collective waited on between two
        computations costs beyond its back-to-back time - does not apply."""
        ax = mesh.axes[axis]
        if ax.size == 1:
            return 0.0
        if self.profile is not None:
            fit = self.profile.collective("broadcast", ax.size)
            if fit is not None:
                return fit(nbytes)
        return self.collective_time(mesh, axis, ALL_GATHER, nbytes)

    def collective_time(self, mesh: Mesh, axis: int, kind: int, nbytes: float) -> float:
        if kind == NONE or mesh.axes[axis].size == 1:
            return 0.0
        alpha, beta = self.collective_coefficients(mesh, axis)
        return float(alpha[kind] + beta[kind] * nbytes)

    def p2p_coefficients(self, stages: int, stride: int) -> tuple[float, float]:
        """(alpha, beta) of one point-to-point transfer between neighbouring pipeline stages
        `stride` devices apart: the profile's send/recv fit (scaled by the 'pp' calibration
        factor) when it has one, else the cluster's link (latency, 1 / bandwidth)."""
        bw, lat = self.cluster.link(stages, stride)
        if self.profile is not None:
            fit = self.profile.collective("send_recv", 2)
            f = self.profile.comm_factor("pp")
            if fit is not None:
                return fit.alpha * f + self.profile.sync, fit.beta * f
            return lat * f + self.profile.sync, f / bw
        return lat, 1.0 / bw

    # ---- ops --------------------------------------------------------------------------------
    def op_costs(self, op: Op, mesh: Mesh, zero: int = 0, checkpoint: bool = False) -> OpCosts:
        """Costs of every configuration of `op` on `mesh`, under ZeRO stage `zero` (0-3): the
        states of a parameter are sharded over its data-parallel group (the axes that split
        data but not the parameter) - optimizer states from stage 1, gradients from 2, the
        parameters themselves from 3, which then all-gathers them in forward and backward.
        The `_rc` arrays are the same op inside a recomputed block: its forward runs twice and
        it keeps no activations - except the op whose output is the block's output
        (`checkpoint`): that output is the next block's input, kept to recompute from."""
        zero = effective_zero(op, mesh, zero)
        # priced once per (op, mesh, effective ZeRO stage, checkpoint): the searches ask for every
        # ZeRO stage of a mesh (1 and 2 are one table on a tensor-parallel mesh) and the pipeline
        # search for each stage sub-mesh per shape. Keyed by the op's identity, the op kept alive in
        # the entry; the tables are read, never written, by their users (as `edge_costs`'s).
        memo: dict[tuple[int, Mesh, int, bool], tuple[Op, OpCosts]] = self.__dict__.setdefault("_op_memo", {})
        key = (id(op), mesh, zero, checkpoint)
        hit = memo.get(key)
        if hit is not None and hit[0] is op:
            return hit[1]
        oc = self._alike_op_costs(op, mesh, zero, checkpoint)
        memo[key] = (op, oc)
        return oc

    def _alike_op_costs(self, op: Op, mesh: Mesh, zero: int, checkpoint: bool) -> OpCosts:
        """`_op_costs`, priced once per (pricing signature, mesh, ZeRO stage, checkpoint,
        configurations): many ops price alike (the layers of a stack mirror their template, an
        encoder-decoder's layers one another), and two ops whose signatures are equal read the
        same values everywhere `_op_costs` looks. They share the arrays (read, never written);
        each op's table names its own configurations, which may spell its labels otherwise."""
        memo: dict[tuple, OpCosts] = self.__dict__.setdefault("_alike_memo", {})
        sig, rename = self._pricing_signature(op)
        cfgs = op_configs(op, mesh, self.graph.batch_label)
        renamed = tuple(tuple(lab if lab is None else rename.get(lab, lab) for lab in cfg) for cfg in cfgs)
        key = (sig, mesh, zero, checkpoint, renamed)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._op_costs(op, mesh, zero, checkpoint, alike=(sig, mesh, checkpoint, renamed), cfgs=cfgs)
        if hit.configs == cfgs:
            return hit
        # the same arrays under this op's own labels: a shallow copy (as copy.copy makes it, at a
        # fifth of its cost: the pipeline search makes tens of thousands)
        own = OpCosts.__new__(OpCosts)
        own.__dict__.update(hit.__dict__)
        own.configs = cfgs
        return own

    def _pricing_signature(self, op: Op) -> tuple[int, dict[str, int]]:
        """Everything `_op_costs` (and what it calls: `_param_terms`, `_saved_bytes`,
        `_ring_attention`, `_expert_counts`, `op_configs`, the profile's lookups) reads of `op`,
        with the values the graph-wide analyses hold under its name (and its parameters') in
        place of the names, and its dimension labels renamed (see `_label_renaming`): equal
        signatures price alike on every mesh. As a number (each distinct signature's, so the
        table memo hashes an int, not the nested tuple), with the renaming; found once per op,
        keyed by its identity, the op kept alive in the entry."""
        memo: dict[int, tuple[Op, int, dict[str, int]]] = self.__dict__.setdefault("_signature_memo", {})
        hit = memo.get(id(op))
        if hit is not None and hit[0] is op:
            return hit[1], hit[2]
        numbers: dict[tuple, int] = self.__dict__.setdefault("_signature_numbers", {})
        rename = self._label_renaming(op)
        sig = numbers.setdefault(self._make_pricing_signature(op, rename), len(numbers))
        memo[id(op)] = (op, sig, rename)
        return sig, rename

    def _label_renaming(self, op: Op) -> dict[str, int]:
        """The op's dimension labels numbered in order of first appearance (splittable, output,
        inputs, parameters), but for the labels the cost model names (the batch, the sequence, the
        experts): every other label is only compared with the op's own (a configuration's label
        in a tensor's dims, one placement with another), so two ops alike but for a bijection of
        such labels (capture names them per op: 'rsqrt_26/d2') price alike."""
        named = (self.graph.batch_label, SEQ_LABEL, EXPERT_LABEL)
        rename: dict[str, int] = {}
        every = (op.splittable, op.output.dims, *(t.dims for t in op.inputs), *(p.dims for p in op.params))
        for dims in every:
            for lab in dims:
                if lab not in named and lab not in rename:
                    rename[lab] = len(rename)
        return rename

    def _make_pricing_signature(self, op: Op, rename: dict[str, int]) -> tuple:
        """`_pricing_signature` found, labels renamed by `rename`."""
        def dims(ds: tuple[str, ...]) -> tuple[str | int, ...]:
            return tuple(rename.get(d, d) for d in ds)

        out = op.output
        # `_saved_bytes` reads whether an input is a graph input, and for attention how large its
        # producer made it (grouped-query K/V repeated over the query heads)
        inputs = tuple((t.shape, dims(t.dims), t.dtype, t.source is None,
                        self.graph.op(t.source).output.numel if op.saves == "attention" and t.source is not None
                        else None)
                       for t in op.inputs)
        # `_priced_param_terms` reads a parameter's name only through these three lookups
        params = tuple((p.shape, dims(p.dims), p.dtype, p.owner, p.name in self._cast_params,
                        self._unit_share.get(p.name), self._unit_share_ep.get(p.name))
                       for p in op.params)
        graph_wide = (self._dtypes.get(op.name), self._held.get(op.name), self._output_saved[op.name])
        return (op.kind, op.target, op.flops, op.saves, op.workspace, dims(op.splittable),
                (out.shape, dims(out.dims), out.dtype), inputs, params, graph_wide)

    def _op_costs(self, op: Op, mesh: Mesh, zero: int, checkpoint: bool, alike: tuple | None = None,
                  cfgs: list[Config] | None = None) -> OpCosts:
        """`op_costs` priced, ZeRO-1 on a tensor-parallel mesh already read as ZeRO-2. `alike`: the
        op's key among the ops that price alike but for the ZeRO stage (`_alike_op_costs`'s, the
        stage left out), under which the parts of the table no stage changes (`_compute_terms`)
        are found once for every stage; None: found for this table alone. `cfgs`: the op's
        `op_configs` on `mesh`, where the caller has them."""
        if cfgs is None:
            cfgs = op_configs(op, mesh, self.graph.batch_label)
        n_axes = len(mesh.axes)
        C = len(cfgs)
        time = np.zeros(C)
        fwd = np.zeros(C)
        step = np.zeros(C)
        parts = np.zeros((C, 4))
        comm = np.zeros((C, n_axes))
        b = self.bytes
        measured, comm_ok = self.profile is not None, self._comm_measured(mesh)
        # recomputing an op also pays the checkpoint's own work (profile; host contention as ops)
        rc_extra = self.profile.recompute_op() * self.contention if self.profile is not None else 0.0
        # FSDP2 (ZeRO 0, 2, 3) makes every parameter a DTensor; ZeRO-1's DDP keeps plain tensors
        # an expert axis is a data axis to every parameter it does not split (search/prices/mesh.py)
        data_parallel = any(ax.role in BATCH_ROLES and ax.size > 1 for ax in mesh.axes)
        # the executor's mixed precision: FSDP2's MixedPrecisionPolicy where FSDP2 (or its
        # replicate) runs the data axes - every parameter cast, activations all low precision -
        # and torch.autocast otherwise (worker/executor.py)
        fsdp_cast = bool(b.cast) and data_parallel and zero != 1
        autocast = bool(b.cast) and not fsdp_cast
        r_opt = math.prod(ax.size for ax in mesh.axes if ax.role in BATCH_ROLES)
        terms = self._param_terms(op, mesh, zero, cfgs, None if alike is None else alike[3])
        # the parts no ZeRO stage changes, shared by the stages of one (op, mesh) alike
        ckey = None if alike is None else (alike, autocast)
        memo: dict[tuple, _ComputeTerms] = self.__dict__.setdefault("_compute_memo", {})
        compute = memo.get(ckey) if ckey is not None else None
        if compute is None:
            compute = self._compute_terms(op, cfgs, terms, autocast, checkpoint, mesh)
            if ckey is not None:
                memo[ckey] = compute
        per_cfg, saved, kept = compute
        for ci, cfg in enumerate(cfgs):
            pt = terms[ci]
            in_locals, t_fwd, t_bwd = per_cfg[ci]
            t_sync, t_once, t_gather, t_after = pt.t_sync, pt.t_once, pt.t_gather, pt.t_after
            parts[ci, :3] = pt.held
            comm[ci] = pt.comm
            updated = parts[ci, 2] / b.held_optimizer  # parameters this rank's optimizer step updates
            t_opt = updated * 2 * (b.param + b.grad + b.optimizer) / self.mem_bw
            t_fb = t_fwd + t_bwd
            if self.profile is not None:  # measured forward and forward + backward, optimizer step, calibrated
                m_fwd, m_fb, ok = self.profile.compute(op, mesh, cfg, t_fwd)
                if ok:
                    # ring attention runs the measured local block (local queries against one
                    # rank's keys) once per rank of each context axis splitting it
                    ring = ring_ways(op, cfg, mesh)
                    t_fwd, t_fb = m_fwd * ring, m_fb * ring
                elif t_fwd > 0:  # not profiled: the catalog's figure, with the op kind's calibration
                    f = m_fwd / t_fwd
                    t_fwd, t_fb = f * t_fwd, f * t_fb
                styled = runs_on_dtensor(op, cfg, mesh)
                if styled:  # DTensor dispatch of an op under a tensor-parallel style, half of it forward
                    extra = self.profile.dtensor_op()
                    t_fwd, t_fb = t_fwd + extra / 2, t_fb + extra
                tensors = sum(1 for p in op.params if p.owner) / (r_opt if zero == 1 else 1)
                t_opt, ok_opt = self.profile.optimizer(updated, t_opt, tensors,
                                                       dtensor=styled or (data_parallel and zero != 1))
                if ok:  # timed alone, run beside the host's other ranks
                    t_fwd, t_fb = t_fwd * self.contention, t_fb * self.contention
                # the calibrated framework cost of running the op in a step, half of it forward
                t_fwd, t_fb = t_fwd + self.profile.op_overhead / 2, t_fb + self.profile.op_overhead
                if ok_opt:
                    t_opt *= self.contention
                measured &= ok and ok_opt and (t_sync + t_once + t_gather + t_after == 0.0 or comm_ok)
            # DDP's bucketed all-reduce and FSDP's reduce-scatter (and re-gather) run while backward
            # computes, FSDP2's prefetched all-gather while the forward does: only what outlasts
            # this op's own compute is exposed (per op, so still a sum), as far as the device
            # overlaps at all (NCCL on its own streams: fully; gloo on the cores computing: not)
            hide = self.device.comm_overlap
            if op.kind == "attention":  # queries split over a context axis: K/V travel the ring
                t_ring_f, t_ring_b = self._ring_attention(op, cfg, mesh, in_locals, t_fwd, t_fb - t_fwd, comm[ci])
                t_fwd, t_fb = t_fwd + t_ring_f, t_fb + t_ring_f + t_ring_b
            if op.kind == "dispatch":  # before the tokens, their per-expert counts cross each expert axis
                t_counts = self._expert_counts(op, mesh, comm[ci])
                t_fwd, t_fb = t_fwd + t_counts, t_fb + t_counts
            # Under gradient accumulation or a pipeline (evaluate.weigh_op) everything but `step`
            # repeats per micro-batch: the per-micro-batch syncs hide first, the once-an-iteration
            # sync behind what backward time they leave (together: max(0, a + b - window))
            window = hide * (t_fb - t_fwd)
            per_mb = max(0.0, t_sync - window) + max(0.0, t_gather - hide * t_fwd)
            once = max(0.0, t_once - max(0.0, window - t_sync)) + t_after
            time[ci] = t_fb + per_mb + once + t_opt
            step[ci] = once + t_opt
            fwd[ci] = t_fwd + rc_extra
        parts[:, 3] = saved
        parts_rc = parts.copy()
        parts_rc[:, 3] = kept
        return OpCosts(configs=cfgs, time=time, mem=parts.sum(axis=1), parts=parts, comm=comm,
                       time_rc=time + fwd, mem_rc=parts_rc.sum(axis=1), parts_rc=parts_rc, step=step,
                       estimated=not measured)

    def _compute_terms(self, op: Op, cfgs: list[Config], terms: list[ParamTerms], autocast: bool, checkpoint: bool,
                       mesh: Mesh) -> _ComputeTerms:
        """The parts of `_op_costs` the ZeRO stage does not change but through the mixed precision
        (`autocast`): per configuration each input's local elements and the kernels' forward and
        backward seconds; the activation bytes saved for backward, and (under `checkpoint`) the
        output's bytes kept for the next layer's recomputation, per configuration. `terms`: the
        op's `_param_terms` under any ZeRO stage (their shard factors and parameters' local
        bytes are the same under all of them)."""
        per_cfg: list[tuple[list[float], float, float]] = []
        saved = np.zeros(len(cfgs))
        kept = np.zeros(len(cfgs))
        # what every configuration reads alike, found once (the same values, summed as before)
        out_numel = op.output.numel
        out_size = self.esize(op.output)
        in_numels = [t.numel for t in op.inputs]
        in_sizes = [self.esize(t) for t in op.inputs]
        for ci, (cfg, pt) in enumerate(zip(cfgs, terms, strict=True)):
            out_local = out_numel / pt.out_shards
            in_locals = [n / f for n, f in zip(in_numels, pt.in_shards, strict=True)]
            moved = out_local * out_size + sum(n * e for n, e in zip(in_locals, in_sizes, strict=True))
            for x in pt.param_moved:  # each parameter's local bytes, read in the order priced
                moved += x
            cols = op.output.shape[-1] / pt.col_shards if op.output.shape else 1.0
            rows, cols = gemm_shape(out_local, cols)
            moved += 2.0 * op.workspace * out_local * 4.0  # a scan's states: written, then read back
            t_fwd, t_bwd = kernel_seconds(op.kind, op.flops / pt.shards, moved, rows, cols, self.device, self.peak)
            saved[ci] = self._saved_bytes(op, cfg, mesh, out_local, in_locals, autocast)
            if checkpoint:
                # the next layer's checkpoint holds this output as its input, whether or not a
                # consumer's backward would save it (HF's RMSNorm reads it through a cast); what
                # the op itself saves for its backward is recomputed
                kept[ci] = out_local * (self._dtypes[op.name] if autocast else out_size)
            per_cfg.append((in_locals, t_fwd, t_bwd))
        return per_cfg, saved, kept

    def _param_terms(self, op: Op, mesh: Mesh, zero: int, cfgs: list[Config],
                     renamed: tuple[tuple[str | int | None, ...], ...] | None = None) -> list[ParamTerms]:
        """Per configuration, the parts of `_op_costs` that read neither shapes nor FLOPs: the
        shard factors, and everything its parameters cost (the same at every micro-batch count).
        Found once per (what they read of the op, mesh, ZeRO stage, configurations) and shared by
        every cost model made `like` this one: with `renamed` (the configurations with the op's
        labels renamed as `_pricing_signature` renames them), once for every op alike under that
        renaming (`_param_signature`: the layers of a stack, and ops alike within one); without,
        once per op name."""
        if renamed is not None:
            key: tuple = (self._param_signature(op), mesh, zero, renamed)
            memo: dict[tuple, list[ParamTerms]] = self._shared_memos["param_terms_alike"]
        else:
            key = (op.name, op.output.dims, tuple(t.dims for t in op.inputs),
                   tuple((p.name, p.numel, p.dims, p.owner) for p in op.params), mesh, zero, tuple(cfgs))
            memo = self._shared_memos["param_terms"]
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = [self._priced_param_terms(op, mesh, zero, cfg) for cfg in cfgs]
        return hit

    def _param_signature(self, op: Op) -> int:
        """Everything `_priced_param_terms` reads of `op` (its output's and inputs' dimension
        labels, each parameter's size, labels and ownership, and the values the graph-wide
        analyses hold under its name), labels renamed as `_pricing_signature` renames them: no
        shapes, so equal at every micro-batch count. As a number, shared by the cost models made
        `like` one another; found once per op, keyed by its identity, the op kept alive in the
        entry."""
        memo: dict[int, tuple[Op, int]] = self.__dict__.setdefault("_param_sig_memo", {})
        hit = memo.get(id(op))
        if hit is not None and hit[0] is op:
            return hit[1]
        rename = self._pricing_signature(op)[1]

        def dims(ds: tuple[str, ...]) -> tuple[str | int, ...]:
            return tuple(rename.get(d, d) for d in ds)

        sig = (dims(op.output.dims), tuple(dims(t.dims) for t in op.inputs),
               tuple((p.numel, dims(p.dims), p.owner, p.name in self._cast_params, self._unit_share.get(p.name),
                      self._unit_share_ep.get(p.name)) for p in op.params))
        numbers: dict[tuple, int] = self._shared_memos["param_signatures"]
        number = numbers.setdefault(sig, len(numbers))
        memo[id(op)] = (op, number)
        return number

    def _priced_param_terms(self, op: Op, mesh: Mesh, zero: int, cfg: Config) -> ParamTerms:
        """`_param_terms` of one configuration, summed in the order `_op_costs` always has."""
        b = self.bytes
        data_parallel = any(ax.role in BATCH_ROLES and ax.size > 1 for ax in mesh.axes)
        fsdp_cast = bool(b.cast) and data_parallel and zero != 1
        autocast = bool(b.cast) and not fsdp_cast
        expert_axis = any(ax.role == EXPERT and ax.size > 1 for ax in mesh.axes)
        comm = np.zeros(len(mesh.axes))
        held = [0.0, 0.0, 0.0]
        moved: list[float] = []
        # backward's collectives (per micro-batch: tensor-axis partial gradients, ZeRO-2/3's
        # reduce-scatter; once an iteration: DDP's all-reduce after the last micro-batch),
        # ZeRO-3's forward all-gather (per micro-batch), and what follows the step (once)
        t_sync = t_once = t_gather = t_after = 0.0
        for p in op.params:
            local = p.numel / shard_factor(param_placement(cfg, p.dims), mesh)
            moved.append(local * b.param)
            if not p.owner:
                continue
            # a weight replicated on an axis whose split label reaches the output (the batch on
            # a data axis, the sequence of a sequence-parallel norm) gets a partial gradient
            # there; a label reduced away before the output (a row-parallel Linear's input
            # features) leaves the bias gradient whole on every rank: nothing to synchronise
            group = [ai for ai, lab in enumerate(cfg)
                     if lab is not None and lab not in p.dims and lab in op.output.dims]
            # ZeRO shards states over the data axes only (FSDP2 / ZeroRedundancyOptimizer run
            # there); on a tensor axis the gradient is all-reduced whatever the stage
            sharded = [ai for ai in group if mesh.axes[ai].role in BATCH_ROLES]
            r = math.prod(mesh.axes[ai].size for ai in sharded)
            for ai in group:
                n = mesh.axes[ai].size
                g, w = local * b.grad, local * b.param
                if zero in (0, 1) or ai not in sharded:
                    steps = [(ALL_REDUCE, g)]
                else:  # reduce-scatter gradients, all-gather updated (stage 3: also used) params
                    steps = [(REDUCE_SCATTER, g)] + [(ALL_GATHER, w)] * (2 if zero == 3 else 1)
                if zero == 1 and ai in sharded:
                    # ZeRO-1 runs as DDP (gradients all-reduced in buckets) and
                    # ZeroRedundancyOptimizer, whose owners broadcast each updated parameter
                    # tensor after the step: one broadcast per tensor, every rank taking part
                    t_after += self.broadcast_time(mesh, ai, w)
                    comm[ai] += w * (n - 1) / n
                # on a data axis FSDP2 syncs a unit per call (ZeRO-1's DDP: buckets); on a
                # tensor axis each partial gradient is all-reduced by a hook of its own
                share = (1.0 if mesh.axes[ai].role not in BATCH_ROLES else
                         None if zero == 1 else (self._unit_share_ep if expert_axis else self._unit_share).get(p.name, 1.0))
                for i, (kind, nbytes) in enumerate(steps):
                    t = self.bucketed_time(mesh, ai, kind, nbytes, share)
                    if zero == 3 and i == 1 and ai in sharded:
                        t_gather += t  # FSDP2 gathers the parameters before the forward uses them
                    elif i == 1 and ai in sharded:
                        t_after += t  # ZeRO-2 gathers the updated shards after the step: nothing to hide behind
                    elif zero in (0, 1) and ai in sharded:
                        t_once += t  # accumulation syncs only the last micro-batch (no_sync before)
                    else:
                        t_sync += t
                    comm[ai] += (2.0 if kind == ALL_REDUCE else 1.0) * nbytes * (n - 1) / n
            # the low-precision copy: held to the end of the backward, except under ZeRO-3,
            # whose gathered units `buffers` prices
            cast = b.cast if (fsdp_cast and zero < 3) or (autocast and p.name in self._cast_params) else 0
            held[0] += local * (b.held_param / (r if zero >= 3 else 1) + cast)
            held[1] += local * b.held_grad / (r if zero >= 2 else 1)
            held[2] += local * b.held_optimizer / (r if zero >= 1 else 1)
        out_pl = output_placement(cfg, op)
        return ParamTerms(
            shards=math.prod(ax.size for ax, lab in zip(mesh.axes, cfg, strict=True) if lab is not None),
            out_shards=shard_factor(out_pl, mesh),
            in_shards=tuple(shard_factor(input_placement(cfg, t), mesh) for t in op.inputs),
            col_shards=shard_factor(tuple(pl if pl == f"S:{op.output.dims[-1]}" else "R" for pl in out_pl), mesh)
            if op.output.dims else 1,
            param_moved=tuple(moved), t_sync=t_sync, t_once=t_once, t_gather=t_gather, t_after=t_after,
            held=(held[0], held[1], held[2]), comm=comm)

    def _ring_attention(self, op: Op, cfg: Config, mesh: Mesh, in_locals: list[float], fwd: float, bwd: float,
                        comm: np.ndarray) -> tuple[float, float]:
        """The exposed time of ring attention on each context axis that splits the attention's
        sequence (forward, backward), its traffic added to `comm`. A rank keeps its queries and
        computes against one K/V block per step while the next block arrives from its ring
        neighbour: forward, n - 1 steps of a send/recv of the local K and V; backward, n - 1 steps
        of K and V with the gradients accumulated for them so far (2x the bytes), and one last hop
        of the gradients home to the block's owner (as torch's ring backward and worker/context.py
        do). Each step hides behind one block's compute (1/n of the rank's attention, the causal
        work balanced over ranks by the load-balanced sharding torch's context_parallel uses) as far
        as the device overlaps: exposed = (n - 1) x max(0, transfer - overlap x block compute); the
        last hop has nothing left to hide behind. A sum over ops still, so FT stays exact."""
        t_f = t_b = 0.0
        kv = sum(n * self.esize(t) for n, t in zip(in_locals[1:3], op.inputs[1:3], strict=True))
        hide = self.device.comm_overlap
        for ai, (ax, lab) in enumerate(zip(mesh.axes, cfg, strict=True)):
            if ax.role != CONTEXT or ax.size == 1 or lab != SEQ_LABEL:
                continue
            n = ax.size
            alpha, beta = self.ring_coefficients(mesh, ai)
            step_f, step_b = alpha + beta * kv, alpha + beta * 2 * kv
            t_f += (n - 1) * max(0.0, step_f - hide * fwd / n)
            t_b += (n - 1) * max(0.0, step_b - hide * bwd / n) + step_f
            comm[ai] += (3 * n - 2) * kv
        return t_f, t_b

    def ring_coefficients(self, mesh: Mesh, axis: int) -> tuple[float, float]:
        """(alpha, beta) of one ring step on a context axis: each rank sends to one neighbour and
        receives from the other at once, so a step costs one point-to-point transfer on the
        axis's links (the profile's send/recv fit, scaled by the axis's calibration, if it has one)."""
        ax = mesh.axes[axis]
        bw, lat = self.cluster.link(ax.size, ax.stride)
        if self.profile is not None:
            fit = self.profile.collective("send_recv", 2)
            f = self.profile.comm_factor(ax.name)
            if fit is not None:
                return fit.alpha * f + self.profile.sync, fit.beta * f
            return lat * f + self.profile.sync, f / bw
        return lat, 1.0 / bw

    def _expert_counts(self, op: Op, mesh: Mesh, comm: np.ndarray) -> float:
        """The all-to-all of a dispatch's per-expert token counts (int64) over each expert axis,
        which tells every rank how many tokens it will receive from each other one (the split sizes
        of the token all-to-all that follows, as torchtitan exchanges them): latency, mostly."""
        t = 0.0
        experts = op.output.shape[0]
        for ai, ax in enumerate(mesh.axes):
            if ax.role == EXPERT and ax.size > 1:
                nbytes = 8.0 * experts * ax.size  # as if unsharded on the axis: every rank's counts
                t += self.collective_time(mesh, ai, ALL_TO_ALL, nbytes)
                comm[ai] += nbytes * (ax.size - 1) / ax.size / ax.size
        return t

    def _saved_bytes(self, op: Op, cfg: Config, mesh: Mesh, out_local: float, in_locals: list[float],
                     autocast: bool = False) -> float:
        saved = 0.0
        if autocast:  # as torch.autocast holds it: fp32 where computed so, a cast copy per matmul
            saved += out_local * self._held[op.name]
        elif self._output_saved[op.name]:
            saved += out_local * self.esize(op.output)
        if op.saves == "mask":
            saved += out_local  # one byte per element
        if op.saves == "attention":  # log-sum-exp per query row, fp32
            saved += out_local / max(op.output.shape[-1], 1) * 4
        if op.saves in ("inputs", "attention"):
            # graph inputs have no producer to keep them; other inputs are kept by the producer
            # (see _output_saved) or, when redistributed, on the edge
            for n, t in zip(in_locals, op.inputs, strict=True):
                if t.source is None:
                    saved += n * self.esize(t)
        if op.saves == "attention":
            # an input the attention reads larger than its producer made it (grouped-query K/V
            # repeated over the query heads) is a new tensor autograd keeps beside the producer's
            for n, t in zip(in_locals, op.inputs, strict=True):
                if t.source is not None and t.numel > self.graph.op(t.source).output.numel:
                    saved += n * (1.0 - self.graph.op(t.source).output.numel / t.numel) * self.esize(t)
        if op.kind == "loss" and op.inputs:
            saved += LOSS_COPIES * in_locals[0] * LOSS_BYTES
        # a fused leaf's own intermediates (a scan's per-step states, search/models/scan.py), fp32
        saved += op.workspace * out_local * 4.0
        return saved

    # ---- edges ------------------------------------------------------------------------------
    def edge_costs(self, prod: Op, cons: Op, mesh: Mesh, prod_cfgs: list[Config], cons_cfgs: list[Config]) -> EdgeCosts:
        """`_edge_costs`, priced once per (producer, consumer, mesh): the pipeline search prices the
        same edge under every stage weighting and ZeRO stage of a sub-mesh (the tables are read,
        never written, by their users). Keyed by the ops' identities, kept alive in the entry."""
        memo: dict[tuple[int, int, Mesh, int, int], tuple[Op, Op, EdgeCosts]] = self.__dict__.setdefault("_edge_memo", {})
        key = (id(prod), id(cons), mesh, len(prod_cfgs), len(cons_cfgs))
        hit = memo.get(key)
        if hit is not None and hit[0] is prod and hit[1] is cons:
            return hit[2]
        ec = self._edge_costs(prod, cons, mesh, prod_cfgs, cons_cfgs)
        memo[key] = (prod, cons, ec)
        return ec

    def _edge_costs(self, prod: Op, cons: Op, mesh: Mesh, prod_cfgs: list[Config], cons_cfgs: list[Config]) -> EdgeCosts:
        """All tensors from `prod` read by `cons` (an op may read one tensor several times).

        A tensor with several readers is converted once for all of them (search/prices/boundaries.py):
        its first reader's edge carries the collectives and the kept copy, the other readers' edges
        cost nothing and a pair constraint makes them read it alike. An edge with no module
        boundary to convert at is INFEASIBLE wherever the placement would change. The placement
        logic (`_edge_layout`) reads no shapes; here its terms meet the tensors' bytes."""
        Cu, Cv = len(prod_cfgs), len(cons_cfgs)
        if (prod.name, cons.name) in self.bounds.outer_reader:
            # the reader converts the tensor from the outer reader's placement: priced on their pair
            # (`pair_costs`), nothing between producer and reader
            zero = np.zeros((Cu, Cv))
            return EdgeCosts(src=prod.name, dst=cons.name, time=zero, mem=zero, comm=np.zeros((Cu, Cv, len(mesh.axes))),
                             estimated=False)
        reads = [t for t in cons.inputs if t.source == prod.name]
        layout = self._edge_layout(prod, cons, mesh, prod_cfgs, cons_cfgs, reads)
        if layout.free is not None:
            return layout.free
        ec = self._layout_costs(prod, cons, mesh, reads, layout, Cu, Cv)
        if not any(read.axes for read in layout.reads):
            # no collective anywhere (so no kept copy either): the same table at every micro-batch
            # count, kept with the layout (tables are read, never written, by their users)
            layout.free = ec
        return ec

    def _layout_costs(self, prod: Op, cons: Op, mesh: Mesh, reads: list[TensorRef], layout: EdgeLayout,
                      Cu: int, Cv: int) -> EdgeCosts:
        """The tables of `cons` reading prod's output (`reads`) as `layout` converts it, from Cu
        source placements (prod's, or an outer reader's) to cons's Cv configurations."""
        time = np.zeros((Cu, Cv))
        time_fwd = np.zeros((Cu, Cv))
        mem = np.zeros((Cu, Cv))
        comm = np.zeros((Cu, Cv, len(mesh.axes)))
        full_bytes = prod.output.numel * self.esize(prod.output)
        for t, read in zip(reads, layout.reads, strict=True):
            for a, divisors, kinds in read.axes:
                # bytes of the tensor as seen by a collective on axis a: sharded by the other axes
                other = np.array([full_bytes / d for d in divisors])
                for forward, (on, alpha, beta, vol) in zip((True, False), kinds, strict=True):
                    t_kind = np.where(on, alpha + beta * other[:, None], 0.0)
                    time += t_kind
                    if forward:
                        time_fwd += t_kind
                    comm[:, :, a] += vol * other[:, None]
            if layout.keeps:
                local_in = np.array([t.numel / f * self.esize(t) for f in read.in_shards])
                mem += np.where(read.changed, local_in[None, :], 0.0)
        # recomputing the consumer's layer runs its forward again, the collectives its modules'
        # hooks and styles perform included (Megatron's recomputation pays them twice too)
        time_rc = time + time_fwd
        blocked = layout.blocked
        if blocked.any():
            time = np.where(blocked, INFEASIBLE, time)
            time_rc = np.where(blocked, INFEASIBLE, time_rc)
            mem = np.where(blocked, INFEASIBLE, mem)
        return EdgeCosts(src=prod.name, dst=cons.name, time=time, mem=mem, comm=comm,
                         estimated=not self._comm_measured(mesh), time_rc=time_rc if time_fwd.any() else None)

    def _edge_layout(self, prod: Op, cons: Op, mesh: Mesh, prod_cfgs: list[Config], cons_cfgs: list[Config],
                     reads: list[TensorRef]) -> EdgeLayout:
        """What `_edge_costs` finds without reading a shape: the pairs no module boundary lets
        convert, and per tensor read and axis the collective kinds with their alpha, beta and
        traffic per byte. The same at every micro-batch count: found once per (ops' names and
        dimensions, mesh, configurations, the two shape tests the boundaries make) and shared by
        every cost model made `like` this one."""
        crossing = self.bounds.crossing(prod, cons)
        tensor_axes = any(ax.role == TENSOR and ax.size > 1 for ax in mesh.axes)
        shapes = tuple((t.dims, tuple(t.shape) == tuple(prod.output.shape),
                        crossing == "entry" and tensor_axes and self.bounds.ambiguous_entry(prod, cons, tuple(t.shape),
                                                                                               self.graph))
                       for t in reads)
        key = (prod.name, cons.name, prod.output.dims, self.graph.batch_label, mesh, tuple(prod_cfgs), tuple(cons_cfgs),
               shapes)
        memo: dict[tuple, EdgeLayout] = self._shared_memos["edge_layout"]
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._named_layout(prod, cons, mesh, prod_cfgs, cons_cfgs, reads, crossing, shapes)
        return hit

    def _named_layout(self, prod: Op, cons: Op, mesh: Mesh, prod_cfgs: list[Config], cons_cfgs: list[Config],
                      reads: list[TensorRef], crossing: str,
                      shapes: tuple[tuple[tuple[str, ...], bool, bool], ...]) -> EdgeLayout:
        """An edge's own EdgeLayout (its `free` table names its ops) over placement logic found
        once for every edge that reads alike: `_priced_edge_layout` reads the ops' names only
        through whether the edge pays the conversion and whether a reader keeps it, and their
        tensors only through their dimensions and the shape tests - a deep model's layers repeat
        the same edges, each priced as the first (DeepSeek-V3: its dense layers and the MoE
        template's attention)."""
        pays = self.bounds.pays(prod.name, cons.name)
        keeps = pays and self.bounds.any_reader_keeps(prod.name)
        key = (crossing, pays, keeps, prod.output.dims, self.graph.batch_label, mesh, tuple(prod_cfgs), tuple(cons_cfgs),
               shapes)
        memo: dict[tuple, EdgeLayout] = self._shared_memos["edge_logic"]
        logic = memo.get(key)
        if logic is None:
            logic = memo[key] = self._priced_edge_layout(prod, cons, mesh, prod_cfgs, cons_cfgs, reads, crossing,
                                                         [(same, amb) for _, same, amb in shapes])
        return EdgeLayout(reads=logic.reads, blocked=logic.blocked, keeps=logic.keeps)

    def _priced_edge_layout(self, prod: Op, cons: Op, mesh: Mesh, prod_cfgs: list[Config], cons_cfgs: list[Config],
                            reads: list[TensorRef], crossing: str, tests: list[tuple[bool, bool]],
                            source: tuple[list[tuple[str, ...]], list[tuple[str, ...]]] | None = None) -> EdgeLayout:
        """`_edge_layout` found; `tests`: per tensor read, whether it has its producer's output's
        shape and whether converting it where the reader enters its module is ambiguous.
        `source`: the placements (and gradients' placements) the tensor reaches the reader in, one
        per row, where they are not prod's (its outer reader's, `pair_costs`): that edge pays."""
        n_axes = len(mesh.axes)
        Cu, Cv = len(prod_cfgs), len(cons_cfgs)
        pays = source is not None or self.bounds.pays(prod.name, cons.name)
        blocked = np.zeros((Cu, Cv), dtype=bool)
        # on a context axis the tokens flattened into the batch dimension (the loss's input) are
        # split as the sequence is: the same local tokens, no conversion between the two
        ctx = [a for a, ax in enumerate(mesh.axes) if ax.role == CONTEXT and ax.size > 1]
        batch = self.graph.batch_label

        def tokens(pl: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(context_code(c, batch) if a in ctx else c for a, c in enumerate(pl)) if ctx else pl

        made = source or ([output_placement(c, prod) for c in prod_cfgs], [output_grad_placement(c, prod) for c in prod_cfgs])
        out_pl, out_gpl = [tokens(pl) for pl in made[0]], [tokens(pl) for pl in made[1]]
        out: list[ReadLayout] = []
        for t, (same_shape, ambiguous) in zip(reads, tests, strict=True):
            in_pl = [tokens(input_placement(c, t)) for c in cons_cfgs]
            in_gpl = [tokens(input_grad_placement(c, t)) for c in cons_cfgs]
            changed = np.zeros((Cu, Cv), dtype=bool)
            axes: list[tuple[int, tuple[int, ...], tuple[tuple[np.ndarray, ...], ...]]] = []
            for a in range(n_axes):
                if mesh.axes[a].size == 1:
                    continue
                if crossing != "entry" and mesh.axes[a].role == TENSOR:  # data axes convert nothing at boundaries
                    src, dst = [p[a] for p in out_pl], [p[a] for p in in_pl]
                    changed_here = _differ(src, dst) | _differ([p[a] for p in out_gpl], [p[a] for p in in_gpl])
                    if crossing == "exit":  # leaving the producer's module: the style's output hook
                        # converts forward and its gradient back (search/prices/boundaries.py)
                        changed_here &= ~_pairwise(src, dst, lambda s, d, same=same_shape: exit_allowed(s, d, same),
                                                   dtype=bool)
                    blocked |= changed_here
                elif mesh.axes[a].role == TENSOR and ambiguous:
                    # the module receives another tensor of this shape: torch cannot tell which to convert
                    src, dst = [p[a] for p in out_pl], [p[a] for p in in_pl]
                    blocked |= _differ(src, dst) | _differ([p[a] for p in out_gpl], [p[a] for p in in_gpl])
                elif mesh.axes[a].role == TENSOR and tuple(t.dims) != tuple(prod.output.dims):
                    # converted where the reader receives it, after a view: both layouts must be
                    # expressible in the reader's dimensions (DTensor's Shard(dim) of that view)
                    src, dst = [p[a] for p in out_pl], [p[a] for p in in_pl]
                    gsrc, gdst = [p[a] for p in out_gpl], [p[a] for p in in_gpl]
                    bad_src = np.array([s.startswith("S:") and s[2:] not in t.dims for s in src])
                    bad_gsrc = np.array([s.startswith("S:") and s[2:] not in t.dims for s in gsrc])
                    blocked |= (_differ(src, dst) & bad_src[:, None]) | (_differ(gsrc, gdst) & bad_gsrc[:, None])
                if not pays:
                    continue
                alpha, beta = self.collective_coefficients(mesh, a)
                divisors = tuple(math.prod(ax.size for b_, ax in enumerate(mesh.axes) if b_ != a and pl[b_].startswith("S:"))
                                 for pl in out_pl)
                fk = _kind_matrix([p[a] for p in out_pl], [p[a] for p in in_pl], forward=True)
                bk = _kind_matrix([p[a] for p in out_gpl], [p[a] for p in in_gpl], forward=False)
                if not (fk != NONE).any() and not (bk != NONE).any():
                    continue  # no collective on this axis: its terms would add zeros
                n = mesh.axes[a].size
                kinds = tuple((kk != NONE, alpha[kk], beta[kk],
                               np.select([kk == ALL_REDUCE, kk == ALL_TO_ALL, kk != NONE],
                                         [2.0 * (n - 1) / n, (n - 1) / n / n, (n - 1) / n], 0.0))
                              for kk in (fk, bk))
                axes.append((a, divisors, kinds))
                changed |= fk != NONE
            in_shards = tuple(shard_factor(p, mesh) for p in in_pl)
            out.append(ReadLayout(axes=tuple(axes), changed=changed, in_shards=in_shards))
        return EdgeLayout(reads=tuple(out), blocked=blocked, keeps=pays and self.bounds.any_reader_keeps(prod.name))

    def _outer_pair_costs(self, pair: Pair, mesh: Mesh, cfgs_a: list[Config], cfgs_b: list[Config]) -> EdgeCosts:
        """A reader entering a module of its own converts prod's output from the placement its
        outer reader takes it in (search/prices/boundaries.py `outer_reader`): priced as the edge
        it is, with the outer reader's input placements in the producer's place."""
        prod = self.graph.op(pair.tensor)
        y_first = (pair.tensor, pair.a) in self.bounds.outer_reader
        x, y = (self.graph.op(pair.b), self.graph.op(pair.a)) if y_first else (self.graph.op(pair.a), self.graph.op(pair.b))
        cfgs_x, cfgs_y = (cfgs_b, cfgs_a) if y_first else (cfgs_a, cfgs_b)
        tx = next(t for t in x.inputs if t.source == prod.name)
        source = ([input_placement(c, tx) for c in cfgs_x], [input_grad_placement(c, tx) for c in cfgs_x])
        reads = [t for t in y.inputs if t.source == prod.name]
        tensor_axes = any(ax.role == TENSOR and ax.size > 1 for ax in mesh.axes)
        tests = [(tuple(t.shape) == tuple(prod.output.shape),
                  tensor_axes and self.bounds.ambiguous_entry(prod, y, tuple(t.shape), self.graph)) for t in reads]
        layout = self._priced_edge_layout(prod, y, mesh, cfgs_x, cfgs_y, reads, "entry", tests, source=source)
        ec = self._layout_costs(prod, y, mesh, reads, layout, len(cfgs_x), len(cfgs_y))
        if not y_first:
            return EdgeCosts(src=pair.a, dst=pair.b, time=ec.time, mem=ec.mem, comm=ec.comm, estimated=ec.estimated,
                             time_rc=ec.time_rc)
        return EdgeCosts(src=pair.a, dst=pair.b, time=ec.time.T, mem=ec.mem.T, comm=ec.comm.transpose(1, 0, 2),
                         estimated=ec.estimated, time_rc=None if ec.time_rc is None else ec.time_rc.T)

    def pair_costs(self, pair: Pair, mesh: Mesh, cfgs_a: list[Config], cfgs_b: list[Config]) -> EdgeCosts:
        """A pair constraint as an edge between its two ops: free where they agree (the readers of
        one tensor read it and return its gradient alike; tied ops place the parameter alike),
        INFEASIBLE elsewhere. An 'outer' pair is priced as the conversion it stands for."""
        if pair.kind == "outer":
            return self._outer_pair_costs(pair, mesh, cfgs_a, cfgs_b)
        a, b = self.graph.op(pair.a), self.graph.op(pair.b)
        ka: list[tuple[tuple[str, ...], ...]]  # per configuration: the placements that must agree
        kb: list[tuple[tuple[str, ...], ...]]
        if pair.kind == "reader":
            ta = next(t for t in a.inputs if t.source == pair.tensor)
            tb = next(t for t in b.inputs if t.source == pair.tensor)
            ka = [(input_placement(c, ta), input_grad_placement(c, ta)) for c in cfgs_a]
            kb = [(input_placement(c, tb), input_grad_placement(c, tb)) for c in cfgs_b]
        else:
            pa = next(p for p in a.params if p.name == pair.tensor)
            pb = next(p for p in b.params if p.name == pair.tensor)
            ka = [(param_placement(c, pa.dims),) for c in cfgs_a]
            kb = [(param_placement(c, pb.dims),) for c in cfgs_b]
        # on tensor axes only: a data axis splits the batch everywhere, and gradients of what it
        # replicates are reduced by DDP/FSDP over the parameters, not at module boundaries
        tensor = [i for i, ax in enumerate(mesh.axes) if ax.role == TENSOR and ax.size > 1]

        def on_tensor_axes(placements: tuple) -> str:
            return repr([[pl[i] for i in tensor] for pl in placements])

        bad = _differ([on_tensor_axes(k) for k in ka], [on_tensor_axes(k) for k in kb])
        cost = np.where(bad, INFEASIBLE, 0.0)
        return EdgeCosts(src=pair.a, dst=pair.b, time=cost, mem=cost.copy(), comm=np.zeros((*bad.shape, len(mesh.axes))),
                         estimated=False)

    def add_pair_edges(self, edges: dict[tuple[str, str], EdgeCosts], mesh: Mesh, configs, pairs: list[Pair]) -> None:
        """Each pair constraint into `edges` as the edge (a, b), summed with any edge already there;
        `configs(name)` gives an op's configurations."""
        for pair in pairs:
            key = (pair.a, pair.b)
            edges[key] = add_edges(edges.get(key), self.pair_costs(pair, mesh, configs(pair.a), configs(pair.b)))

    # ---- constants ---------------------------------------------------------------------------
    def buffers(self, mesh: Mesh, ops: list[Op] | None = None, zero: int = 0) -> float:
        """Transient workspace: the largest op output (and its gradient) under the op's leanest
        configuration - the logits and the loss aside, which the loss's own activations price -
        plus under ZeRO-3 the parameters FSDP2 holds gathered: the root unit (not resharded after
        forward) and two block layers (the one computing and the one prefetched). Config-
        independent, so adding it keeps the frontier exact. `ops` may name a subset that stands
        for the rest (one layer of a stack of identical layers)."""
        ops = list(self.graph.ops if ops is None else ops)
        # asked twice per pipeline shape with the same stage ops (its bound and its tables), and
        # by every shape on one sub-mesh: priced once per (mesh, ZeRO stage, ops), keyed by the
        # ops' identities with the ops kept alive in the entry (as `op_costs`'s memo)
        memo: dict[tuple[Mesh, bool, tuple[int, ...]], tuple[list[Op], float]] = self.__dict__.setdefault(
            "_buffers_memo", {})
        # only ZeRO-3 prices otherwise (its gathered parameters): stages 0-2 share one entry
        key = (mesh, zero == 3, tuple(id(op) for op in ops))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (ops, self._buffers(mesh, ops, zero))
        return hit[1]

    def _buffers(self, mesh: Mesh, ops: list[Op], zero: int) -> float:
        """`buffers` priced."""
        logits = {t.numel for op in ops if op.kind == "loss" for t in op.inputs}
        layer_of = self._layer_of
        worst = 0.0
        units: dict[int, float] = {}
        for op in ops:
            cfgs = op_configs(op, mesh, self.graph.batch_label)
            if op.kind != "loss" and op.output.numel not in logits:
                lean = min(op.output.numel / shard_factor(output_placement(c, op), mesh) for c in cfgs)
                worst = max(worst, 2 * lean * self.esize(op.output))
            if zero == 3 and op.params:
                lean_w = min(sum(p.numel / shard_factor(param_placement(c, p.dims), mesh) for p in op.params if p.owner)
                             for c in cfgs)
                u = layer_of.get(op.name, -1)
                units[u] = units.get(u, 0.0) + lean_w * self.bytes.param
        blocks = sorted((v for u, v in units.items() if u >= 0), reverse=True)
        gathered = units.get(-1, 0.0) + sum(blocks[:2])
        worst = max(worst, self.tied_sum(mesh, ops))
        if self.profile is not None:  # calibrated framework and allocator overhead per rank
            return worst + gathered + self.profile.memory_overhead
        return worst + gathered

    @functools.cached_property
    def _layer_of(self) -> dict[str, int]:
        """Each op of the first block stack's layers: its layer's index."""
        return {name: i for b in self.graph.blocks[:1] for i, layer in enumerate(b.layers) for name in layer}

    @functools.cached_property
    def _param_readers(self) -> dict[str, list[str]]:
        """Each parameter: the ops that read it, in graph order (made once: a walk of every op)."""
        readers: dict[str, list[str]] = {}
        for op in self.graph.ops:
            for p in op.params:
                readers.setdefault(p.name, []).append(op.name)
        return readers

    def tied_sum(self, mesh: Mesh, ops: list[Op]) -> float:
        """The backward's last moment for a parameter that two ops read (GPT's token embedding and
        LM head): autograd sums the two gradients into a new tensor while both are live, two
        gradient-sized tensors beside every gradient, when the activations are gone. The sum of
        the ops counts the gradients and, among the activations, the loss's logits copies, which
        the step held at its start (the sum never has less): only what the two extra gradients
        exceed those copies by is added - with recomputation and few tokens per vocabulary entry
        (gpt2-medium at 512 tokens: 393 MiB against 294) the backward's end is the peak. Both
        under their leanest configuration, as the other transients; only where one device runs
        both readers (not across pipeline stages, which hold a copy each)."""
        names = {op.name for op in ops}
        readers = self._param_readers
        twice = 0.0
        logits = 0.0
        for op in ops:
            # asked for only where read: most ops hold no tied parameter and are no loss
            cfgs: list[Config] | None = None
            for p in op.params:
                if p.owner and len(readers[p.name]) > 1 and names.issuperset(readers[p.name]):
                    cfgs = cfgs if cfgs is not None else op_configs(op, mesh, self.graph.batch_label)
                    lean = min(p.numel / shard_factor(param_placement(c, p.dims), mesh) for c in cfgs)
                    twice = max(twice, 2 * lean * self.bytes.held_grad)
            if op.kind == "loss" and op.inputs:
                cfgs = cfgs if cfgs is not None else op_configs(op, mesh, self.graph.batch_label)
                logits += LOSS_COPIES * LOSS_BYTES * min(op.inputs[0].numel / shard_factor(input_placement(c, op.inputs[0]), mesh)
                                                         for c in cfgs)
        return max(0.0, twice - logits)


def effective_zero(op: Op, mesh: Mesh, zero: int) -> int:
    """The ZeRO stage `op_costs` prices `op` under on `mesh` when asked for `zero`."""
    if zero == 1 and any(ax.role == TENSOR and ax.size > 1 for ax in mesh.axes):
        # ZeroRedundancyOptimizer needs plain tensors and tensor parallelism makes parameters
        # DTensors: the executor runs ZeRO-1 there as ZeRO-2 (worker/analyze.py); price that
        zero = 2
    if not op.params and zero != 1:
        # an op without parameters sees the ZeRO stage only through the mixed precision that
        # runs it (FSDP2's policy unless ZeRO-1: `fsdp_cast` in `_op_costs`); stages 0, 2 and
        # 3 price it alike, so its table is made once for them (the accumulation shapes ask
        # for all four stages of every sub-mesh; ZeRO-1 on a tensor-parallel mesh, run as
        # ZeRO-2, is one of them)
        return 0
    return zero


def _is_cast(op: Op) -> bool:
    """A dtype conversion (`x.float()`, `x.to(dtype)`): captured in fp32, it casts to fp32 or to
    the dtype of the stream it normalises, which autocast leaves fp32."""
    return op.name.rsplit(":", 1)[-1].split("#")[0] in ("to", "float", "type_as")


def autocast_dtypes(graph: OpGraph) -> dict[str, int]:
    """Bytes per element of each op's output as torch.autocast computes it from fp32 parameters:
    2 for the ops it runs in low precision, 4 for its fp32 ones and casts, else the widest float
    input (a bf16 matmul output added to the fp32 residual stream is fp32)."""
    out: dict[str, int] = {}
    for op in graph.ops:
        if not op.output.dtype.startswith("float"):
            out[op.name] = 8 if op.output.dtype in ("int64", "long") else 4
        elif op.kind in CAST_KINDS:
            out[op.name] = 2
        elif op.kind in FP32_KINDS or _is_cast(op) or op.params:
            out[op.name] = 4
        else:
            floats = [out[t.source] if t.source is not None else 4 for t in op.inputs if t.dtype.startswith("float")]
            out[op.name] = max(floats, default=4)
    return out


def autocast_held(graph: OpGraph) -> dict[str, float]:
    """Bytes per element of each op's output that autocast's backward keeps: the output itself
    when the op or a consumer that does not cast keeps it, and an fp32 output's bf16 copy for
    every low-precision consumer that keeps its inputs (autocast casts per call: GPT's q, k and v
    projections hold three copies of the norm's output)."""
    dt = autocast_dtypes(graph)
    held: dict[str, float] = {}
    consumers = graph.consumers()
    for op in graph.ops:
        savers = [graph.op(c) for c in dict.fromkeys(c for c, _ in consumers[op.name])
                  if graph.op(c).saves in ("inputs", "attention")]
        casting = [c for c in savers if c.kind in CAST_KINDS]
        plain = op.saves in ("output", "attention") or len(casting) < len(savers)
        if dt[op.name] == 4 and op.output.dtype.startswith("float"):
            held[op.name] = (4.0 if plain else 0.0) + 2.0 * len(casting)
        else:
            held[op.name] = float(dt[op.name]) if plain or casting else 0.0
    return held


def sync_unit_shares(graph: OpGraph, experts_apart: bool = False) -> dict[str, float]:
    """Each owned parameter's share of the elements of its FSDP2 unit: its block layer (the
    first block stack's layers are wrapped one by one) or the root (everything else), as
    worker.parallelize wraps them. A unit's gradient (and ZeRO parameter) collective is one call.
    `experts_apart`: under expert parallelism each layer's expert weights are a unit of their own
    (they sync over the data axis alone, the rest of the layer over data x expert)."""
    layer_of = {name: i for b in graph.blocks[:1] for i, layer in enumerate(b.layers) for name in layer}

    def unit(op: Op, p: ParamRef) -> tuple[int, bool]:
        return layer_of.get(op.name, -1), experts_apart and EXPERT_LABEL in p.dims

    owned = [(p.name, p.numel, unit(op, p)) for op in graph.ops for p in op.params if p.owner]
    totals: dict[tuple[int, bool], float] = {}
    for _, numel, u in owned:
        totals[u] = totals.get(u, 0.0) + numel
    return {name: numel / totals[u] if totals[u] > 0 else 1.0 for name, numel, u in owned}


def ring_ways(op: Op, cfg: Config, mesh: Mesh) -> int:
    """Over how many ranks an attention op's keys and values travel a ring: the product of the
    context axes that split its sequence (1 for any other op)."""
    if op.kind != "attention":
        return 1
    return math.prod(ax.size for ax, lab in zip(mesh.axes, cfg, strict=True) if ax.role == CONTEXT and lab == SEQ_LABEL)


def runs_on_dtensor(op: Op, cfg: Config, mesh: Mesh) -> bool:
    """Whether the executor runs `op` on DTensors: an op with parameters split (or, for a
    sequence-parallel norm, its input split) on a tensor axis, which a parallel style wraps."""
    return bool(op.params) and any(ax.role == TENSOR and ax.size > 1 and lab is not None
                                   for ax, lab in zip(mesh.axes, cfg, strict=True))


def _pairwise(src: list[str], dst: list[str], f, dtype=np.int64) -> np.ndarray:
    """[len(src), len(dst)] matrix of f(s, d), computed over the distinct codes only (a table of
    configurations repeats a few placements many times)."""
    us, ui = np.unique(np.array(src, dtype=object), return_inverse=True)
    vs, vi = np.unique(np.array(dst, dtype=object), return_inverse=True)
    table = np.array([[f(s, d) for d in vs] for s in us], dtype=dtype).reshape(len(us), len(vs))
    return table[ui][:, vi]


# The placement matrices of edges and pair constraints, by their code lists: on one mesh many
# edges convert between the same lists of placements (every layer's, every micro-batch count's)
_MATRICES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], np.ndarray] = {}
_MATRICES_MAX = 100_000


def _memo_matrix(what: str, src: list[str], dst: list[str], make: Callable[[], np.ndarray]) -> np.ndarray:
    """`make()`, found once per (what, src, dst) and returned read-only (callers combine it into
    new arrays, never write it)."""
    key = (what, tuple(src), tuple(dst))
    hit = _MATRICES.get(key)
    if hit is None:
        if len(_MATRICES) >= _MATRICES_MAX:
            _MATRICES.clear()
        hit = make()
        hit.flags.writeable = False
        _MATRICES[key] = hit
    return hit


def _differ(src: list[str], dst: list[str]) -> np.ndarray:
    """[len(src), len(dst)] matrix: whether the codes differ."""
    return _memo_matrix("differ", src, dst, lambda: _pairwise(src, dst, lambda s, d: s != d, dtype=bool))


def _kind_matrix(src: list[str], dst: list[str], forward: bool) -> np.ndarray:
    """[len(src), len(dst)] matrix of collective kinds. Backward, gradients flow dst -> src: the
    consumer's input gradient becomes what the producer needs for its output gradient."""
    if forward:
        return _memo_matrix("forward", src, dst, lambda: _pairwise(src, dst, forward_collective))
    return _memo_matrix("backward", src, dst, lambda: _pairwise(src, dst, lambda s, d: forward_collective(d, s)))
