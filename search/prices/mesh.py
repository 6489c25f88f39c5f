"""Device meshes and the per-op configuration space on a mesh.

The devices are factored into named axes ``pp x dp x tp`` (pp is the outermost, tp the innermost
and fastest-varying, so a tp group of at most a node's size stays inside a node). On a mesh, an
op's *configuration* assigns every axis of size > 1 either one of the op's splittable dimension
labels or replication.

Each axis has one *role*, because torch's parallel APIs work per mesh dimension (docs/design.md, Strategy space:
every configuration offered must be executable as planned):
- ``data``: every op that carries the batch splits it there, the others (a position embedding)
  replicate; it runs as DDP / ZeRO / FSDP2 over that dimension;
- ``tensor``: no op splits the batch; each op splits one of its own dimensions (Megatron's
  column / row / head / sequence parallelism) or replicates; it runs as ``parallelize_module``.
- ``expert``: the ops of routed experts (those that carry the ``expert`` label: the grouped
  GEMMs and the activation between them) split the experts, every other op the batch, as on a
  data axis. Each rank holds experts / n experts and receives their tokens from the other ranks
  of the axis by all-to-all (dispatch) and sends the results back (combine); the expert weights'
  gradients are then synchronised only over the data axes, across the ranks holding the same
  experts. Offered only for graphs with experts (expert_meshes).
- ``context``: every op splits the sequence (``seq``), as a data axis splits the batch, and the
  parameters are replicated there with their gradients synchronised over it as over a data axis
  (FSDP2 / DDP run over data x context as one group, as torchtitan does). Attention needs every
  key and value of the sequence: its queries stay local and the K/V shards travel around the ring
  of the axis (ring attention, torch's ``context_parallel``), priced in the attention op's own
  cost (search/prices/costmodel.py). Ops that see the tokens flattened (``[batch x seq, vocab]``
  into the loss) split that flattened dimension, which carries the batch label: on a context axis
  the two shardings are the same local tokens. Offered for long sequences (context_meshes).
An axis on which most ops split the batch but one op splits its hidden size would need gathers
that DDP does not perform, so that mix is not in the space.

From a configuration follow the DTensor placements of every operand:
``Shard(label)`` where the operand carries the label, otherwise ``Replicate()`` for inputs and
parameters (whose gradient then becomes ``Partial()``) and ``Partial()`` for an output whose op
reduced over the label (a row-parallel Linear).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from search.errors import InputError
from search.models.graph import Op, OpGraph, ParamRef, TensorRef, label_size
from search.prices.cluster import Cluster

REPLICATE = None  # a configuration's entry for "this axis replicates the op"
DATA, TENSOR, EXPERT, CONTEXT = "data", "tensor", "expert", "context"
ROLES = (DATA, TENSOR, EXPERT, CONTEXT)
EXPERT_LABEL = "expert"  # the experts' dimension label (search/models/moe.py)
SEQ_LABEL = "seq"  # the sequence's dimension label (capture labels token ids [batch, seq])
# Context axes are offered from this sequence length on: below it activations are small next to
# the weights and the ring's K/V exchange, and every extra mesh slows the search
CONTEXT_MIN_SEQ = 8192
CONTEXT_SIZES = (2, 4, 8)  # context-parallel degrees offered (torchtitan's usual range)
# Op kinds whose sequence dimension is a row dimension like the batch (each token computed on its
# own) wherever no parameter carries it: they split the sequence with no communication
SEQ_LOCAL_KINDS = ("linear", "embedding")


def default_role(axis_name: str) -> str:
    """The role of an axis named the way mesh_candidates names them (for plans written without roles)."""
    return {"dp": DATA, "ep": EXPERT, "cp": CONTEXT}.get(axis_name, TENSOR)


@dataclass(frozen=True)
class MeshAxis:
    name: str
    size: int
    stride: int  # how many devices apart consecutive members of one group are
    role: str  # "data", "tensor", "expert" or "context" (see the module docstring)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"mesh axis {self.name!r}: role must be one of {', '.join(ROLES)}, not {self.role!r}")


@dataclass(frozen=True)
class Mesh:
    pp: int
    axes: tuple[MeshAxis, ...]  # the axes an op configuration assigns (pp excluded)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.pp, *(a.size for a in self.axes))

    @property
    def num_devices(self) -> int:
        n = self.pp
        for a in self.axes:
            n *= a.size
        return n

    def describe(self) -> str:
        return " x ".join([f"pp{self.pp}"] + [f"{a.name}{a.size}" for a in self.axes])

    @cached_property
    def active(self) -> tuple[int, ...]:
        """Indices of the axes with size > 1: the only ones a configuration needs to choose for."""
        return tuple(i for i, a in enumerate(self.axes) if a.size > 1)

    # The searches key their memos (op tables, configurations, edges) by mesh, hundreds of
    # thousands of lookups in a pipeline search: the dataclass's hash of (pp, axes) is found once
    # per mesh instead of rehashing every axis each time (the same value, so the same behaviour).
    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.pp, self.axes))

    def __getstate__(self) -> dict[str, object]:
        # a str's hash differs between processes: a pickled mesh finds its hash again
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def mesh_candidates(cluster: Cluster, tp_sizes: list[int] | None = None, tensor_2d: bool = False) -> list[Mesh]:
    """The meshes the outer loop of the search tries: every tp that divides both the node size
    and the device count (tensor parallelism beyond a node is never cheaper than using the
    fast links; inter-node sharding is still reachable through the dp axis), dp the rest; with
    `tensor_2d`, also the 2-D tensor meshes (`tensor_2d_meshes`)."""
    n, per_node = cluster.num_devices, cluster.devices_per_node
    if tp_sizes is None:
        tp_sizes = [t for t in range(1, per_node + 1) if per_node % t == 0 and n % t == 0]
    meshes = []
    for tp in tp_sizes:
        if n % tp:
            continue
        dp = n // tp
        meshes.append(Mesh(pp=1, axes=(MeshAxis("dp", dp, tp, DATA), MeshAxis("tp", tp, 1, TENSOR))))
    return meshes + (tensor_2d_meshes(cluster) if tensor_2d else [])


def tensor_2d_meshes(cluster: Cluster) -> list[Mesh]:
    """dp x tpa x tpb: two tensor axes, each of 2 or more, inside a node together (2-D tensor
    parallelism: an op splits a different dimension on each, `_nested`), tpb innermost."""
    n, per_node = cluster.num_devices, cluster.devices_per_node
    out = []
    for a in range(2, per_node + 1):
        for b in range(2, per_node // a + 1):
            if per_node % (a * b) or n % (a * b):
                continue
            out.append(Mesh(pp=1, axes=(MeshAxis("dp", n // (a * b), a * b, DATA), MeshAxis("tpa", a, b, TENSOR),
                                        MeshAxis("tpb", b, 1, TENSOR))))
    return out


Config = tuple[str | None, ...]  # one entry per mesh axis: a label, or None to replicate


def _all_sizes(op: Op) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    tensors: list[TensorRef | ParamRef] = [*op.inputs, op.output, *op.params]
    for t in tensors:
        for d, s in zip(t.dims, t.shape, strict=True):
            sizes.setdefault(d, []).append(s)
    return sizes


# Op kinds with parameters that torch's parallelize_module has a style for (Colwise/Rowwise for
# Linear and Embedding, SequenceParallel for norms; worker/analyze.py): on a tensor axis any other
# op with parameters (a convolution, say) can only replicate, or the plan could not run as priced.
TENSOR_STYLED_KINDS = ("linear", "embedding", "norm")


def axis_choices(op: Op, axis: MeshAxis, batch: str) -> list[str | None]:
    """What `op` may do on one axis: on a data axis split the batch when it carries one (an op
    that reads the batch but cannot split it has no choice there), else replicate; on a tensor
    axis replicate or split any of its dimensions but the batch (an op with parameters only if a
    parallel style exists for its kind)."""
    if axis.size == 1:
        return [REPLICATE]
    if axis.role == CONTEXT:
        return context_choices(op, batch)
    if axis.role == EXPERT and EXPERT_LABEL in op.splittable:
        return [EXPERT_LABEL]
    if axis.role in (DATA, EXPERT):
        if batch in op.splittable:
            return [batch]
        carries = any(batch in t.dims for t in (*op.inputs, op.output))
        return [] if carries else [REPLICATE]
    if op.params and (op.kind not in TENSOR_STYLED_KINDS or not op.styled):
        return [REPLICATE]  # a module with parameters splits only under a parallel style
    if EXPERT_LABEL in op.labels() and op.kind != "dispatch":
        # the routed experts' ops (worker/experts.py runs them on plain tensors, routing tokens
        # by data-dependent indices that DTensor placements do not pass through)
        return [REPLICATE]
    if op.kind == "embedding":
        # a style shards the table (Rowwise: the vocabulary, Colwise: the width), never the
        # lookups: T5's relative-position bias reads a [q, k] grid of buckets, whose rows no
        # style splits
        table = {d for p in op.params for d in p.dims}
        return [REPLICATE] + [lab for lab in op.splittable if lab != batch and lab in table]
    if op.kind == "scan":
        # a scan's heads (Mamba's channels) each carry their own state and could split, but the
        # executor runs transformers' layer code, which reshapes by its full head counts and
        # convolves every channel: no parallel style shards it (search/models/scan.py)
        return [REPLICATE]
    return [REPLICATE] + [lab for lab in op.splittable if lab != batch]


def splits_sequence(op: Op) -> bool:
    """Whether `op` can split the sequence with its queries local: a dimension it may shard
    anyway (norms, pointwise ops), a row dimension of a Linear or Embedding (no parameter carries
    it), or attention's, whose keys and values then travel the ring (ring attention)."""
    if SEQ_LABEL in op.splittable or op.kind == "attention":
        return True
    return (op.kind in SEQ_LOCAL_KINDS and SEQ_LABEL in op.output.dims
            and not any(SEQ_LABEL in p.dims for p in op.params))


