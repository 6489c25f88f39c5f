"""From a Plan to what each rank executes, or a refusal that names the op (before any launch).

The Plan configures every op on every mesh axis (docs/design.md, Strategy space). torch's parallel APIs work per
module and per mesh dimension, so each axis of size > 1 must take one *role*:

- data: every op splits the batch on it (ops without a batch dimension, such as a position
  embedding, replicate). Runs as DDP / ZeRO / FSDP over that mesh dimension.
- tensor: no op splits the batch on it; ops split their own dimensions (column, row, heads,
  sequence) or replicate. Runs as ``parallelize_module`` styles over that mesh dimension.
- replicate: every op replicates: every rank of the axis computes the same thing.

An axis mixing roles (say, the batch for most ops and the hidden size of one embedding) has no
expression in those APIs and is refused, naming the first op that breaks the axis' role.

On the tensor axis the styles come from the ops' configurations: a Linear whose weight is split on
its output features is ``ColwiseParallel``, on its input features ``RowwiseParallel``; an
Embedding split on the vocabulary is ``RowwiseParallel``, on the hidden size ``ColwiseParallel``;
a norm split on the sequence is ``SequenceParallel``. Every edge on which the Plan changes a
tensor's placement must be carried by a module boundary: ``PrepareModuleInput`` on the outermost
module that contains the consumer but not the producer (so a module that reads its input's shape,
as attention does, sees the redistributed tensor), else the producer's own style or
``PrepareModuleOutput``. Ops between modules run on local shards and must need no communication.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import nn

from search import InputError, Plan
from search.models.capture import STYLE_MODULES
from search.models.graph import Op, OpGraph, ParamRef, block_layout
from search.models.seq2seq import SEQ2SEQ_KIND
from search.models.source import NOT_REBUILDABLE, ModelSource, source_spec
from search.models.zoo import TEST_MODELS, ZOO, ModelSpec
from search.prices.boundaries import Boundaries, exit_allowed
from search.prices.costmodel import COLLECTIVE_NAMES, NONE, forward_collective
from search.prices.mesh import (
    EXPERT_LABEL,
    SEQ_LABEL,
    input_grad_placement,
    input_placement,
    learned_position_embedding,
    output_grad_placement,
    output_placement,
    param_placement,
)
from worker.hfstages import NoPipeline
from worker.spec import ExecSpec, ExpectedComm, MeshDim, PipelineExec, StyleSpec
from worker.stages import pipe_of, pipe_p2p

# mesh roles over which the batch is split: an expert axis splits it for every op but the experts'
BATCH_ROLES = ("data", "expert")


class Unsupported(InputError):
    """The Plan (or this machine) cannot be executed as planned; the message says why."""


ROLE_DIM = {"data": "dp", "tensor": "tp", "expert": "ep", "context": "cp", "replicate": "rep"}


# models rebuilt from a plan's source (an HF config), by the name the plan gives them: the
# fingerprint of the source and its spec (a later source under the same name replaces it)
_SOURCED: dict[str, tuple[str, ModelSpec]] = {}


def model_spec(name: str, source: ModelSource | None = None) -> ModelSpec:
    """The spec that rebuilds a plan's model: from its source when the plan carries one (an HF
    config is rebuilt with transformers; an uploaded graph is refused), else the zoo's by name
    (plans written before sources were recorded), else a source given earlier in this process."""
    if source is not None and source.kind != "zoo":
        if source.kind == "graph":
            raise Unsupported(f"model {name!r} cannot be launched: {NOT_REBUILDABLE}")
        fp = source.fingerprint()
        known = _SOURCED.get(name)
        if known is None or known[0] != fp:
            spec = source_spec(source)
            if spec.name != name:
                raise Unsupported(f"the plan's model {name!r} is not the model its source builds ({spec.name!r})")
            _SOURCED[name] = (fp, spec)
        return _SOURCED[name][1]
    spec = ZOO.get(name) or TEST_MODELS.get(name)
    if spec is None and name in _SOURCED:
        return _SOURCED[name][1]
    if spec is None:
        raise Unsupported(f"model {name!r} is not in the zoo and the plan carries no source to rebuild it from "
                          f"(plans of HF configs record theirs; known zoo models: {', '.join([*ZOO, *TEST_MODELS])})")
    return spec


def source_key(name: str) -> str:
    """What distinguishes models of one name: the fingerprint of the source it was rebuilt from."""
    known = _SOURCED.get(name)
    return known[0] if known is not None else ""


def op_configs(plan: Plan, graph: OpGraph) -> dict[str, tuple[str | None, ...]]:
    """Every graph op's configuration from the Plan (layer i of a stack reads its variant, whose
    ops carry layer 0's names)."""
    out: dict[str, tuple[str | None, ...]] = {}
    for o in plan.ops:
        out[o.op] = tuple(None if c == "R" else c for c in o.config)
    for bp in plan.blocks:
        info = next((b for b in graph.blocks if b.prefix == bp.prefix), None)
        if info is None or len(info.layers) != len(bp.layer_variant):
            raise Unsupported(f"plan's block stack {bp.prefix!r} does not match the model's")
        # a layer of a periodic stack holds `period` module layers: layer i's module layer k is
        # the model's first + i * period + k
        first, period = block_layout(graph, info)
        zeros = [f"{bp.prefix}.{first + k}." for k in range(period)]
        for i, (names, v) in enumerate(zip(info.layers, bp.layer_variant, strict=True)):
            variant = bp.variants[v]
            if len(variant) != len(names):
                raise Unsupported(f"plan's block stack {bp.prefix!r}: a layer variant has {len(variant)} ops, "
                                  f"the model's layers {len(names)}")
            mine = [f"{bp.prefix}.{first + i * period + k}." for k in range(period)]
            for name, name0, o in zip(names, info.layers[0], variant, strict=True):
                # a variant is written in layer 0's names, its dimension labels too ('blocks.0.mlp.fc1.weight/d0')
                out[name] = tuple(None if c == "R" else _layer_label(c, graph.op(name0), graph.op(name), zeros, mine)
                                  for c in o.config)
    missing = [op.name for op in graph.ops if op.name not in out]
    if missing:
        raise Unsupported(f"plan has no configuration for op {missing[0]!r} of model {plan.model!r} "
                          f"(was it made for another model or batch?)")
    return out


def _layer_label(code: str, op0: Op, op: Op, zeros: list[str], mine: list[str]) -> str:
    """The label layer 0's `op0` splits as `code`, in layer i's `op`. The search configures every
    layer by the position of the label in the op's splittable dimensions (layer 0's tables serve
    all layers), so that position names it: a label the layer reads from outside keeps its name
    even when it is spelled in layer 0's (T5's position bias, made in block 0 and read by every
    block's attention: renamed to block 1's, it named no dimension of the op, whose output then
    read as a partial sum)."""
    if code in op0.splittable and len(op0.splittable) == len(op.splittable):
        return op.splittable[op0.splittable.index(code)]
    return _layer_name(code, zeros, mine)


def _layer_name(code: str, zeros: list[str], mine: list[str]) -> str:
    """A name written in layer 0's module layers, in layer i's."""
    for z, m in zip(zeros, mine, strict=True):
        if code.startswith(z):
            return m + code[len(z):]
    return code


Codes = tuple[str, ...]  # one placement code per tensor axis


def dtensor(code: str | Codes, dims: tuple[str, ...], from_end: bool = False) -> str:
    """A placement code of search.prices.mesh ('R', 'P', 'S:label') in DTensor's vocabulary for a tensor
    with these dimension labels; several codes (one per tensor axis) as a comma-separated list.
    `from_end`: the shard's dimension counted from the last (Shard(-1)), for a tensor that the
    module flattens inside its forward (its leading dimensions, so the trailing ones stay put)."""
    if isinstance(code, tuple):
        return ",".join(dtensor(c, dims, from_end) for c in code)
    if code == "R":
        return "Replicate()"
    if code == "P":
        return "Partial()"
    label = code[2:]
    if label not in dims:
        raise Unsupported(f"label {label!r} is not a dimension of the tensor at a module boundary")
    return f"Shard({dims.index(label) - (len(dims) if from_end else 0)})"


