"""The OpGraph IR: operators with shapes, FLOPs and named dimensions; tensors as edges.

Every operator has exactly one output tensor, so a tensor is named by the op that produced it.
Dimensions carry *labels* (strings) that say which tensor dimensions are "the same" across
operators: the batch dimension of the input ids, of every activation and of the logits all share
the label ``batch``; a Linear's input-feature dimension shares its label with its weight's
dimension 1. Labels survive reshapes and transposes (capture folds those into edges), so sharding
a producer's output on label L and a consumer's input on label L means no communication. This is
what lets the cost model price resharding by comparing placements, and what lets the search
offer, per op, "shard this mesh axis on one of the op's splittable labels, or replicate".

The JSON form (``format: paretoplan.graph/1``) is documented in docs/cli.md.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from search.errors import invalid, read_json

GRAPH_FORMAT = "paretoplan.graph/1"

# What autograd keeps for backward, per op kind, is decided by `saves` on each op:
#   "inputs"  - every activation input (Linear, norms, unary activations, matmul, conv)
#   "output"  - the op's own output (softmax, rsqrt, exp)
#   "mask"    - a 1-byte-per-element mask of the output (dropout)
#   "none"    - nothing (add, views, reductions)
SaveKind = Literal["inputs", "output", "mask", "none", "attention"]

OP_KINDS = (
    "linear",       # x[..., k] @ W[n, k]^T: splittable batch-like dims, n (column), k (row, Partial out)
    "matmul",       # a[..., m, k] @ b[..., k, n] between activations
    "attention",    # fused scaled-dot-product attention over [batch, heads, seq, head_dim]
    "embedding",    # table lookup W[vocab, hidden] by ids
    "norm",         # layer/RMS/batch norm: the normalised dims are not splittable
    "elementwise",  # pointwise ops, with broadcasting
    "reduce",       # sum/mean over some dims (splitting a reduced dim gives a Partial output)
    "softmax",      # softmax/log-softmax: the softmax dim is not splittable
    "conv",         # convolution: batch, out channels (column), in channels (row)
    "pool",         # pooling: batch and channels
    "loss",         # cross-entropy to a scalar; its output has no consumers
    "dispatch",     # routed tokens [T, H] into per-expert buffers [expert, C, H] (search/models/moe.py)
    "combine",      # per-expert outputs [expert, C, H] and routing weights [T, k] back to tokens [T, H]
    "scan",         # a state-space or linear-recurrence scan over the sequence (search/models/scan.py)
    "opaque",       # anything else: only its batch dimension may be split
)


class TensorRef(BaseModel):
    """One input of an op: the producing op (None for a graph input or constant) and the view of
    that tensor the consumer sees (its shape and dimension labels after any folded reshape)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str | None = Field(default=None, description="name of the producing op; null for a graph input")
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    dtype: str = "float32"

    @model_validator(mode="after")
    def _same_rank(self) -> TensorRef:
        # sizes and dtypes are checked by the graph, which can name the op and the tensor
        if len(self.shape) != len(self.dims):
            raise ValueError(f"shape {list(self.shape)} and dims {list(self.dims)} differ in rank")
        return self

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ParamRef(BaseModel):
    """A parameter the op reads. `owner=False` marks a tied parameter already owned by an earlier
    op (GPT's lm head reads the token embedding): it is stored, updated and synchronised once."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    dtype: str = "float32"
    owner: bool = True

    @model_validator(mode="after")
    def _same_rank(self) -> ParamRef:
        if len(self.shape) != len(self.dims):
            raise ValueError(f"param {self.name}: shape and dims differ in rank")
        return self

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Op(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    kind: Literal[OP_KINDS]  # type: ignore[valid-type]
    target: str = Field(default="", description="the torch op it came from, for humans")
    module: str = Field(default="", description="dotted path of the nn.Module that ran it")
    inputs: tuple[TensorRef, ...] = ()
    output: TensorRef
    params: tuple[ParamRef, ...] = ()
    splittable: tuple[str, ...] = Field(
        default=(), description="labels a mesh axis may shard, in a canonical order"
    )
    flops: float = Field(default=0.0, ge=0.0, allow_inf_nan=False,
                         description="forward FLOPs of the whole (unsharded) op")
    saves: SaveKind = "inputs"
    workspace: float = Field(default=0.0, ge=0.0, allow_inf_nan=False,
                             description="fp32 elements autograd keeps for backward beyond the op's inputs and "
                                         "output, per element of its output (a scan's per-step states)")
    styled: bool = Field(default=True,
                         description="whether a parallel style of torch's parallelize_module can split this op's "
                                     "parameters: capture sets False where the module running it is not an "
                                     "nn.Linear, nn.Embedding or norm of its own (GPT-2's Conv1D, a scaled "
                                     "embedding); such an op only replicates on a tensor axis")

    def labels(self) -> set[str]:
        out = set(self.output.dims)
        for t in self.inputs:
            out.update(t.dims)
        for p in self.params:
            out.update(p.dims)
        return out

    def label_size(self, label: str) -> int:
        """Size of a label in this op (the smallest over the operands that carry it)."""
        return label_size((*self.inputs, self.output, *self.params), label)


def calls_of_one_op(ops: Iterable[Op]) -> dict[str, bool]:
    """module -> whether all its ops are calls of one parameterised op (same kind, same params):
    a module called more than once per forward (an RNN's recurrent GEMM, once per time step)."""
    sig: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for op in ops:
        if op.module:
            sig.setdefault(op.module, set()).add((op.kind, tuple(p.name for p in op.params)))
    return {m: len(s) == 1 and bool(next(iter(s))[1]) for m, s in sig.items()}


def own_modules(ops: Sequence[Op]) -> frozenset[str]:
    """Modules whose output is one op's: a module without submodules holding ops that holds one
    op, or only calls of one parameterised op (`calls_of_one_op`). Only such a module's boundary
    is its op's boundary."""
    count: dict[str, int] = {}
    parents: set[str] = set()
    for op in ops:
        if op.module:
            count[op.module] = count.get(op.module, 0) + 1
            parts = op.module.split(".")
            parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
    repeated = calls_of_one_op(ops)
    return frozenset(m for m, n in count.items() if m not in parents and (n == 1 or repeated[m]))


def label_size(refs: Iterable[TensorRef | ParamRef], label: str) -> int:
    """Size of a label over some tensors (the smallest of those that carry it); 1 if none does."""
    sizes = [s for t in refs for d, s in zip(t.dims, t.shape, strict=True) if d == label]
    return min(sizes) if sizes else 1


class BlockInfo(BaseModel):
    """A stack of structurally identical layers (transformer blocks), found at capture time.
    `layers[i]` lists the op names of layer i in one canonical order, the same for every layer."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prefix: str
    layers: tuple[tuple[str, ...], ...]


def block_layout(graph: OpGraph, block: BlockInfo) -> tuple[int, int]:
    """Which module layers ('prefix.i') the block stack's layers hold: layer k holds module layers
    first + k * period .. first + (k + 1) * period - 1. first > 0 where the stack starts with a
    shorter run of other layers (DeepSeek-V3's 3 dense layers before 58 MoE ones, left out of the
    stack); period > 1 for a periodic stack (Jamba's 8); see search/models/capture.py."""
    found = {i for name in block.layers[0] if (i := module_layer(graph, block, name)) is not None}
    return (min(found), len(found)) if found else (0, 1)


def module_layer(graph: OpGraph, block: BlockInfo, name: str) -> int | None:
    """The module layer ('prefix.i') op `name` belongs to, or None."""
    m = _layer_pattern(block.prefix).match(graph.op(name).module or name)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=64)
def _layer_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"\.(\d+)(?:[.:#]|$)")