def context_choices(op: Op, batch: str) -> list[str | None]:
    """What `op` may do on a context axis: split the sequence wherever it carries one (or nothing:
    an op that reads the sequence but cannot split it locally, a softmax over it, say, would need
    the whole sequence gathered); an op that sees the tokens flattened into the batch dimension
    splits that; an op without either replicates."""
    carries = {d for t in (*op.inputs, op.output) for d in t.dims}
    if SEQ_LABEL in carries:
        return [SEQ_LABEL] if splits_sequence(op) else []
    if batch in carries:
        return [batch] if batch in op.splittable else []
    return [REPLICATE]


def context_code(code: str, batch: str) -> str:
    """A placement on a context axis with the flattened tokens' shard named as the sequence's:
    what an op splits there as 'batch' is the same local tokens (context_meshes admits no graph
    where the batch label stands for anything else there)."""
    return f"S:{SEQ_LABEL}" if code == f"S:{batch}" else code


# op_configs per (op object, mesh, batch label): the pipeline search asks for the same op's
# configurations on the same sub-mesh once per stage weighting and ZeRO stage. Keyed by the op's
# identity (the op is kept in the entry, so its id cannot be reused while cached); bounded.
_CONFIGS: dict[tuple[int, Mesh, str], tuple[Op, list[Config]]] = {}
_CONFIGS_MAX = 200_000