# ---- roles ------------------------------------------------------------------------------------
def axis_role(graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]], a: int, axis_name: str) -> str:
    batch = graph.batch_label
    users = Counter("batch" if c[a] == batch else "other" for c in cfgs.values() if c[a] is not None)
    if not users:
        return "replicate"
    if users["batch"] and users["other"]:
        odd = next(op for op in graph.ops if cfgs[op.name][a] not in (None, batch))
        raise Unsupported(
            f"op {odd.name!r} splits {cfgs[odd.name][a]!r} on mesh axis {axis_name!r} while {users['batch']} ops "
            f"split the batch on it: data parallelism (DDP/FSDP) and tensor parallelism (parallelize_module) "
            f"need separate mesh axes")
    if users["batch"]:
        for op in graph.ops:  # a replicated op on a data axis must not read the split batch
            if cfgs[op.name][a] is None and (batch in op.output.dims or any(batch in t.dims for t in op.inputs)):
                raise Unsupported(
                    f"op {op.name!r} replicates on mesh axis {axis_name!r} while the other ops split the batch "
                    f"on it: that needs the whole batch's activations on every rank, which data parallelism "
                    f"does not gather")
        return "data"
    return "tensor"


def runtime_mesh(plan: Plan, roles: list[str]) -> list[MeshDim]:
    """pp outermost, then the plan's axes in device order, adjacent axes of one role merged."""
    dims: list[MeshDim] = [MeshDim(name="pp", size=plan.mesh.pp, role="pp", plan_axes=["pp"])] if plan.mesh.pp > 1 else []
    ordered = sorted(zip(plan.mesh.axes, roles, strict=True), key=lambda x: -x[0].stride)
    for ax, role in ordered:
        if ax.size == 1:
            continue
        if role == "tensor" and any(d.role == "tensor" for d in dims):  # 2-D tensor parallelism: a dimension each
            dims.append(MeshDim(name="tp2", size=ax.size, role=role, plan_axes=[ax.name]))
        elif dims and dims[-1].role == role:
            last = dims.pop()
            dims.append(MeshDim(name=last.name, size=last.size * ax.size, role=role,
                                plan_axes=[*last.plan_axes, ax.name]))
        else:
            dims.append(MeshDim(name=ROLE_DIM[role], size=ax.size, role=role, plan_axes=[ax.name]))
    names = [d.name for d in dims]
    for n in set(names):
        if names.count(n) > 1:
            role = next(d.role for d in dims if d.name == n)
            raise Unsupported(f"the plan uses two separate mesh axes as {role} axes "
                              f"({', '.join(a for d in dims if d.name == n for a in d.plan_axes)}) "
                              f"with another axis between them; the executor maps each role to one mesh dimension")
    return dims


# ---- the tensor axis --------------------------------------------------------------------------
class _Modules:
    """The model's module tree (built on meta): leaves, containers, ancestors."""

    def __init__(self, model: nn.Module) -> None:
        self.by_name = dict(model.named_modules())

    def is_leaf(self, fqn: str) -> bool:
        m = self.by_name.get(fqn)
        return m is not None and fqn != "" and not any(True for _ in m.children())

    def ancestors(self, fqn: str) -> list[str]:
        """Callable modules containing `fqn` (itself included), outermost first, root excluded."""
        if not fqn:
            return []
        parts = fqn.split(".")
        out = []
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            m = self.by_name.get(name)
            if m is not None and not isinstance(m, (nn.ModuleList, nn.ModuleDict)):
                out.append(name)
        return out