class OpGraph(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    format: str = GRAPH_FORMAT
    name: str = "graph"
    ops: tuple[Op, ...]
    blocks: tuple[BlockInfo, ...] = ()
    batch_label: str = "batch"
    meta: dict[str, str | int | float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> OpGraph:
        """Everything the search would otherwise price silently wrong, as a ValueError naming the
        op and the tensor (the CLI's exit 2, the service's 422, through `parse_graph`)."""
        if self.format != GRAPH_FORMAT:
            raise ValueError(f"unsupported graph format {self.format!r}; expected {GRAPH_FORMAT!r}")
        if not self.ops:
            raise ValueError("graph has no ops")
        seen: set[str] = set()
        for op in self.ops:
            if op.name in seen:
                raise ValueError(f"duplicate op name {op.name!r}")
            seen.add(op.name)
        by_name = {op.name: op for op in self.ops}
        for op in self.ops:
            for t in op.inputs:
                if t.source is not None and t.source not in seen:
                    raise ValueError(f"op {op.name!r} reads from unknown op {t.source!r}")
                if t.source == op.name:
                    raise ValueError(f"op {op.name!r} reads its own output (cycle)")
        # the wiring before what flows along it: a cycle is named as one, not as the first
        # mismatch it happens to create
        if _topological_order(self.ops) is None:
            raise ValueError("graph has a cycle")
        for op in self.ops:
            labels = op.labels()
            for s in op.splittable:
                if s not in labels:
                    raise ValueError(f"op {op.name!r}: splittable label {s!r} is on none of its tensors")
            _check_tensors(op, by_name)
        _check_params(self.ops)
        if not any(self.batch_label in t.dims for op in self.ops for t in (*op.inputs, op.output)):
            raise ValueError(f"batch_label {self.batch_label!r} names no dimension of any tensor: "
                             f"the search could not split the batch")
        in_block: dict[str, str] = {}
        for block in self.blocks:
            if not block.layers or any(not layer for layer in block.layers):
                raise ValueError(f"block {block.prefix!r}: a block stack needs layers and a layer needs ops")
            sizes = {len(layer) for layer in block.layers}
            if len(sizes) > 1:
                raise ValueError(f"block {block.prefix!r}: layers have different op counts")
            for layer in block.layers:
                for name in layer:
                    if name not in by_name:
                        raise ValueError(f"block {block.prefix!r} names unknown op {name!r}")
                    if name in in_block:
                        raise ValueError(f"op {name!r} is named twice by the blocks ({in_block[name]!r} and "
                                         f"{block.prefix!r})")
                    in_block[name] = block.prefix
        return self

    # ---- navigation -------------------------------------------------------------------------
    def op(self, name: str) -> Op:
        return self._index()[name]

    def _index(self) -> dict[str, Op]:
        cache = self.__dict__.get("_op_index")
        if cache is None:
            cache = {op.name: op for op in self.ops}
            object.__setattr__(self, "_op_index", cache)
        return cache

    def consumers(self) -> dict[str, list[tuple[str, int]]]:
        """For each op, the (consumer, input position) pairs reading its output."""
        out: dict[str, list[tuple[str, int]]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for i, t in enumerate(op.inputs):
                if t.source is not None:
                    out[t.source].append((op.name, i))
        return out

    def topological(self) -> list[Op]:
        order = _topological_order(self.ops)
        assert order is not None  # checked at validation
        return order

    def param_count(self) -> int:
        return sum(p.numel for op in self.ops for p in op.params if p.owner)

    def total_flops(self) -> float:
        return sum(op.flops for op in self.ops)

    # ---- JSON -------------------------------------------------------------------------------
    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())


# dtypes the cost model sizes (torch's names, as capture writes them); complex numbers are not
# among them: an element would be priced at a real activation's size, half of what it holds
_DTYPE = re.compile(r"(bool|long|half|float|double|bfloat16|(u?int|float)\d+(_\w+)?)")


def _tensor_name(op: Op, t: TensorRef, i: int | None) -> str:
    if i is None:
        return f"op {op.name!r} output"
    return f"op {op.name!r} input {i} ({'graph input' if t.source is None else f'from op {t.source!r}'})"


def _check_tensors(op: Op, by_name: dict[str, Op]) -> None:
    """Sizes and dtypes of an op's tensors, each of them against its producer's output, and each
    label against itself across the op's operands."""
    refs: list[tuple[str, TensorRef | ParamRef]] = [(_tensor_name(op, t, i), t) for i, t in enumerate(op.inputs)]
    refs.append((_tensor_name(op, op.output, None), op.output))
    refs += [(f"op {op.name!r} parameter {p.name!r}", p) for p in op.params]
    for where, t in refs:
        if any(s <= 0 for s in t.shape):
            raise ValueError(f"{where}: shape {list(t.shape)} has a size below 1")
        if not _DTYPE.fullmatch(t.dtype):
            kind = "complex dtypes are not supported" if t.dtype.startswith(("complex", "c")) else "unknown dtype"
            raise ValueError(f"{where}: {kind}: {t.dtype!r}")
    for i, t in enumerate(op.inputs):
        if t.source is None:
            continue
        out = by_name[t.source].output
        where = _tensor_name(op, t, i)
        if t.dtype != out.dtype:
            raise ValueError(f"{where}: dtype {t.dtype!r} disagrees with its producer's output ({out.dtype!r}); "
                             f"a cast is an op of its own")
        # A reader sees the producer's output through any folded view (reshape, transpose, slice,
        # expand): with other labels the shapes may differ. With the very same labels only a
        # repeat_interleave, which keeps them, changes a size, and only by a whole multiple; or a
        # split of an inner dimension flattened back into the outer one (Qwen3-Next's query heads
        # cut from their packed projection: [b, L, hk, 2dk + 2dv] -> [b, L, hk dk]), a whole divisor.
        if t.dims == out.dims and any(a % b and b % a for a, b in zip(t.shape, out.shape, strict=True)):
            raise ValueError(f"{where}: shape {list(t.shape)} disagrees with its producer's output "
                             f"{list(out.shape)} (same dims {list(t.dims)})")
    # a label is one dimension of the op: every operand carrying it has its size - but for 1
    # (broadcast) and, in an attention, grouped-query K/V heads (a divisor of the query heads)
    sizes: dict[str, tuple[int, str]] = {}
    for where, t in refs:
        for d, n in zip(t.dims, t.shape, strict=True):
            if n == 1:
                continue
            first = sizes.setdefault(d, (n, where))
            grouped = op.kind == "attention" and (first[0] % n == 0 or n % first[0] == 0)
            # routing moves T tokens' k copies into E buffers of C = ceil(T k / E): the token label
            # has one size on the tokens' side and another on the buffers' side
            grouped |= op.kind in ("dispatch", "combine")
            if first[0] != n and not grouped:
                raise ValueError(f"{where}: dimension {d!r} has size {n}, but {first[0]} in {first[1]}")


def _check_params(ops: Iterable[Op]) -> None:
    """One parameter name is one tensor: its shape and dtype agree wherever it is read, exactly
    one op owns it (stores, updates and synchronises it), and that op comes first."""
    first: dict[str, tuple[Op, ParamRef]] = {}
    for op in ops:
        for p in op.params:
            if p.name not in first:
                if not p.owner:
                    raise ValueError(f"op {op.name!r} parameter {p.name!r}: owner is false, but no earlier op "
                                     f"holds it")
                first[p.name] = (op, p)
                continue
            holder, q = first[p.name]
            if p.owner and holder.name != op.name:
                raise ValueError(f"op {op.name!r} parameter {p.name!r}: already owned by op {holder.name!r} "
                                 f"(a tied parameter sets owner false)")
            if math.prod(p.shape) != math.prod(q.shape) or p.dtype != q.dtype:
                raise ValueError(f"op {op.name!r} parameter {p.name!r}: {list(p.shape)} {p.dtype} disagrees with "
                                 f"op {holder.name!r}'s {list(q.shape)} {q.dtype}")


def _topological_order(ops: Iterable[Op]) -> list[Op] | None:
    """Kahn's algorithm, taking ready ops in file order (so layers stay in order); None on a cycle."""
    import heapq

    ops = list(ops)
    by_name = {op.name: op for op in ops}
    pos = {op.name: i for i, op in enumerate(ops)}
    indeg = {op.name: 0 for op in ops}
    users: dict[str, list[str]] = {op.name: [] for op in ops}
    for op in ops:
        for src in {t.source for t in op.inputs if t.source is not None}:
            if src in by_name:
                indeg[op.name] += 1
                users[src].append(op.name)
    heap = [(pos[n], n) for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order: list[Op] = []
    while heap:
        _, name = heapq.heappop(heap)
        order.append(by_name[name])
        for u in users[name]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, (pos[u], u))
    return order if len(order) == len(ops) else None


def load_graph(path: str | Path) -> OpGraph:
    """Read a graph JSON file; every problem becomes an InputError naming the file."""
    return parse_graph(read_json(path, "graph file"), origin=str(path))


def parse_graph(data: object, origin: str = "graph") -> OpGraph:
    try:
        return OpGraph.model_validate(data)
    except ValidationError as e:
        raise invalid(e, f"{origin}: invalid graph") from None