def op_configs(op: Op, mesh: Mesh, batch: str = "batch") -> list[Config]:
    """Every configuration of `op` on `mesh` (`batch`: the graph's batch label), in a canonical
    order (replication first), keeping only those whose sharded dimensions divide evenly on
    every operand (DTensor would otherwise pad, and the executor must run exactly what was
    costed). Empty when the op cannot run on the mesh (a batch that does not split over dp)."""
    key = (id(op), mesh, batch)
    hit = _CONFIGS.get(key)
    if hit is not None and hit[0] is op:
        return list(hit[1])
    struct, sizes = _config_structure(op)
    # the sizes only as far as any shard could divide them: a shard is a product of axes, so it
    # divides a size exactly when it divides the size's gcd with the product of every axis
    n = math.prod(ax.size for ax in mesh.axes)
    alike = (struct, tuple(math.gcd(s, n) for s in sizes), mesh, batch)
    out = _ALIKE_CONFIGS.get(alike)
    if out is None:
        out = _op_configs(op, mesh, batch)
        if len(_ALIKE_CONFIGS) >= _CONFIGS_MAX:
            _ALIKE_CONFIGS.clear()
        _ALIKE_CONFIGS[alike] = out
    if len(_CONFIGS) >= _CONFIGS_MAX:
        _CONFIGS.clear()
    _CONFIGS[key] = (op, out)
    return list(out)