class _TensorAxis:
    """The tensor axes of a plan (one, or two for 2-D tensor parallelism) as module styles and
    boundary conversions. Placements are tuples of codes, one per tensor axis: a tensor changes
    placement at a module boundary when it changes on any axis, and every axis converts there."""

    def __init__(self, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]], axes: tuple[int, ...],
                 names: tuple[str, ...], modules: _Modules, zero: int) -> None:
        self.g, self.cfgs, self.axes, self.mods, self.zero = graph, cfgs, axes, modules, zero
        self.axis = " x ".join(names)
        self.nd = len(axes) > 1
        self.ops = {op.name: op for op in graph.ops}
        self.per_module = Counter(op.module for op in graph.ops)
        self.consumers = graph.consumers()
        self.styles: dict[str, StyleSpec] = {}      # by op name: the op's own module style
        self.extra: list[StyleSpec] = []           # PrepareModuleInput/Output, in application order
        self.where: dict[tuple[str, str], str] = {}  # (producer, consumer) -> module that redistributes
        self.entries: dict[str, tuple[str, Codes]] = {}  # module -> (producer, target codes)
        self.entry_src: dict[str, Codes] = {}          # module -> the codes its entry converts from
        self.entry_style: dict[str, tuple[StyleSpec, tuple[str, ...]]] = {}  # module -> its hook, the dims it sees
        self.exits: dict[str, Codes] = {}              # producer -> target codes
        self.bounds = Boundaries(graph)

    # placements on the tensor axes, as codes 'R' | 'P' | 'S:label', one per axis
    def out(self, op: Op) -> Codes:
        p = output_placement(self.cfgs[op.name], op)
        return tuple(p[a] for a in self.axes)

    def inp(self, op: Op, i: int) -> Codes:
        p = input_placement(self.cfgs[op.name], op.inputs[i])
        return tuple(p[a] for a in self.axes)

    def label(self, op: Op) -> tuple[str | None, ...]:
        return tuple(self.cfgs[op.name][a] for a in self.axes)

    def params(self, op: Op, p: ParamRef) -> Codes:
        pl = param_placement(self.cfgs[op.name], p.dims)
        return tuple(pl[a] for a in self.axes)

    def own_leaf(self, op: Op) -> bool:
        """The op is the only op of a leaf module: its module boundary is the op's boundary (a
        module called once per time step holds one op per call, each leaving it alike)."""
        return self.mods.is_leaf(op.module) and (self.per_module[op.module] == 1
                                                 or self.bounds.calls_of_one_op.get(op.module, False))

    def style_of(self, op: Op) -> tuple[str | None, ...] | None:
        """Per tensor axis, the style that splits the op there (None where it replicates); None if
        no axis has one."""
        styles = tuple(self._axis_style(op, k) for k in range(len(self.axes)))
        return styles if any(styles) else None

    def _axis_style(self, op: Op, k: int) -> str | None:
        lab = self.label(op)[k]
        if lab is None:
            return None
        if op.params and not (op.kind in STYLE_MODULES and self.own_leaf(op)
                              and isinstance(self.mods.by_name[op.module], STYLE_MODULES[op.kind])):
            raise Unsupported(f"op {op.name!r} ({op.kind}) splits {lab!r} on tensor axis {self.axis!r}: "
                              f"parallelize_module has no style for this module")
        if op.kind not in STYLE_MODULES or not op.params:
            return None
        mod = self.mods.by_name[op.module]
        if op.kind == "embedding" and not op.inputs and type(mod).forward is not nn.Embedding.forward:
            # BART's learned positions: the style's input hook converts the module's arguments,
            # but the indices this lookup reads are made inside its forward, and stay plain tensors
            raise Unsupported(f"op {op.name!r} (embedding) splits {lab!r} on tensor axis {self.axis!r}: its module "
                              f"{type(mod).__name__} makes the indices it looks up inside its own forward, where "
                              f"no parallel style can turn them into DTensors")
        w = op.params[0]
        wp = self.params(op, w)[k]
        x = op.inputs[0].dims if op.inputs else ()
        if op.kind == "linear":
            if wp == f"S:{w.dims[0]}" and op.output.dims[-1] == lab:
                return "colwise"
            if len(w.dims) > 1 and wp == f"S:{w.dims[1]}" and x and x[-1] == lab:
                return "rowwise"
        elif op.kind == "embedding":
            if wp == f"S:{w.dims[0]}":
                return "rowwise"
            if len(w.dims) > 1 and wp == f"S:{w.dims[1]}" and op.output.dims[-1] == lab:
                return "colwise"
        elif op.kind == "norm" and wp == "R" and lab in x:
            return "sequence"
        raise Unsupported(f"op {op.name!r} ({op.kind}) splits {lab!r} on tensor axis {self.axis!r} in a way no "
                          f"parallelize_module style expresses (Colwise/Rowwise for Linear and Embedding, "
                          f"SequenceParallel for norms)")

    def natural(self, op: Op, styles: tuple[str | None, ...]) -> tuple[Codes, Codes]:
        """(input, output) placement codes the styles compute with, per axis (an axis without one
        replicates the op: its operands are whole there)."""
        pairs = [self._natural(op, st, k) if st else ("R", "R") for k, st in enumerate(styles)]
        return tuple(a for a, _ in pairs), tuple(b for _, b in pairs)

    def _natural(self, op: Op, style: str, k: int) -> tuple[str, str]:
        lab = self.label(op)[k]
        if style == "colwise":
            return "R", f"S:{lab}" if op.kind == "linear" else f"S:{op.params[0].dims[1]}"
        if style == "rowwise":
            return ("R", "P") if op.kind == "embedding" else (f"S:{lab}", "P")
        return f"S:{lab}", f"S:{lab}"  # sequence

    def check_params(self, op: Op, styles: tuple[str | None, ...]) -> None:
        """The Plan's parameter placements must be the ones the styles produce."""
        for k, style in enumerate(styles):
            if style is not None:
                self._check_params(op, style, k)

    def _check_params(self, op: Op, style: str, k: int) -> None:
        for i, p in enumerate(op.params):
            want = self.params(op, p)[k]
            if style == "colwise":
                got = f"S:{p.dims[0]}" if op.kind == "linear" else f"S:{p.dims[-1]}"
            elif style == "rowwise":
                got = f"S:{p.dims[1 if op.kind == 'linear' else 0]}" if (i == 0 or op.kind == "embedding") else "R"
            else:
                got = "R"
            if want != got:
                raise Unsupported(f"op {op.name!r}: the plan places {p.name} as {want} on tensor axis {self.axis!r}, "
                                  f"but {style} parallelism places it as {got}")

    def build(self) -> None:
        for op in self.g.ops:
            styles = self.style_of(op)
            if styles is None:
                if any(lab is not None and o == "P" for lab, o in zip(self.label(op), self.out(op), strict=True)):
                    raise Unsupported(f"op {op.name!r} ({op.kind}) would leave a partial sum on tensor axis "
                                      f"{self.axis!r} outside any module boundary where a style could reduce it")
                continue
            self.check_params(op, styles)
            nat_in, nat_out = self.natural(op, styles)
            named = "/".join(st or "replicated" for st in styles)
            if nat_out != self.out(op) or (op.inputs and nat_in != self.inp(op, 0)):
                raise Unsupported(f"op {op.name!r}: its placements on tensor axis {self.axis!r} are not those of "
                                  f"{named} parallelism")
            same = next((st for st in self.styles.values() if st.module == op.module), None)
            if same is not None:  # another call of the same module (a recurrent GEMM): one style serves all
                if same.axis_styles != [st or "" for st in styles]:
                    raise Unsupported(f"op {op.name!r}: module {op.module!r} runs as {same.style} in one call and "
                                      f"{named} in another on tensor axis {self.axis!r}")
                same.ops.append(op.name)
                self.styles[op.name] = same
                continue
            self.styles[op.name] = self._own_style(op, styles, nat_in, nat_out)
        edges = []
        for v in self.g.ops:
            for i, t in enumerate(v.inputs):
                # graph inputs: every rank loads them whole
                src = self.arrives(t.source, v) if t.source else ("R",) * len(self.axes)
                dst = self.inp(v, i)
                # several readers returning partial gradients (q, k, v reading ln1) convert where
                # they enter together, so autograd sums them and reduces once, as the plan prices
                if src != dst or (t.source and self._shared_gradient(t.source, v, i)):
                    edges.append((self.ops.get(t.source) if t.source else None, v, i, src, dst))
        # a conversion where a tensor leaves its producer's module serves every reader: decided
        # first, so a reader entering a module of its own (Phi-3's fused gate_up read by the MLP's
        # product and by its activation module) takes the converted tensor rather than asking for
        # a conversion of its own that the exit would contradict
        for u, v, i, src, dst in sorted(edges, key=lambda e: not self._exits_only(e[0], e[1])):
            self.redistribute(u, v, i, src, dst)
        self.nest_entries()
        self.schedule_calls()
        for op in self.g.ops:
            st = self.styles.get(op.name)
            if st and st.style in ("rowwise", "placed") and "Partial()" in (st.output_layout or "").split(","):
                raise Unsupported(f"op {op.name!r} (row-parallel) leaves a partial sum that no consumer reduces")

    def _own_style(self, op: Op, styles: tuple[str | None, ...], nat_in: Codes, nat_out: Codes) -> StyleSpec:
        """The op's module style: parallelize_module's own on one tensor axis; on two, a style that
        places every parameter, input and output on both (worker/parallelize.py Placed)."""
        if self.nd:
            x = op.inputs[0].dims if op.inputs else ()
            return StyleSpec(module=op.module, style="placed", ops=[op.name], use_local_output=True,
                             axis_styles=[st or "" for st in styles],
                             # an input the graph does not capture (positions made inside the model) is whole
                             input_layout=dtensor(nat_in, x), desired_input_layout=dtensor(nat_in, x),
                             output_layout=dtensor(nat_out, op.output.dims),
                             param_layouts={p.name.rpartition(".")[2]: dtensor(self.params(op, p), p.dims)
                                            for p in op.params})
        style = styles[0]
        assert style is not None  # one axis: style_of returns a style or None
        spec = StyleSpec(module=op.module, style=style, ops=[op.name], use_local_output=True, axis_styles=[style])
        if style == "sequence":
            spec.sequence_dim = op.inputs[0].dims.index(self.label(op)[0])
        if style == "rowwise":
            spec.output_layout = "Partial()"  # kept partial unless an edge below says otherwise
            if op.kind == "embedding":  # a vocabulary-parallel embedding reads whole ids, not a shard
                spec.input_layout = "Replicate()"
        return spec

    def arrives(self, prod: str, v: Op) -> Codes:
        """The placement prod's output reaches reader v in: prod's own, or, for a reader entering a
        module of its own beside a reader taking the tensor where prod's module ends, or inside a
        module another reader converts it at, that outer reader's (converted there or not, the
        tensor reaches everything inside so; search/prices/boundaries.py `outer_reader`)."""
        x = self.bounds.outer_reader_of(prod, v.name)
        if x is None:
            return self.out(self.ops[prod])
        xo = self.ops[x]
        return self.inp(xo, next(j for j, t in enumerate(xo.inputs) if t.source == prod))

    def gradient_wanted(self, prod: str, v: Op) -> tuple[str, ...]:
        """The placement (on every mesh axis) the gradient v returns for prod's output must reach:
        prod's output gradient's, or that of the outer reader v converts from (`arrives`)."""
        x = self.bounds.outer_reader_of(prod, v.name)
        if x is None:
            return output_grad_placement(self.cfgs[prod], self.ops[prod])
        return input_grad_placement(self.cfgs[x], next(t for t in self.ops[x].inputs if t.source == prod))

    def _shared_gradient(self, prod: str, v: Op, i: int) -> bool:
        """v is the first of several readers converting prod's output at one module, and the
        gradient needs a collective."""
        if v.name not in {self.bounds.first_reader.get((prod, c)) for c, _ in self.consumers[prod]}:
            return False
        got, want = input_grad_placement(self.cfgs[v.name], v.inputs[i]), self.gradient_wanted(prod, v)
        return any(forward_collective(got[a], want[a]) != NONE for a in self.axes)

    def redistribute(self, u: Op | None, v: Op, i: int, src: Codes, dst: Codes) -> None:
        """Carry the edge u -> v (input i) from placement src to dst at a module boundary: where
        it enters a module holding v but not u, else where it leaves u's own module."""
        key = (u.name if u else f"<input {i}>", v.name)
        apart = u is not None and self.bounds.outer_reader_of(u.name, v.name) is not None
        if u is not None and u.name in self.exits and not apart:  # already converted where it leaves its module
            if self.exits[u.name] != dst:
                raise Unsupported(f"the output of {u.name!r} is needed in two placements on tensor axis "
                                  f"{self.axis!r} ({self.exits[u.name]} and {dst} by {v.name!r})")
            self.where[key] = u.module
            return
        entry = self._entry(u, v)
        if entry and u is not None and not apart and self.reduces_on_exit(u, src, dst):
            self.convert_on_exit(u, v, i, src, dst, key)
        elif entry:
            self.convert_on_entry(u, v, i, src, dst, entry, key)
        elif u is None:
            raise Unsupported(f"op {v.name!r} needs a graph input split on tensor axis {self.axis!r} outside any module")
        else:
            self.convert_on_exit(u, v, i, src, dst, key)

    def _entry(self, u: Op | None, v: Op) -> list[str]:
        """The modules holding v but not u (outermost first): where the edge u -> v enters."""
        ua = self.mods.ancestors(u.module) if u else []
        return [m for m in self.mods.ancestors(v.module) if m not in ua]

    def _exits_only(self, u: Op | None, v: Op) -> bool:
        """The edge u -> v enters no module of v's that u is outside of: only u's exit converts it."""
        return u is not None and not self._entry(u, v)

    def reduces_on_exit(self, u: Op, src: Codes, dst: Codes) -> bool:
        """A row-parallel op's partial sum that every reader wants reduced alike is reduced by the
        op's own style as it leaves its module, even where the readers enter modules of their own
        (T5's attention output projection, read by the dropout module of the layer around it): a
        partial sum handed on as a local shard to another module's input hook would carry its
        gradient back marked partial, and the style's output layout would stay Partial()."""
        st = self.styles.get(u.name)
        if (st is None or st.style not in ("rowwise", "placed") or "P" not in src or u.name in self.exits
                or not self.own_leaf(u)):
            return False
        if not all(exit_allowed(a, b, True) for a, b in zip(src, dst, strict=True) if a != b):
            return False
        return all(self.inp(self.ops[c], j) == dst and tuple(self.ops[c].inputs[j].shape) == tuple(u.output.shape)
                   for c, j in self.consumers[u.name])

    def convert_on_entry(self, u: Op | None, v: Op, i: int, src: Codes, dst: Codes, entry: list[str],
                         key: tuple[str, str]) -> None:
        """PrepareModuleInput (or v's own style) on a module of `entry`, those holding v but not u."""
        pname = u.name if u else f"<input {i}>"
        readers = [self.ops[c] for c, _ in self.consumers[u.name]] if u else [v]

        def disagrees(m: str) -> Op | None:
            """A reader inside m that needs the tensor in another placement than dst."""
            for w in readers:
                if u is not None and self.bounds.outer_reader_of(u.name, w.name) is not None:
                    continue  # converts again where it enters a module inside, from what arrives
                if m in self.mods.ancestors(w.module):
                    for j, tw in enumerate(w.inputs):
                        if (tw.source == (u.name if u else None)) and self.inp(w, j) != dst:
                            return w
            return None

        # where the plan priced the conversion (search/prices/boundaries.py): the innermost module v
        # enters that is not its own, shared by the readers entering it; a module below it that
        # reads its input's shape (attention) sees the converted tensor
        at = self.bounds.conversion_module(u, v) if u is not None else entry[0]
        m_in = at if at in entry else entry[0]
        w = disagrees(m_in)
        if w is not None:
            raise Unsupported(f"ops {v.name!r} and {w.name!r} inside module {m_in!r} need the output of "
                              f"{pname!r} in different placements on tensor axis {self.axis!r}")
        prev = self.entries.get(m_in)
        if prev is not None:
            # a module called once per time step converts each call's input alike, in its own hook
            again = ((self.bounds.calls_of_one_op.get(m_in, False) or self.one_tensor_per_call(m_in))
                     and prev[1] == dst and self.entry_src.get(m_in) == src)
            if prev != (pname, dst) and not again and (self.nd or not self.one_tensor_per_call(m_in)):
                raise Unsupported(f"module {m_in!r} receives two tensors that the plan redistributes "
                                  f"(from {prev[0]!r} and {pname!r}); PrepareModuleInput here handles one")
            self.where[key] = m_in
            return
        inside = [w for w in readers if m_in in self.mods.ancestors(w.module)]
        dims = v.inputs[i].dims  # the tensor as the module receives it, after any view of the producer's
        vst = self.styles.get(v.name)
        if m_in == v.module and vst and vst.style in ("colwise", "rowwise", "placed"):
            vst.input_layout = dtensor(src, dims)
            self.entry_style[m_in] = (vst, dims)
        else:
            self.refuse_ambiguous_entry(m_in, pname, tuple(v.inputs[i].shape))
            # a DTensor may flow into the module only if every reader is a style that accepts one
            dt_ok = all(w.name in self.styles for w in inside)
            # v reads the tensor with fewer dimensions than u made it: the module received u's
            # tensor and flattened its leading dimensions inside (GPT-2's Conv1D views [b, s, n]
            # as [b*s, n]), so the shard is where v's trailing dimensions put it
            flat = u is not None and len(u.output.dims) > len(dims)
            self.extra.append(StyleSpec(module=m_in, style="prepare_input", input_layout=dtensor(src, dims, flat),
                                        desired_input_layout=dtensor(dst, dims, flat), use_local_output=not dt_ok,
                                        ops=[f"{pname} -> {v.name}"]))
            self.entry_style[m_in] = (self.extra[-1], dims)
        self.entries[m_in] = (pname, dst)
        self.entry_src[m_in] = src
        self.where[key] = m_in

    def nest_entries(self) -> None:
        """A module's input hook converts its first input for everything inside the module: a reader
        whose own conversion of that tensor lies at a module inside it (T5's layer norm, inside the
        attention layer whose residual add reads the layer's input too) receives the outer hook's
        result and converts from there (often nothing left to do: the plan priced a conversion for
        each, the outer one serves both)."""
        for m, (pname, _) in self.entries.items():
            if m not in self.entry_style or self.one_tensor_per_call(m):
                continue
            outer = [a for a in self.mods.ancestors(m)[:-1] if a in self.entries and self.entries[a][0] == pname]
            if not outer:
                continue
            arrives = self.entries[outer[-1]][1]
            st, dims = self.entry_style[m]
            st.input_layout = dtensor(arrives, dims)
            self.entry_src[m] = arrives

    def schedule_calls(self) -> None:
        """A module's input hook fires on every call. On a module called once per tensor whose calls
        the plan converts differently (T5's stack dropout: the embedding's output arrives split as the
        dropout reads it, the final norm's whole and is split there), each call gets its own layouts
        in forward order, a call converted elsewhere or not at all none (worker/parallelize.py)."""
        for st in self.extra:
            if st.style != "prepare_input" or not self.one_tensor_per_call(st.module):
                continue
            calls: list[list[str]] = []
            for w in self.g.ops:
                if w.module != st.module:
                    continue
                t = w.inputs[0]
                u = self.ops[t.source] if t.source else None
                key = (u.name if u else "<input 0>", w.name)
                src = self.out(u) if u else ("R",) * len(self.axes)
                converted = self.where.get(key) == st.module
                calls.append([dtensor(src, t.dims), dtensor(self.inp(w, 0), t.dims)] if converted else [])
            if any(c != [st.input_layout, st.desired_input_layout] for c in calls):
                if self.nd:
                    raise Unsupported(f"module {st.module!r} is called once per tensor and the plan converts its "
                                      f"calls differently on {len(self.axes)} tensor axes: not executed")
                st.call_layouts = calls

    def one_tensor_per_call(self, m: str) -> bool:
        """m is a leaf module called several times on one tensor each (ViT's one dropout after the
        attention and again after the MLP): its input hook sees each call's tensor as the first."""
        inside = [op for op in self.g.ops if m in self.mods.ancestors(op.module)]
        return (len(inside) > 1 and all(op.module == m for op in inside)
                and len({op.target for op in inside}) == 1 and all(len(op.inputs) == 1 for op in inside))

    def refuse_ambiguous_entry(self, m_in: str, pname: str, shape: tuple[int, ...]) -> None:
        """PrepareModuleInput converts the module's first input: right when the converted tensor is
        the only one of its shape that enters the module. MPT's MLP takes its input and the residual
        (`ffn(hidden, residual)`), both [batch, seq, hidden]: converting the residual there would
        convert the input instead, so such a plan is refused, naming both. A module called once
        per tensor (ViT's dropout) is not ambiguous: each call's tensor is its first."""
        if self.one_tensor_per_call(m_in):
            return
        entering: set[str] = set()
        for w in self.g.ops:
            if m_in not in self.mods.ancestors(w.module):
                continue
            for t in w.inputs:
                src = self.ops.get(t.source) if t.source is not None else None
                if tuple(t.shape) != shape or (src is not None and m_in in self.mods.ancestors(src.module)):
                    continue
                entering.add(t.source if t.source is not None else "<graph input>")
        if len(entering) > 1:
            raise Unsupported(f"module {m_in!r} receives {len(entering)} tensors of shape {list(shape)} "
                              f"({', '.join(sorted(map(repr, entering)))}) and the plan redistributes "
                              f"{pname!r} on tensor axis {self.axis!r}: PrepareModuleInput converts the first "
                              f"input only, which may be another")
        # (a graph input has no edge the search prices, nor a rule of it)
        if not pname.startswith("<input") and not self.bounds.enters_first(m_in, pname):
            raise Unsupported(f"the plan redistributes {pname!r} on tensor axis {self.axis!r} where it enters module "
                              f"{m_in!r}, whose first input is another tensor: PrepareModuleInput converts the first "
                              f"input only")

    def convert_on_exit(self, u: Op, v: Op, i: int, src: Codes, dst: Codes, key: tuple[str, str]) -> None:
        """u's own style or PrepareModuleOutput on u's module, when v's modules all hold u too."""
        if not self.own_leaf(u):
            raise Unsupported(f"op {u.name!r} -> op {v.name!r}: the plan redistributes on tensor axis {self.axis!r} "
                              f"({src} -> {dst}) where no module boundary lies between them")
        same_shape = tuple(v.inputs[i].shape) == tuple(u.output.shape)
        if not all(exit_allowed(a, b, same_shape) for a, b in zip(src, dst, strict=True) if a != b):
            raise Unsupported(f"op {u.name!r} -> op {v.name!r}: the plan changes the placement on tensor axis "
                              f"{self.axis!r} ({src} -> {dst}) as it leaves {u.module!r}, inside {v.module!r}: only a "
                              f"partial sum may be reduced there, or a tensor the reader takes as it is sharded "
                              f"(other changes would reach that module's code in a shape it does not expect)")
        # converted as it leaves u's module, the tensor is dst for every consumer: the readers in
        # the forward that reads it must want dst, and none may already have a conversion of its
        # own that expects src. A reader entering a module of its own converts from dst there, as
        # the plan prices it (BART's fc1 after a post-LN layer norm whose residual add, in the
        # layer's own forward, reads it split: search/prices/boundaries.py `outer_reader`).
        for c, j in self.consumers[u.name]:
            if self.bounds.outer_reader_of(u.name, c) is not None:
                continue
            if self.inp(self.ops[c], j) != dst or (u.name, c) in self.where:
                raise Unsupported(f"the output of {u.name!r} is needed in two placements on tensor axis "
                                  f"{self.axis!r} ({dst} by {v.name!r}, {self.inp(self.ops[c], j)} by {c!r}): "
                                  f"{v.name!r} reads it in the forward of {v.module!r}, so it is converted where "
                                  f"{u.module!r} ends, for every reader, and {c!r} would pay an unpriced conversion "
                                  f"back")
        ust = self.styles.get(u.name)
        dims = u.output.dims
        if ust and ust.style in ("colwise", "rowwise", "placed"):
            first = (None, "Partial()") if not self.nd else (dtensor(self.out(u), dims),)  # as the style leaves it
            if len(ust.ops) > 1 and ust.output_layout not in (*first, dtensor(dst, dims)):
                raise Unsupported(f"module {u.module!r} leaves its calls in different placements on tensor axis "
                                  f"{self.axis!r} ({ust.output_layout} and {dtensor(dst, dims)} after {u.name!r}); "
                                  f"its one style has one output layout")
            ust.output_layout = dtensor(dst, dims)
        else:
            self.extra.append(StyleSpec(module=u.module, style="prepare_output", output_layout=dtensor(src, dims),
                                        desired_output_layout=dtensor(dst, dims), use_local_output=True,
                                        ops=[f"{u.name} -> {v.name}"]))
        self.exits[u.name] = dst
        self.where[key] = u.module

    def style_list(self) -> list[StyleSpec]:
        """PrepareModuleInput before a module's own style (hooks run in registration order)."""
        pre = [s for s in self.extra if s.style == "prepare_input"]
        post = [s for s in self.extra if s.style == "prepare_output"]
        own = list({id(s): s for s in self.styles.values()}.values())  # calls of one module share theirs
        return pre + own + post

    def expected(self, unit: Callable[[str], str]) -> list[ExpectedComm]:
        """The collectives the cost model prices on this axis, each where the executor performs it:
        one per tensor and direction (search/prices/costmodel.py edge_costs, on its first reader's edge), plus the gradient
        synchronisation of parameters replicated over split activations (op_costs)."""
        out: list[ExpectedComm] = []
        for v in self.g.ops:
            for i, t in enumerate(v.inputs):
                x = None if t.source is None else self.bounds.outer_reader.get((t.source, v.name))
                if t.source is None or (x is None and not self.bounds.pays(t.source, v.name)):
                    continue  # a tensor's other readers share its first reader's conversion
                u = self.ops[t.source]
                # converted from prod's placement, or from the one its outer reader takes it in
                got, want = input_grad_placement(self.cfgs[v.name], t), self.gradient_wanted(u.name, v)
                src = self.arrives(u.name, v)
                mod = self.where.get((u.name, v.name), v.module)
                for k, a in enumerate(self.axes):
                    fk = forward_collective(src[k], self.inp(v, i)[k])
                    bk = forward_collective(got[a], want[a])
                    for phase, c in (("forward", fk), ("backward", bk)):
                        if c != NONE:
                            out.append(ExpectedComm(unit=unit(mod), module=mod, phase=phase, kind=COLLECTIVE_NAMES[c],
                                                    source=f"{u.name} -> {v.name}", dtensor=True))
            for lab in self.label(v):
                for p in v.params:
                    if lab is None or not p.owner or lab in p.dims or lab not in v.output.dims:
                        continue  # a label reduced away (row-parallel bias): the gradient is whole already
                    # an all-reduce: this is a tensor axis, and ZeRO shards over the data axes only
                    out.append(ExpectedComm(unit=unit(v.module), module=v.module, phase="backward", kind="all_reduce",
                                            source=f"{v.name} grad {p.name}"))
        return out


# ---- the whole plan ---------------------------------------------------------------------------
def analyze(plan: Plan, graph: OpGraph | None = None) -> ExecSpec:
    """The ExecSpec of a Plan, or Unsupported naming what cannot run as planned.

    The steps, in the order their refusals are checked: the mesh holds the plan's devices; the
    pipeline is one torch.distributed.pipelining can run; every op has a configuration; each mesh
    axis takes one role and at most one is a tensor axis; the batch splits over the data ranks and
    micro-batches; the tensor axis maps onto parallelize_module styles; tied parameters are placed
    alike; the recomputed modules exist."""
    spec = model_spec(plan.model, plan.source)
    _check_device_count(plan)
    pipe = _pipeline(plan, spec)
    if graph is None:
        graph = _captured(plan.model, source_key(plan.model), plan.global_batch, plan.seq_len)
    cfgs = op_configs(plan, graph)
    _check_experts(plan, graph, cfgs)
    _check_context(plan, graph, cfgs)
    _check_scans(plan, graph, cfgs)
    roles = [ax.role if ax.role in ("expert", "context") and ax.size > 1
             else axis_role(graph, cfgs, a, ax.name) if ax.size > 1 else "replicate"
             for a, ax in enumerate(plan.mesh.axes)]
    tensor_axes = _tensor_axes(plan, roles)
    mesh = runtime_mesh(plan, roles)
    _check_batch_split(plan, mesh, pipe)
    with torch.device("meta"):
        model = spec.build()
    modules = _Modules(model)
    styles: list[StyleSpec] = []
    expected: list[ExpectedComm] = []
    if tensor_axes:
        ta = _TensorAxis(graph, cfgs, tensor_axes, tuple(plan.mesh.axes[a].name for a in tensor_axes), modules,
                         plan.zero_stage)
        ta.build()
        styles, expected = ta.style_list(), ta.expected(_unit_namer(graph))
    expected += _expert_comms(plan, graph, cfgs, _unit_namer(graph))
    expected += _context_comms(plan, graph, cfgs, _unit_namer(graph))
    ties = _ties(model)
    _check_ties(ties, styles, graph)
    mode, reshard, dp_notes = _data_parallel(plan, mesh, bool(tensor_axes), pipe)
    notes = (_tie_notes(ties, pipe) + _schedule_notes(pipe) + _cut_notes(spec, pipe) + dp_notes
             + _batchnorm_notes(plan, graph, cfgs, roles, modules, mesh))
    for r in plan.recompute:
        if r not in modules.by_name:
            raise Unsupported(f"plan recomputes {r!r}, which is not a module of {plan.model!r}")
    if plan.precision != "fp32":
        notes.append(f"{plan.precision}: FSDP2 MixedPrecisionPolicy when FSDP shards, torch.autocast otherwise "
                     f"(fp32 master weights either way)")
    return ExecSpec(
        model=plan.model, source=plan.source, kind=spec.kind, global_batch=plan.global_batch, seq_len=plan.seq_len,
        precision=plan.precision, num_devices=plan.num_devices, mesh=mesh, data_parallel=mode,
        reshard_after_forward=reshard, zero_stage=plan.zero_stage, styles=styles, ties=ties,
        recompute=list(plan.recompute), pipeline=pipe, expected_comms=expected, notes=notes,
        summary=plan.summary, predicted_time_s=plan.predicted.time_s,
        predicted_memory_bytes=plan.predicted.memory_bytes, plan=plan.model_dump())