# op_configs per (what `_op_configs` reads of an op, the op's sizes up to what divides them, mesh,
# batch label): an op of every micro-batch graph of the pipeline search configures as the full
# batch's does, unless a shard no longer divides its micro-batch (a few thousand configurations
# found, a few hundred distinct for GPT-3). Bounded.
_ALIKE_CONFIGS: dict[tuple[int, tuple[int, ...], Mesh, str], list[Config]] = {}
# per op object: the number of what `_op_configs` reads of it but its sizes (see
# `_config_structure`), and its sizes in `_all_sizes`'s order. Keyed by identity, the op kept alive
# in the entry; bounded.
_STRUCTURE: dict[int, tuple[Op, int, tuple[int, ...]]] = {}
_STRUCTURE_NUMBERS: dict[tuple, int] = {}


def _config_structure(op: Op) -> tuple[int, tuple[int, ...]]:
    """What `_op_configs` (with `axis_choices`, `context_choices`, `splits_sequence`, `_all_sizes`)
    reads of `op` but its sizes, numbered (its kind, whether a style splits it, its splittable
    labels, and its tensors' and parameters' dimension labels, which stand for whether it has
    parameters and for its labels), and its sizes in `_all_sizes`'s order."""
    hit = _STRUCTURE.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1], hit[2]
    tensors: list[TensorRef | ParamRef] = [*op.inputs, op.output, *op.params]
    shape = (op.kind, op.styled, op.splittable, len(op.inputs), len(op.params), tuple(t.dims for t in tensors))
    if len(_STRUCTURE_NUMBERS) >= _CONFIGS_MAX:
        _STRUCTURE_NUMBERS.clear()
        _ALIKE_CONFIGS.clear()  # its numbers mean nothing now
        _STRUCTURE.clear()
    number = _STRUCTURE_NUMBERS.setdefault(shape, len(_STRUCTURE_NUMBERS))
    sizes = tuple(s for t in tensors for s in t.shape)
    if len(_STRUCTURE) >= _CONFIGS_MAX:
        _STRUCTURE.clear()
    _STRUCTURE[id(op)] = (op, number, sizes)
    return number, sizes


def _op_configs(op: Op, mesh: Mesh, batch: str) -> list[Config]:
    sizes = _all_sizes(op)
    choices = [axis_choices(op, a, batch) for a in mesh.axes]
    tensor = [i for i, a in enumerate(mesh.axes) if a.role == TENSOR and a.size > 1]
    out: list[Config] = []
    for combo in itertools.product(*choices):
        if len(tensor) > 1 and _nested(combo, tensor):
            continue
        shards: dict[str, int] = {}
        for ax, lab in zip(mesh.axes, combo, strict=True):
            if lab is not None:
                shards[lab] = shards.get(lab, 1) * ax.size
        if all(all(s % k == 0 for s in sizes.get(lab, [1])) for lab, k in shards.items()):
            out.append(tuple(combo))
    return out


def _nested(combo: tuple[str | None, ...], tensor: list[int]) -> bool:
    """Two tensor axes splitting one dimension of the op. 2-D tensor parallelism splits two
    different dimensions (Optimus, Megatron-LM's 2-D): DTensor nests the shards of one dimension
    in mesh order, so moving such a tensor into or out of that nesting costs gathers the per-axis
    prices do not count (worker/analyze.py executes both axes as priced only without it)."""
    labels = [combo[i] for i in tensor if combo[i] is not None]
    return len(labels) != len(set(labels))


def data_ways(mesh: Mesh) -> int:
    """Into how many shards the data (and expert) axes split the batch."""
    return math.prod(a.size for a in mesh.axes if a.role in (DATA, EXPERT))


def num_experts(graph: OpGraph) -> int:
    """How many experts the graph's MoE layers hold (the fewest, if they differ); 0 without experts."""
    sizes = [op.label_size(EXPERT_LABEL) for op in graph.ops if EXPERT_LABEL in op.splittable]
    return min(sizes) if sizes else 0