def _check_experts(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]]) -> None:
    """Expert parallelism runs over one expert axis, beside data parallelism (worker/experts.py);
    what else the search prices for experts has no executor yet, and is refused saying so."""
    expert_axes = [a for a, ax in enumerate(plan.mesh.axes) if ax.role == "expert" and ax.size > 1]
    for a, ax in enumerate(plan.mesh.axes):
        if ax.size == 1 or ax.role != "tensor":
            continue
        for op in graph.ops:
            lab = cfgs[op.name][a]
            if lab is not None and EXPERT_LABEL in op.labels() and op.kind != "dispatch":
                what = ("the experts" if lab == EXPERT_LABEL else f"{lab!r} inside the experts "
                        f"(expert-tensor parallelism)")
                raise Unsupported(f"op {op.name!r} splits {what} on tensor axis {ax.name!r}: priced, but not executed: "
                                  f"the experts route tokens by data-dependent indices (a sort, a histogram, "
                                  f"index_add) that DTensor's placements do not pass through, so it needs a "
                                  f"hand-written experts module, as worker/experts.py is for an expert axis; expert "
                                  f"parallelism runs on an expert axis")
    if not expert_axes:
        return
    if len(expert_axes) > 1:
        raise Unsupported("the plan splits the experts over two mesh axes: one expert axis is executed")
    if plan.mesh.pp > 1:
        raise Unsupported("expert parallelism inside a pipeline stage is not executed")
    if any(ax.role == "tensor" and ax.size > 1 for ax in plan.mesh.axes):
        raise Unsupported("expert parallelism beside tensor parallelism is not executed (the experts' "
                          "all-to-all would run on DTensor activations)")
    if plan.zero_stage == 1:
        raise Unsupported("ZeRO-1 with expert parallelism is not executed: ZeroRedundancyOptimizer would shard "
                          "each rank's own experts' states over ranks that hold other experts")
    a = expert_axes[0]
    for op in graph.ops:
        lab = cfgs[op.name][a]
        reads_batch = any(graph.batch_label in t.dims for t in (*op.inputs, op.output))
        if lab not in (EXPERT_LABEL, graph.batch_label) and not (lab is None and not reads_batch):
            raise Unsupported(f"op {op.name!r} places {lab or 'a replica'} on expert axis {plan.mesh.axes[a].name!r}: "
                              f"an expert axis splits the experts' ops by expert and every other op by batch")


def _check_scans(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]]) -> None:
    """A state-space or linear-recurrence scan (search/models/scan.py) runs as transformers' layer
    code: the batch may split (each rank scans its own sequences), nothing else. Its heads are
    independent, but the layer reshapes by its full head counts and convolves every channel with a
    Conv1d no parallel style shards, so a plan splitting them (or the sequence) is refused."""
    batch = graph.batch_label
    for a, ax in enumerate(plan.mesh.axes):
        if ax.size == 1:
            continue
        for op in graph.ops:
            lab = cfgs[op.name][a]
            if op.kind == "scan" and lab is not None and lab != batch:
                raise Unsupported(f"op {op.name!r} (a state-space scan) splits {lab!r} on mesh axis {ax.name!r}: "
                                  f"priced, but not executed: transformers' layer reshapes by its full head "
                                  f"counts and runs a depthwise Conv1d that no parallel style shards; split its "
                                  f"batch (data parallelism) and leave it whole on tensor axes")


def _check_context(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]]) -> None:
    """Context parallelism runs over one context axis, beside data parallelism, for a language model
    whose positions come from rotary tables (worker/context.py); what else the search prices with
    a context axis is refused saying why."""
    axes = [a for a, ax in enumerate(plan.mesh.axes) if ax.role == "context" and ax.size > 1]
    if not axes:
        return
    if len(axes) > 1:
        raise Unsupported("the plan splits the sequence over two context axes: one context axis is executed")
    n = plan.mesh.axes[axes[0]].size
    if plan.mesh.pp > 1:
        raise Unsupported("context parallelism inside a pipeline stage is not executed")
    if any(ax.size > 1 and ax.role in ("tensor", "expert") for ax in plan.mesh.axes):
        raise Unsupported("context parallelism beside tensor or expert parallelism is not executed (ring attention "
                          "would run on DTensor activations, or the experts' all-to-all on a share of each sequence)")
    if plan.zero_stage == 1:
        raise Unsupported("ZeRO-1 with context parallelism is not executed: ZeroRedundancyOptimizer runs over the data "
                          "axis, the gradients must be averaged over data x context")
    if model_spec(plan.model).kind != "lm":
        raise Unsupported(f"context parallelism is executed for language models only, not {plan.model!r}")
    if plan.seq_len is None or plan.seq_len % (2 * n):
        raise Unsupported(f"sequence {plan.seq_len} does not cut into 2 x {n} chunks, the load-balanced sharding of "
                          f"ring attention (rank r holds chunks r and 2 cp - 1 - r)")
    learned = learned_position_embedding(graph)
    if learned is not None:
        raise Unsupported(f"op {learned.name!r} is a learned position embedding, which the model looks up for positions "
                          f"0 .. t - 1 of whatever it holds: on a share of the sequence those are the wrong positions "
                          f"(rotary models are executed; priced either way)")
    a = axes[0]
    for op in graph.ops:
        lab = cfgs[op.name][a]
        if lab not in (SEQ_LABEL, graph.batch_label):
            raise Unsupported(f"op {op.name!r} places {lab or 'a replica'} on context axis {plan.mesh.axes[a].name!r}: "
                              f"a context axis splits every op's sequence (the loss its flattened tokens)")