def expert_meshes(graph: OpGraph, meshes: list[Mesh]) -> list[Mesh]:
    """For a graph with routed experts, each mesh with a data axis also factored as data x expert
    for every expert-parallel size that divides both the data axis and the number of experts
    (the expert axis inside the data axis, next to tp: its all-to-alls are the most frequent
    collectives after tensor parallelism's, so they take the faster links first). Not beside a
    tensor axis: the executor's experts module (worker/experts.py) exchanges plain tensors, and
    tensor parallelism would hand it DTensors, so such a plan could not run as priced."""
    experts = num_experts(graph)
    if experts < 2:
        return meshes
    out = list(meshes)
    for mesh in meshes:
        if any(a.role == EXPERT or (a.role == TENSOR and a.size > 1) for a in mesh.axes):
            continue
        for i, a in enumerate(mesh.axes):
            if a.role != DATA:
                continue
            for ep in range(2, a.size + 1):
                if a.size % ep or experts % ep:
                    continue
                split = (MeshAxis(a.name, a.size // ep, a.stride * ep, DATA), MeshAxis("ep", ep, a.stride, EXPERT))
                out.append(Mesh(pp=mesh.pp, axes=mesh.axes[:i] + split + mesh.axes[i + 1:]))
    return out


def runs_with_zero(mesh: Mesh, zero: int) -> bool:
    """Whether ZeRO stage `zero` runs on `mesh` as priced: not ZeRO-1 beside an expert axis, where
    torch's ZeroRedundancyOptimizer would shard each rank's own experts' states over ranks that
    hold other experts (ZeRO-2 and -3 shard per expert group), nor beside a context axis, where it
    would average the gradients over the data axis only, not data x context (the executor refuses
    both)."""
    return not (zero == 1 and any(a.role in (EXPERT, CONTEXT) and a.size > 1 for a in mesh.axes))


def sequence_length(graph: OpGraph) -> int:
    """The sequence length the graph's attention runs over (0 without attention on `seq`)."""
    sizes = [op.label_size(SEQ_LABEL) for op in graph.ops
             if op.kind == "attention" and any(SEQ_LABEL in t.dims for t in op.inputs)]
    return min(sizes) if sizes else 0


def context_blocker(graph: OpGraph) -> str | None:
    """Why no context axis can run `graph` as priced, or None. The batch label on a tensor without
    the sequence must be the tokens flattened (batch x seq elements, as the loss of a language
    model reads them): a pooled [batch, hidden] (BERT's CLS, a classifier) depends on the whole
    sequence, which no rank of a context axis holds."""
    seq = sequence_length(graph)
    if seq < 2:
        return "no attention over a sequence"
    batch = graph.batch_label
    rows = {op.label_size(batch) for op in graph.ops if SEQ_LABEL in op.output.dims and batch in op.output.dims}
    for op in graph.ops:
        for t in (*op.inputs, op.output):
            if batch in t.dims and SEQ_LABEL not in t.dims:
                n = label_size((t,), batch)
                if not any(n == b * seq for b in rows):
                    return f"op {op.name!r} reads the batch without the sequence (pooled over it)"
    learned = learned_position_embedding(graph)
    if learned is not None:
        return f"op {learned.name!r} is a learned position embedding"
    return None


def learned_position_embedding(graph: OpGraph) -> Op | None:
    """An embedding looked up along the sequence without reading it (GPT-2's, BERT's positions):
    the model looks positions 0 .. t-1 up for the t tokens it holds, which on a context axis's
    share of the sequence are the wrong positions (rotary tables take each token's own)."""
    return next((op for op in graph.ops if op.kind == "embedding" and SEQ_LABEL in op.output.dims
                 and not any(SEQ_LABEL in t.dims for t in op.inputs)), None)


def context_meshes(graph: OpGraph, meshes: list[Mesh], min_seq: int = CONTEXT_MIN_SEQ) -> list[Mesh]:
    """For a graph whose attention runs over at least `min_seq` tokens, each mesh with a data axis
    (and no expert or tensor axis, pp 1) also factored as data x context for every size of
    CONTEXT_SIZES that divides the data axis and cuts the sequence into 2 x cp chunks (ring
    attention's load-balanced sharding: rank r holds chunks r and 2 cp - 1 - r). The context axis
    sits inside the data axis: its ring exchanges K/V every layer, so it takes the faster links
    before data parallelism's once-a-step gradient sync. The executor (worker/context.py) runs
    ring attention on plain tensors, so not beside tensor parallelism's DTensors, the experts'
    all-to-all, or inside a pipeline stage."""
    seq = sequence_length(graph)
    if seq < max(min_seq, 2) or context_blocker(graph) is not None:
        return meshes
    out = list(meshes)
    for mesh in meshes:
        if mesh.pp > 1 or any(a.role in (EXPERT, CONTEXT) or (a.role == TENSOR and a.size > 1) for a in mesh.axes):
            continue
        for i, a in enumerate(mesh.axes):
            if a.role != DATA:
                continue
            for cp in CONTEXT_SIZES:
                if a.size % cp or seq % (2 * cp):
                    continue
                split = (MeshAxis(a.name, a.size // cp, a.stride * cp, DATA), MeshAxis("cp", cp, a.stride, CONTEXT))
                out.append(Mesh(pp=mesh.pp, axes=mesh.axes[:i] + split + mesh.axes[i + 1:]))
    return out


def unplaceable_op(ops: Iterable[Op], mesh: Mesh, batch: str) -> Op | None:
    """The first op with no configuration on `mesh` (the batch does not split over its data
    axes, or the op reads the batch without being able to split it), else None."""
    return next((op for op in ops if not op_configs(op, mesh, batch)), None)


def placeable_meshes(graph: OpGraph, meshes: list[Mesh], ops: Sequence[Op] | None = None) -> list[Mesh]:
    """The meshes every op of `graph` can run on, with their expert-parallel variants for a graph
    with routed experts (expert_meshes) and context-parallel ones for long sequences
    (context_meshes); InputError naming why when there are none. `ops`: the ops to test, where
    the caller knows the others configure as one of them does (a block stack's copies of its
    template layer); default every op of the graph."""
    tested = graph.ops if ops is None else ops
    out, why = [], []
    blocker = context_blocker(graph)
    for mesh in context_meshes(graph, expert_meshes(graph, meshes)):
        if blocker is not None and any(a.role == CONTEXT and a.size > 1 for a in mesh.axes):
            why.append(f"{mesh.describe()}: no context axis: {blocker}")
            continue
        odd = unplaceable_op(tested, mesh, graph.batch_label)
        if odd is None:
            out.append(mesh)
        else:
            why.append(f"{mesh.describe()}: op {odd.name!r} cannot split its batch over {data_ways(mesh)} "
                       f"data-parallel ranks" + (" or its sequence over the context axis"
                                                 if any(a.role == CONTEXT for a in mesh.axes) else ""))
    if meshes and not out:
        raise InputError("no device mesh can run this model: " + "; ".join(why)
                         + " (choose a global batch divisible by the data-parallel size, or fewer devices)")
    return out


# ---- placements --------------------------------------------------------------------------------
# A placement on one axis is encoded as a string: "R", "P" or "S:<label>".
def input_placement(cfg: Config, t: TensorRef) -> tuple[str, ...]:
    return tuple("R" if lab is None or lab not in t.dims else f"S:{lab}" for lab in cfg)


def input_grad_placement(cfg: Config, t: TensorRef) -> tuple[str, ...]:
    """The gradient an op sends back for one of its inputs: sharded like the input, Partial on
    axes that split a label the input does not carry (each shard holds a partial sum)."""
    return tuple("R" if lab is None else (f"S:{lab}" if lab in t.dims else "P") for lab in cfg)


def output_placement(cfg: Config, op: Op) -> tuple[str, ...]:
    return tuple("R" if lab is None else (f"S:{lab}" if lab in op.output.dims else "P") for lab in cfg)


def output_grad_placement(cfg: Config, op: Op) -> tuple[str, ...]:
    """The gradient an op needs for its output: Partial outputs need the full (replicated) gradient."""
    return tuple("R" if lab is None else (f"S:{lab}" if lab in op.output.dims else "R") for lab in cfg)


def param_placement(cfg: Config, dims: tuple[str, ...]) -> tuple[str, ...]:
    return tuple("R" if lab is None or lab not in dims else f"S:{lab}" for lab in cfg)


def shard_factor(placement: tuple[str, ...], mesh: Mesh) -> int:
    """By how much a tensor in this placement is divided on each device."""
    f = 1
    for p, ax in zip(placement, mesh.axes, strict=True):
        if p.startswith("S:"):
            f *= ax.size
    return f


def format_placement(placement: tuple[str, ...], dims: tuple[str, ...]) -> list[str]:
    """DTensor vocabulary: Shard(tensor dim), Replicate(), Partial()."""
    out = []
    for p in placement:
        if p == "R":
            out.append("Replicate()")
        elif p == "P":
            out.append("Partial()")
        else:
            out.append(f"Shard({dims.index(p[2:])})")
    return out