def _context_comms(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]],
                   unit: Callable[[str], str]) -> list[ExpectedComm]:
    """The ring hops the cost model prices per attention op on the context axis (costmodel.py,
    _ring_attention), each an all-to-all where worker/context.py performs it: n - 1 forward (K, V),
    n backward (K, V and their gradients n - 1 times, the gradients home once)."""
    axes = [a for a, ax in enumerate(plan.mesh.axes) if ax.role == "context" and ax.size > 1]
    if not axes:
        return []
    a, n = axes[0], plan.mesh.axes[axes[0]].size
    out: list[ExpectedComm] = []
    for op in graph.ops:
        if op.kind != "attention" or cfgs[op.name][a] != SEQ_LABEL:
            continue
        # a recomputed layer runs its forward, the ring's hops included, again inside its backward
        again = any(op.module == r or op.module.startswith(r + ".") for r in plan.recompute)
        for phase, hops in (("forward", n - 1), ("backward", n + (n - 1 if again else 0))):
            out += [ExpectedComm(unit=unit(op.module), module=op.module, phase=phase, kind="all_to_all",
                                 source=f"{op.name} ring hop {i + 1}") for i in range(hops)]
    return out


def _expert_comms(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]],
                  unit: Callable[[str], str]) -> list[ExpectedComm]:
    """The all-to-alls the cost model prices on the expert axis, where the experts module performs
    them: per MoE layer, the dispatch's token counts (forward), then each edge whose placement
    changes between batch and expert, forward and backward (the tokens in, the results out)."""
    axes = [a for a, ax in enumerate(plan.mesh.axes) if ax.role == "expert" and ax.size > 1]
    if not axes:
        return []
    a = axes[0]
    ops = {op.name: op for op in graph.ops}
    bounds = Boundaries(graph)
    out: list[ExpectedComm] = []
    for v in graph.ops:
        if v.kind == "dispatch":
            out.append(ExpectedComm(unit=unit(v.module), module=v.module, phase="forward", kind="all_to_all",
                                    source=f"{v.name} token counts"))
        for t in v.inputs:
            if (t.source is None or not bounds.pays(t.source, v.name)
                    or {cfgs[t.source][a], cfgs[v.name][a]} != {EXPERT_LABEL, graph.batch_label}):
                continue
            mod = v.module if v.kind == "combine" else ops[t.source].module  # the experts module either way
            for phase in ("forward", "backward"):
                out.append(ExpectedComm(unit=unit(mod), module=mod, phase=phase, kind="all_to_all",
                                        source=f"{t.source} -> {v.name}"))
    return out


def _check_device_count(plan: Plan) -> None:
    n = plan.mesh.pp
    for ax in plan.mesh.axes:
        n *= ax.size
    if n != plan.num_devices:
        raise Unsupported(f"plan mesh {plan.mesh.shape} has {n} devices but the plan says {plan.num_devices}")


def _tensor_axes(plan: Plan, roles: list[str]) -> tuple[int, ...]:
    """The indices of the plan's tensor axes (of size > 1): none, one, or two (2-D tensor
    parallelism, run with DTensor placements on both: worker/parallelize.py Placed)."""
    tensor = tuple(a for a, (ax, r) in enumerate(zip(plan.mesh.axes, roles, strict=True))
                   if r == "tensor" and ax.size > 1)
    if len(tensor) > 2:
        raise Unsupported(f"the plan splits tensors over {len(tensor)} mesh axes "
                          f"({', '.join(plan.mesh.axes[a].name for a in tensor)}): at most two tensor axes are executed")
    return tensor


def _check_batch_split(plan: Plan, mesh: list[MeshDim], pipe: PipelineExec) -> None:
    n_data = math.prod(d.size for d in mesh if d.role in BATCH_ROLES)
    if plan.global_batch % (n_data * pipe.micro_batches):
        raise Unsupported(f"global batch {plan.global_batch} does not split into {n_data} data-parallel ranks x "
                          f"{pipe.micro_batches} micro-batches")


def _unit_namer(graph: OpGraph) -> Callable[[str], str]:
    """The unit an expected collective is reported under: a layer of a block stack
    ('blocks.3'), else the top-level module."""
    prefixes = [b.prefix for b in graph.blocks]

    def unit(fqn: str) -> str:
        for p in prefixes:
            if fqn.startswith(p + "."):
                return ".".join(fqn.split(".")[: len(p.split(".")) + 1])
        return fqn.split(".")[0] if fqn else ""

    return unit


def _check_ties(ties: list[list[str]], styles: list[StyleSpec], graph: OpGraph) -> None:
    """A tied parameter must be placed alike by every module that holds it. Pipelined, each stage
    holding it keeps a copy placed so, whose gradients the executor sums across the stages
    (worker/executor.py Runner._sum_tied_grads), split over the tensor axis or not."""
    placed = [st for st in styles if st.style == "placed"]
    called = {op.module for op in graph.ops}
    for group in ties:
        # a holder whose own forward never reads the parameter (T5's `shared`, whose weight its two
        # stacks' embeddings and the lm head tie to; RoBERTa's lm head, whose bias its decoder reads)
        # places nothing: it takes the weight of those that do (parallelize.py retie)
        names = set(group)
        reading = {op.module for op in graph.ops if any(p.name in names for p in op.params)}
        group = ([g for g in group if g.rpartition(".")[0] in reading]
                 or [g for g in group if g.rpartition(".")[0] in called] or group)
        if placed:
            _check_placed_tie(group, placed)
            continue
        owners = [st for st in styles if st.style in ("colwise", "rowwise")
                  and any(g.rsplit(".", 1)[0] == st.module for g in group)]
        if owners and len(owners) != len(group):
            raise Unsupported(f"tied parameter {' = '.join(group)} is sharded by one of its modules and replicated "
                              f"by another on the tensor axis")
        if owners and _tied_shard_dims(owners, graph) > 1:
            raise Unsupported(f"tied parameter {' = '.join(group)} is sharded along different dimensions by "
                              f"{' and '.join(st.module for st in owners)}")


def _check_placed_tie(group: list[str], placed: list[StyleSpec]) -> None:
    """On two tensor axes: the placements every holder of the tied parameter gives it must agree
    (a module without a style holds it whole)."""
    whole = ",".join(["Replicate()"] * len(placed[0].axis_styles))
    layouts = []
    for name in group:
        module, _, attr = name.rpartition(".")
        st = next((st for st in placed if st.module == module), None)
        layouts.append(st.param_layouts.get(attr, whole) if st else whole)
    if len(set(layouts)) > 1:
        raise Unsupported(f"tied parameter {' = '.join(group)} is placed differently by its modules on the tensor "
                          f"axes ({' and '.join(layouts)})")


def _tie_notes(ties: list[list[str]], pipe: PipelineExec) -> list[str]:
    if pipe.stages > 1 and ties:
        return [f"tied parameters across pipeline stages ({'; '.join(' = '.join(g) for g in ties)}) are kept as a "
                f"copy on each stage holding one (the first and last; an encoder-decoder's decoder embedding on "
                f"its first decoder stage) whose gradients are all-reduced among them (as Megatron-LM does, and "
                f"as the plan prices it: search/algorithm/evaluate.py _tied_copies)"]
    return []


def _cut_notes(spec: ModelSpec, pipe: PipelineExec) -> list[str]:
    """What crosses an encoder-decoder's cuts beyond what the search prices there."""
    if pipe.stages == 1 or spec.kind != SEQ2SEQ_KIND:
        return []
    return ["the decoder's input ids (the targets shifted right) travel with the encoder's activations from the first "
            "stage to the one holding the decoder's embedding, as torch's schedule feeds the first stage only (the "
            "plan reads them as a graph input every stage has; integers, no gradient); T5's cross-attention position "
            "bias (zeros) is made on each stage, not received (worker/hfstages.py)"]


def _schedule_notes(pipe: PipelineExec) -> list[str]:
    if pipe.schedule == "2bw":
        return ["PipeDream-2BW: every stage keeps two versions of its weights; each iteration's forward and backward "
                "passes read the version of one update ago and its gradients, accumulated over the micro-batches, "
                "update the newest (worker/stale.py). The passes run in 1F1B's order, whose flush between iterations "
                f"adds {pipe.stages - 1} micro-batch slot(s) of bubble that the plan's no-flush price (steady state) "
                "does not count"]
    if pipe.virtual_stages > 1:
        return [f"interleaved 1F1B: each pp rank runs {pipe.virtual_stages} chunks of layers (chunk c on rank "
                f"c % {pipe.stages}), under torch's ScheduleInterleaved1F1B"]
    return []


def _data_parallel(plan: Plan, mesh: list[MeshDim], tensor_parallel: bool, pipe: PipelineExec
                   ) -> tuple[str, bool, list[str]]:
    """How the data axis runs its ZeRO stage ('none', 'ddp', 'zero1' or 'fsdp'), whether FSDP
    reshards parameters after the forward, and notes on where that departs from the plan's words."""
    z = plan.zero_stage
    if not any(d.role in (*BATCH_ROLES, "context") for d in mesh):
        return "none", False, ([f"ZeRO-{z} has no data-parallel axis to shard over: nothing is sharded "
                                f"(the cost model agrees)"] if z else [])
    mode = {0: "ddp", 1: "zero1", 2: "fsdp", 3: "fsdp"}[z]
    notes: list[str] = []
    if z == 1 and (tensor_parallel or pipe.stages > 1):
        mode = "fsdp"
        notes.append("ZeRO-1 runs as ZeRO-2 (FSDP2, reshard_after_forward=False) here: ZeroRedundancyOptimizer "
                     "needs plain tensors, and tensor/pipeline parallelism makes parameters DTensors; gradients "
                     "are sharded too, so memory is below the plan's")
    elif z == 1:
        notes.append("ZeRO-1 runs as DDP with ZeroRedundancyOptimizer: gradients are all-reduced and updated "
                     "parameters broadcast (the cost model prices a reduce-scatter and an all-gather)")
    if z == 2:
        notes.append("ZeRO-2 runs as FSDP2 with reshard_after_forward=False: parameters gathered once per "
                     "step, gradients reduce-scattered")
    if z == 0:
        notes.append("ZeRO-0 runs as replicated data parallelism (FSDP2's replicate, i.e. DDP): gradients all-reduced")
    if any(d.role == "context" for d in mesh):
        notes.append("context parallelism: each context-axis rank holds 2 chunks of each sequence (load-balanced for "
                     "causal attention), attention runs as ring attention whose K/V hops are all-to-alls to the next "
                     "rank (worker/context.py; torch's context_parallel needs CUDA SDPA kernels), and every gradient "
                     "synchronises over data x context")
    if any(d.role == "expert" for d in mesh):
        notes.append("expert parallelism: each expert-axis rank holds its share of every layer's experts, whose "
                     "gradients synchronise over the data axis only; the other parameters over data x expert. The "
                     "routing is the model's own, unbalanced as it comes; the plan's prices assume a balanced load")
    return mode, z == 3, notes


def _batchnorm_notes(plan: Plan, graph: OpGraph, cfgs: dict[str, tuple[str | None, ...]], roles: list[str],
                     modules: _Modules, mesh: list[MeshDim]) -> list[str]:
    """A BatchNorm that splits the batch normalises each rank's shard by its own statistics."""
    if not any(d.role == "data" for d in mesh):
        return []
    a_data = [i for i, (ax, r) in enumerate(zip(plan.mesh.axes, roles, strict=True)) if r == "data" and ax.size > 1]
    bn = next((op for op in graph.ops if op.kind == "norm" and any(cfgs[op.name][a] == graph.batch_label for a in a_data)
               and isinstance(modules.by_name.get(op.module), nn.modules.batchnorm._BatchNorm)), None)
    if bn is None:
        return []
    return [f"BatchNorm ({bn.name} and others) splits the batch: each data-parallel rank normalises its "
            f"shard by the shard's own statistics (DDP semantics, and what the cost model prices: no "
            f"communication); the single-process model normalises by the whole batch's"]


@lru_cache(maxsize=16)
def _captured(model: str, key: str, batch: int, seq_len: int | None) -> OpGraph:
    """The model's graph, captured as the search captured it (deterministic; cached per process
    and per source `key`: two HF configs may share a name)."""
    from search.models.capture import capture_model

    return capture_model(model_spec(model), batch, seq_len)


def _tied_shard_dims(owners: list[StyleSpec], graph: OpGraph) -> int:
    """How many distinct weight shardings the tied modules' styles produce (1 when they agree):
    a row-parallel Embedding and a column-parallel Linear both shard the vocabulary (dim 0)."""
    dims = set()
    for st in owners:
        op = graph.op(st.ops[0])
        lin = op.kind == "linear"
        dims.add(0 if (st.style == "colwise") == lin else 1)
    return len(dims)


def _ties(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        groups[id(p)].append(name)
    return [g for g in groups.values() if len(g) > 1]


def _pipeline(plan: Plan, spec: ModelSpec) -> PipelineExec:
    pl = plan.pipeline
    v = pl.virtual_stages
    if plan.mesh.pp == 1 and pl.stages == 1:
        if v > 1:
            raise Unsupported(f"{v} virtual stages interleave pipeline stages; the plan has one stage")
        # gradient accumulation: the rank's batch as equal micro-batches in one process (Runner._accumulate)
        per_rank = plan.global_batch // math.prod(a.size for a in plan.mesh.axes if a.role in ("data", "expert"))
        if pl.micro_batches > 1 and per_rank % pl.micro_batches:
            raise Unsupported(f"gradient accumulation: {pl.micro_batches} micro-batches do not divide the "
                              f"{per_rank} samples each data-parallel rank holds")
        return PipelineExec(micro_batches=pl.micro_batches)
    if pl.stages != plan.mesh.pp:
        raise Unsupported(f"plan has {pl.stages} pipeline stages on a mesh with pp={plan.mesh.pp}; the executor "
                          f"runs one stage per pp rank")
    if pl.schedule == "2bw" or pl.async_weights:
        if pl.schedule != "2bw" or not pl.async_weights:
            raise Unsupported(f"plan's schedule {pl.schedule!r} and async_weights {pl.async_weights} disagree: "
                              f"PipeDream-2BW is schedule '2bw' with async (1-stale) weights")
    elif pl.schedule not in ("gpipe", "1f1b"):
        raise Unsupported(f"plan has {pl.stages} pipeline stages but schedule {pl.schedule!r}")
    if v > 1 and pl.schedule != "1f1b":
        raise Unsupported(f"{v} virtual stages are interleaved 1F1B; the plan's schedule is {pl.schedule!r}")
    with torch.device("meta"):
        model = spec.build()
    try:
        cut = pipe_of(model, spec)
    except NoPipeline as e:
        raise Unsupported(str(e)) from None
    if v > 1 and spec.kind == SEQ2SEQ_KIND:
        raise Unsupported(f"{v} virtual stages over an encoder-decoder's two stacks: the search offers none "
                          f"(search/algorithm/stacks.py leaves them out), so no such layout has been priced or run")
    n_layers = cut.units
    sl = pl.stage_layers
    chunks = pl.stages * v
    if len(sl) != chunks or sl[0][0] != 0 or sl[-1][1] != n_layers or any(
            a[1] != b[0] for a, b in zip(sl, sl[1:], strict=False)) or any(s[1] <= s[0] for s in sl):
        what = f"{pl.stages} x {v} chunks" if v > 1 else f"{pl.stages} stages"
        raise Unsupported(f"plan's stage_layers {sl} do not cover the {n_layers} layers in order as {what}, one or "
                          f"more layers each")
    if plan.precision == "fp16":
        raise Unsupported("fp16 needs loss scaling, which the pipeline schedules do not apply to their per-micro-batch "
                          "losses; run the pipeline in bf16")
    if pl.schedule in ("1f1b", "2bw") and pl.micro_batches < pl.stages:
        raise Unsupported(f"1F1B needs at least as many micro-batches as stages ({pl.micro_batches} < {pl.stages})")
    if v > 1 and pl.micro_batches % pl.stages:
        raise Unsupported(f"interleaved 1F1B runs the micro-batches in rounds of one per stage: {pl.micro_batches} "
                          f"micro-batches are not a multiple of the {pl.stages} stages")
    sends, recvs = pipe_p2p(cut, [list(s) for s in sl], pl.stages, pl.micro_batches)
    return PipelineExec(stages=pl.stages, schedule=pl.schedule, micro_batches=pl.micro_batches, virtual_stages=v,
                        stage_layers=[list(s) for s in sl], p2p=sends, p2p_recv=recvs)
