"""Pricing one given plan: every op's configuration (and every layer's recomputation) on a mesh,
or on the stages of a pipeline.

The cost tables built here are what FT (ft.py), the pipeline stage search (pipeline.py), the
exhaustive reference, plan re-costing and the baseline planners all price from:
- `mesh_costs`: the op tables FT sees on one mesh (a block stack's layers 2.. are priced
  through the template layer's tables); `tables`: every op's and every edge's;
- `pipe_tables`: the same per micro-batch on a pipeline's stage sub-mesh, with the transfers
  between stages.
`evaluate` and `evaluate_pipeline` sum those tables for given assignments, many at once and
independently of the search's bookkeeping: how a Plan is re-costed and how the exhaustive
reference checks FT.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from search.algorithm.chain import Chain, after_stack, carry_chains, find_chain, layer_index, layer_outputs, recompute_var
from search.algorithm.interleave import device_layers, sends
from search.errors import InputError
from search.models.graph import Op, OpGraph, ParamRef, TensorRef
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, recomputed_mem
from search.prices.mesh import (
    Config,
    Mesh,
    op_configs,
    output_placement,
    param_placement,
    shard_factor,
    unplaceable_op,
)
from search.prices.schedule import ScheduleName, in_flight, weight_copies

# op name (or recompute variable) -> configuration index per assignment (one int: one assignment)
Assignment = Mapping[str, np.ndarray | int]


# ---- one mesh ------------------------------------------------------------------------------------
def mesh_costs(graph: OpGraph, cm: CostModel, mesh: Mesh, zero: int, chain: Chain | None) -> dict[str, OpCosts]:
    """Op cost tables for every op FT will see (with a stack: all but layers 2..n-1)."""
    return {op.name: cm.op_costs(op, mesh, zero, checkpoint=kept) for op, kept in _priced_ops(graph, chain)}


# the ops `mesh_costs` prices and whether each is a layer's output, per (graph, stack): the
# pipeline search asks for every shape's sub-mesh and ZeRO stage of the same micro-batch graph,
# and the walk over a deep graph's ops (most of them covered) cost as much as the memo hits.
# Keyed by identity, graph and chain kept alive in the entry (graphs are never modified); bounded.
_PRICED: dict[tuple[int, int], tuple[OpGraph, Chain | None, list[tuple[Op, bool]]]] = {}
_PRICED_MAX = 256


def _priced_ops(graph: OpGraph, chain: Chain | None) -> list[tuple[Op, bool]]:
    key = (id(graph), id(chain))
    hit = _PRICED.get(key)
    if hit is not None and hit[0] is graph and hit[1] is chain:
        return hit[2]
    covered = chain.covered if chain else set()
    outputs = layer_outputs(graph)
    ops = [(op, op.name in outputs) for op in graph.ops if op.name not in covered]
    if len(_PRICED) >= _PRICED_MAX:
        _PRICED.clear()
    _PRICED[key] = (graph, chain, ops)
    return ops


def tables(graph: OpGraph, cm: CostModel, mesh: Mesh, zero: int = 0
           ) -> tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]]:
    """Every op's and every edge's cost tables on one mesh under ZeRO stage `zero`, with the
    pair constraints between ops as edges (search/prices/boundaries.py)."""
    outputs = layer_outputs(graph)
    ops = {op.name: cm.op_costs(op, mesh, zero, checkpoint=op.name in outputs) for op in graph.ops}
    edges: dict[tuple[str, str], EdgeCosts] = {}
    for op in graph.ops:
        for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
            edges[(src, op.name)] = cm.edge_costs(graph.op(src), op, mesh, ops[src].configs, ops[op.name].configs)
    cm.add_pair_edges(edges, mesh, lambda name: ops[name].configs, cm.bounds.pairs)
    return ops, edges


def evaluate(op_costs: dict[str, OpCosts], edge_costs: dict[tuple[str, str], EdgeCosts], buffers: float,
             assignment: Assignment, layer_of: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Time, memory and their parts for one or many assignments (arrays of config indices).
    With `layer_of`, the assignment also holds each layer's recomputation choice."""
    layer_of = layer_of or {}
    any_v = next(iter(assignment.values()))
    n = np.size(any_v)
    t = np.zeros(n)
    parts = np.zeros((n, 4))
    edge_mem = np.zeros(n)
    n_axes = next(iter(op_costs.values())).comm.shape[1]
    comm = np.zeros((n, n_axes))

    def recomputed(name: str) -> np.ndarray:
        var = recompute_var(layer_of[name]) if name in layer_of else None
        if var is None or var not in assignment:  # a search without recomputation
            return np.zeros(n, dtype=bool)
        return np.asarray(assignment[var]).reshape(-1).astype(bool)

    for name, oc in op_costs.items():
        c = np.asarray(assignment[name]).reshape(-1)
        rc = recomputed(name)
        t += np.where(rc, oc.time_rc[c], oc.time[c])
        parts += np.where(rc[:, None], oc.parts_rc[c], oc.parts[c])
        comm += oc.comm[c]
    for (src, dst), ec in edge_costs.items():
        cu = np.asarray(assignment[src]).reshape(-1)
        cv = np.asarray(assignment[dst]).reshape(-1)
        rc = recomputed(dst)
        t += np.where(rc, ec.recomputed_time[cu, cv], ec.time[cu, cv])
        edge_mem += np.where(rc, recomputed_mem(ec.mem[cu, cv]), ec.mem[cu, cv])
        comm += ec.comm[cu, cv]
    parts[:, 3] += edge_mem
    return {"time": t, "memory": parts.sum(axis=1) + buffers, "parts": parts, "buffers": np.full(n, buffers),
            "comm": comm}



def every_assignment(graph: OpGraph, op_costs: dict[str, OpCosts], tied: Mapping[str, str], rc_vars: list[str],
                     limit: int, what: str) -> tuple[dict[str, np.ndarray], int]:
    """The exhaustive references' enumeration: every configuration of every op but the tied ones
    (each output of `tied` takes its boundary's configuration, FT's tie) and every recomputation
    choice in `rc_vars`, as one array per variable, and their count; InputError naming `what` past
    `limit` assignments."""
    free = [op.name for op in graph.ops if op.name not in tied]
    dims = [len(op_costs[v].configs) for v in free] + [2] * len(rc_vars)
    total = math.prod(dims)
    if total > limit:
        raise InputError(f"{what} would enumerate {total:.3g} assignments (limit {limit:.0e}); use it on small "
                         f"graphs only")
    flat = np.unravel_index(np.arange(total), dims) if dims else ()
    assign = {v: flat[i] for i, v in enumerate(free + rc_vars)}
    for out, boundary in tied.items():
        assign[out] = assign[boundary]
    return assign, total

# ---- a pipeline's stages -------------------------------------------------------------------------
@dataclass(frozen=True)
class Weights:
    """How one stage's per-op costs scale: per-micro-batch time x slots, weights x copies,
    activations x in-flight micro-batches (an interleaved schedule makes slots and in-flight
    micro-batches fractional: a stage's v chunks each hold 1/v of its layers)."""

    slots: float
    copies: int
    inflight: float


def stage_weights(p: int, m: int, schedule: ScheduleName, virtual_stages: int = 1) -> list[Weights]:
    """Per stage: with `virtual_stages` v > 1 (Megatron-LM's interleaved 1F1B, each device
    holding v chunks of layers) the bubble shrinks to (p - 1) / v slots, and stage s holds the
    activations of min(m v, 2 (p - s - 1) + (v - 1) p + 1) chunk micro-batches (Megatron-LM's
    warm-up count plus the one in flight), each 1/v of a full stage's."""
    if virtual_stages > 1:
        v = virtual_stages
        return [Weights(m + (p - 1) / v, 1, min(m * v, 2 * (p - s - 1) + (v - 1) * p + 1) / v) for s in range(p)]
    slots = m if schedule == "2bw" else m + p - 1
    return [Weights(slots, weight_copies(schedule), in_flight(s, p, m, schedule)) for s in range(p)]


def weigh_op(oc: OpCosts, w: Weights) -> OpCosts:
    key = (id(oc), w)
    hit = _WEIGHED.get(key)
    if hit is not None and hit[0] is oc:
        return hit[1]
    step = oc.step if oc.step is not None else np.zeros_like(oc.time)
    scale = np.array([w.copies, 1.0, 1.0, w.inflight])
    parts, parts_rc = oc.parts * scale, oc.parts_rc * scale
    out = OpCosts(configs=oc.configs, time=w.slots * (oc.time - step) + step, mem=parts.sum(axis=1), parts=parts,
                  comm=oc.comm * w.slots, time_rc=w.slots * (oc.time_rc - step) + step, mem_rc=parts_rc.sum(axis=1),
                  parts_rc=parts_rc, estimated=oc.estimated, step=step)
    if len(_WEIGHED) >= _WEIGHED_MAX:
        _WEIGHED.clear()
    _WEIGHED[key] = (oc, out)
    return out


# weighed tables by (table, weights): the stage search weighs each stage's tables once per shape,
# and the shapes of one sub-mesh and micro-batch count that differ in the ZeRO stage alone share
# the tables of the ops without parameters (one object, `CostModel.op_costs`): a third of GPT-3's
# weighings. Keyed by the table's identity, kept alive in the entry (tables are read, never
# written, by their users); bounded.
_WEIGHED: dict[tuple[int, Weights], tuple[OpCosts, OpCosts]] = {}
_WEIGHED_MAX = 8192


def weigh_edge(ec: EdgeCosts, w: Weights) -> EdgeCosts:
    return EdgeCosts(src=ec.src, dst=ec.dst, time=ec.time * w.slots, mem=ec.mem * w.inflight, comm=ec.comm * w.slots,
                     time_rc=None if ec.time_rc is None else ec.time_rc * w.slots)


_setattr = object.__setattr__  # bypasses the frozen models' __setattr__, as pydantic's own copy does
_M = TypeVar("_M", bound=BaseModel)


def _copied(cls: type[_M], state: dict[str, Any], fields_set: set[str]) -> _M:
    """A model of class `cls` holding `state`, unvalidated, with no extras nor private state (as
    `model_copy` leaves a copy of such a model)."""
    new = cls.__new__(cls)
    _setattr(new, "__dict__", state)
    _setattr(new, "__pydantic_fields_set__", fields_set)
    _setattr(new, "__pydantic_extra__", None)
    _setattr(new, "__pydantic_private__", None)
    return new


def micro_batch_graph(graph: OpGraph, m: int) -> OpGraph:
    """The graph of one micro-batch: every batch dimension divided by m (FLOPs scale with it)."""
    if m == 1:
        return graph
    lab = graph.batch_label
    recipe = _batched(graph)
    # a deep stack repeats a few hundred (shape, dims) over thousands of tensors: each divided once
    shapes = [tuple(s // m if d == lab else s for s, d in zip(shape, dims, strict=True)) for shape, dims in recipe.shapes]
    # each tensor and op as `model.model_copy(update=...)` would copy it, without its generic
    # machinery: the same shallow copy, the scaled fields replaced, nothing validated (the values
    # come from a validated graph, scaled), from the recipe's snapshot of the model's state. A
    # micro-batch graph copies thousands of tensors and ops, and the pipeline search builds one
    # per micro-batch count (~17 for GPT-3)
    made = []
    for t_cls, state, fields_set, si in recipe.tensors:
        st = state.copy()
        st["shape"] = shapes[si]
        made.append(_copied(t_cls, st, fields_set))
    ops = []
    for op, op_cls, state, fields_set, ins, out in recipe.ops:
        st = state.copy()
        if ins:
            inputs = list(op.inputs)
            for pos, i in ins:
                inputs[pos] = made[i]
            st["inputs"] = tuple(inputs)
        if out >= 0:
            st["output"] = made[out]
        if ins or out >= 0:
            st["flops"] = op.flops / m
        ops.append(_copied(op_cls, st, fields_set))
    meta = dict(graph.meta)
    if "global_batch" in meta:
        meta["global_batch"] = int(meta["global_batch"]) // m
    out_graph = graph.model_copy(update={"ops": tuple(ops), "meta": meta})
    out_graph.__dict__.pop("_op_index", None)  # model_copy copies the name -> op cache of the full-batch graph
    carry_chains(graph, out_graph)
    return out_graph


@dataclass(frozen=True)
class _Recipe:
    """How `micro_batch_graph` makes a graph's micro-batch copies, found once per graph.

    `shapes`: the distinct (shape, dims) of the batched tensors. `tensors`: the graph's distinct
    batched tensors (the readers of one tensor see it alike: q, k and v read one norm's output,
    and one scaled copy serves them all), each as (class, its state, its fields set with
    `shape`, index into `shapes`). `ops`: per op, (op, class, state, fields set with the scaled
    fields, (input position, index into `tensors`) per batched input, its output's index or -1).
    A copy's fields set is one set shared by every copy of a model (frozen models: pydantic
    copies the set before it changes one); none of these models carries extras or private
    state, which `_batched` checks."""

    shapes: list[tuple[tuple[int, ...], tuple[str, ...]]]
    tensors: list[tuple[type[TensorRef], dict[str, Any], set[str], int]]
    ops: list[tuple[Op, type[Op], dict[str, Any], set[str], tuple[tuple[int, int], ...], int]]


def _batched(graph: OpGraph) -> _Recipe:
    """The graph's `_Recipe`, found once per graph: the pipeline search builds a graph per
    micro-batch count (~17 for GPT-3), each from this. Kept on the graph, keyed by its ops (as
    chain.after_stack keeps its answers)."""
    hit: tuple[object, _Recipe] | None = graph.__dict__.get("_batched")
    if hit is not None and hit[0] is graph.ops:
        return hit[1]
    lab = graph.batch_label
    shape_index: dict[tuple[tuple[int, ...], tuple[str, ...]], int] = {}
    recipe = _Recipe(shapes=[], tensors=[], ops=[])
    index: dict[tuple[str | None, tuple[int, ...], tuple[str, ...], str], int] = {}

    def plain(model: BaseModel) -> None:
        # the copies set no extras nor private state: none of the graph's models has any
        assert model.__pydantic_extra__ is None and model.__pydantic_private__ is None, model

    def at(t: TensorRef) -> int:
        if lab not in t.dims:
            return -1
        key = (t.source, t.shape, t.dims, t.dtype)
        i = index.get(key)
        if i is None:
            plain(t)
            si = shape_index.setdefault((t.shape, t.dims), len(shape_index))
            if si == len(recipe.shapes):
                recipe.shapes.append((t.shape, t.dims))
            i = index[key] = len(recipe.tensors)
            recipe.tensors.append((type(t), dict(t.__dict__), t.__pydantic_fields_set__ | {"shape"}, si))
        return i

    for op in graph.ops:
        ins = tuple((pos, i) for pos, i in enumerate(at(t) for t in op.inputs) if i >= 0)
        out = at(op.output)
        plain(op)
        recipe.ops.append((op, type(op), dict(op.__dict__), op.__pydantic_fields_set__ | {"inputs", "output", "flops"},
                           ins, out))
    object.__setattr__(graph, "_batched", (graph.ops, recipe))
    return recipe



def unsupported(graph: OpGraph, chain: Chain | None, min_layers: int = 3) -> str | None:
    """Why this graph cannot be pipelined (None if it can)."""
    if chain is None:
        return f"no stack of at least {min_layers} identical layers"
    tail = after_stack(graph, chain)
    last = chain.layers[-1][-1]
    for name in tail:
        for t in graph.op(name).inputs:
            if t.source is not None and t.source not in tail and t.source != last:
                return f"op {name} after the stack reads {t.source} from before it"
    return None


@dataclass
class PipeShape:
    mesh: Mesh            # pp = stages, axes = the stage's dp x tp sub-mesh
    zero: int
    micro_batches: int
    schedule: ScheduleName
    virtual_stages: int = 1  # > 1: interleaved 1F1B, each device holding this many chunks (interleave.py)
    spread: int = 2  # a stage holds within this many layers of n / p (pipeline.py `stage_band`)

    @property
    def stages(self) -> int:
        return self.mesh.pp

    def describe(self) -> str:
        if self.stages == 1:  # one stage: no schedule, the micro-batches accumulate gradients
            return f"{self.mesh.describe()} zero{self.zero} accumulate m{self.micro_batches}"
        v = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return f"{self.mesh.describe()} zero{self.zero} {self.schedule}{v} m{self.micro_batches}"


@dataclass
class PipeTables:
    """One pipeline shape's unweighted cost tables for one micro-batch on the stage sub-mesh, and
    the transfers between stages: what the stage search, plan re-costing, the planners and the
    exhaustive reference share."""

    shape: PipeShape
    graph: OpGraph                               # the micro-batch graph
    chain: Chain
    op_costs: dict[str, OpCosts]                 # unweighted, one micro-batch, every op
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    p2p: np.ndarray                              # [boundary configs] seconds per micro-batch, both ways
    p2p_bytes: np.ndarray                        # [boundary configs] bytes sent per micro-batch, one way

    @property
    def mesh(self) -> Mesh:
        return self.shape.mesh

    @property
    def zero(self) -> int:
        return self.shape.zero

    @cached_property
    def tail(self) -> set[str]:
        """The ops after the stack (on the last stage), found once per shape."""
        return after_stack(self.graph, self.chain)

    @cached_property
    def own_costs(self) -> dict[str, OpCosts]:
        """The op tables but those of layers 2.. (priced through the template's): what the stage
        problems weigh, found once per shape (`op_costs` holds every op of a deep stack)."""
        covered = self.chain.copies
        return {name: oc for name, oc in self.op_costs.items() if name not in covered}

    def describe(self) -> str:
        return self.shape.describe()


def p2p_costs(graph: OpGraph, cm: CostModel, shape: PipeShape, boundary: str,
              configs: list[Config]) -> tuple[np.ndarray, np.ndarray]:
    """Seconds (activation forward plus its gradient back) and bytes per micro-batch of sending
    the boundary tensor, in each boundary configuration, between neighbouring stages."""
    op = graph.op(boundary)
    inner = shape.mesh.num_devices // shape.stages
    alpha, beta = cm.p2p_coefficients(shape.stages, inner)
    nbytes = np.array([op.output.numel * cm.esize(op.output) / shard_factor(output_placement(c, op), shape.mesh)
                       for c in configs])
    return 2.0 * (alpha + beta * nbytes), nbytes


def pipe_tables(graph: OpGraph, cm: CostModel, shape: PipeShape, min_layers: int = 3, chain: Chain | None = None,
                base: dict[str, OpCosts] | None = None, edges: bool = True) -> PipeTables | None:
    """Unweighted cost tables of one micro-batch on the stage sub-mesh, and the boundary
    transfers. `graph` and `cm` are the micro-batch graph and its cost model. None if it cannot
    pipeline. The search asks for a stack of at least 3 layers (the chain it reuses blocks
    along); pricing one given plan may take a stack of 2 (`min_layers`). A caller that already
    has them passes the graph's `chain` and the op tables `mesh_costs` gives (`base`). Without
    `edges` the edge tables are left empty (`with_edges` adds them): the stage search prices
    its edges per stage weighting itself and needs them only for the shapes that reach the
    frontier."""
    chain = chain if chain is not None else find_chain(graph, min_layers)
    if chain is None or unsupported(graph, chain) is not None or len(chain.layers) < shape.stages:
        return None
    sub = Mesh(pp=1, axes=shape.mesh.axes)
    if base is None and unplaceable_op(graph.ops, sub, graph.batch_label) is not None:
        return None  # the micro-batch does not split over the stage's data-parallel ranks
    # layers 2.. are priced with the template layer's tables (identical ops, identical costs)
    base = dict(base) if base is not None else mesh_costs(graph, cm, sub, shape.zero, chain)
    if shape.stages > 1:  # one stage (gradient accumulation) holds a tied parameter once
        base.update(_tied_copies(graph, cm, sub, shape, chain))
    covered = chain.copies
    # the ops standing for the rest (layers 2.. not yet added: a walk of ~40 names, not thousands)
    buffers = cm.buffers(sub, [graph.op(n) for n in base if n not in covered], shape.zero)
    for b, a in chain.copy_of:
        base[b] = base[a]
    p2p, p2p_bytes = p2p_costs(graph, cm, shape, chain.boundary, base[chain.boundary].configs)
    tabs = PipeTables(shape=shape, graph=graph, chain=chain, op_costs=base, edge_costs={},
                      buffers=buffers, p2p=p2p, p2p_bytes=p2p_bytes)
    return with_edges(tabs, cm) if edges else tabs


def with_edges(tabs: PipeTables, cm: CostModel) -> PipeTables:
    """`tabs` with every edge's table (layers 2.. through the template's, as their ops)."""
    graph, chain = tabs.graph, tabs.chain
    sub = Mesh(pp=1, axes=tabs.shape.mesh.axes)
    edges = _all_edges(graph, cm, sub, tabs.op_costs, chain, skip=chain.copies)
    template = set(chain.template)
    template_edges = {k: ec for k, ec in edges.items() if k[1] in template}
    for i in range(2, len(chain.layers)):
        names = dict(zip(chain.template, chain.layers[i], strict=True))
        names[chain.boundary] = chain.layers[i - 1][-1]
        for (src, dst), ec in template_edges.items():
            edges[(names.get(src, src), names[dst])] = ec
    return dataclasses.replace(tabs, edge_costs=edges)


def _tied_copies(graph: OpGraph, cm: CostModel, sub: Mesh, shape: PipeShape, chain: Chain) -> dict[str, OpCosts]:
    """Ops after the stack that read a parameter owned before it (GPT's lm head and the token
    embedding) hold a copy of it on the last stage, as Megatron-LM does: its own gradients and
    optimizer state, and an all-reduce of the gradients with the first stage once per iteration."""
    out: dict[str, OpCosts] = {}
    for own, tied in _tail_owners(graph, chain):
        oc = cm.op_costs(own, sub, shape.zero)
        alpha, beta = cm.p2p_coefficients(shape.stages, sub.num_devices)
        # an all-reduce of two ranks: each sends its gradient shard and receives the other's
        grads = np.array([sum(p.numel / shard_factor(param_placement(c, p.dims), sub) for p in tied) * cm.bytes.grad
                          for c in oc.configs])
        t_tie = 2.0 * (alpha + beta * grads)
        step = (oc.step if oc.step is not None else np.zeros_like(oc.time)) + t_tie
        out[own.name] = OpCosts(configs=oc.configs, time=oc.time + t_tie, mem=oc.mem, parts=oc.parts, comm=oc.comm,
                               time_rc=oc.time_rc + t_tie, mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, step=step,
                               estimated=oc.estimated)
    return out


# the tail's readers of a tied parameter, each as the op owning its copy, per (graph, stack): every
# pipeline shape asks, and finding them walks every op. Kept as `_PRICED` is; one copy per op also
# lets the cost model's memos (keyed by the op's identity) price it once per sub-mesh, not per shape
_TAIL_OWNERS: dict[tuple[int, int], tuple[OpGraph, Chain, list[tuple[Op, list[ParamRef]]]]] = {}


def _tail_owners(graph: OpGraph, chain: Chain) -> list[tuple[Op, list[ParamRef]]]:
    """The ops after the stack that read a parameter owned before it, each made the owner of its
    copy, with those parameters."""
    key = (id(graph), id(chain))
    hit = _TAIL_OWNERS.get(key)
    if hit is not None and hit[0] is graph and hit[1] is chain:
        return hit[2]
    tail = after_stack(graph, chain)
    owned_in_tail = {p.name for op in graph.ops if op.name in tail for p in op.params if p.owner}
    found: list[tuple[Op, list[ParamRef]]] = []
    for op in graph.ops:
        if op.name not in tail:  # tested first: a deep stack's ops are almost all before the tail
            continue
        tied = [p for p in op.params if not p.owner and p.name not in owned_in_tail]
        if not tied:
            continue
        own = op.model_copy(update={"params": tuple(p.model_copy(update={"owner": True}) if p in tied else p
                                                    for p in op.params)})
        found.append((own, tied))
    if len(_TAIL_OWNERS) >= _PRICED_MAX:
        _TAIL_OWNERS.clear()
    _TAIL_OWNERS[key] = (graph, chain, found)
    return found


def _all_edges(graph: OpGraph, cm: CostModel, mesh: Mesh, ops: dict[str, OpCosts], chain: Chain,
               skip: AbstractSet[str] = frozenset()) -> dict[tuple[str, str], EdgeCosts]:
    """Every edge, and the pair constraints the DP applies: those within one part it solves
    together (the head with layer 0, a layer, the tail). Tied parameters across the head and the
    tail become two copies on two stages (worker/analyze.py) and are not constrained."""
    out: dict[tuple[str, str], EdgeCosts] = {}
    for op in graph.ops:
        if op.name in skip:
            continue
        for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
            prod = graph.op(src)
            out[(src, op.name)] = cm.edge_costs(prod, op, mesh, op_configs(prod, mesh, graph.batch_label), ops[op.name].configs)
    tail = after_stack(graph, chain)
    layer_of = {name: i for i, layer in enumerate(chain.layers) if i > 0 for name in layer}  # layer 0: the head

    def part_of(name: str) -> int | str:
        return "tail" if name in tail else layer_of.get(name, "head")

    cm.add_pair_edges(out, mesh, lambda name: op_configs(graph.op(name), mesh, graph.batch_label),
                      [p for p in cm.bounds.pairs if p.b not in skip and part_of(p.a) == part_of(p.b)])
    return out


def stage_ops(graph: OpGraph, chain: Chain, layers_per_stage: tuple[int, ...], virtual_stages: int = 1) -> list[set[str]]:
    """The op names of every stage (device): its layers (interleave.py: consecutive ones, or v
    chunks of them interleaved), the ops before the stack on the first, those after on the last."""
    tail = after_stack(graph, chain)
    in_stack = {n for layer in chain.layers for n in layer}
    head = {op.name for op in graph.ops if op.name not in tail and op.name not in in_stack}
    out = []
    for s, held in enumerate(device_layers(layers_per_stage, virtual_stages)):
        names = {n for i in held for n in chain.layers[i]}
        if s == 0:
            names |= head
        if s == len(layers_per_stage) - 1:
            names |= tail
        out.append(names)
    return out


def evaluate_pipeline(tabs: PipeTables, assignment: Assignment, layers_per_stage: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Time, memory and the max-memory stage's parts for many assignments at once, straight from
    the unweighted tables: an independent check of the stage DP, and how plans are re-costed."""
    shape, graph, chain = tabs.shape, tabs.graph, tabs.chain
    p, v = shape.stages, shape.virtual_stages
    weights = stage_weights(p, shape.micro_batches, shape.schedule, v)
    layer_of = layer_index(graph)
    n = np.size(next(iter(assignment.values())))
    b = np.asarray(assignment[chain.boundary]).reshape(-1)
    stages = []
    for s, names in enumerate(stage_ops(graph, chain, layers_per_stage, v)):
        w = weights[s]
        res = price_stage(tabs.op_costs, tabs.edge_costs, tabs.buffers, w, names.__contains__, assignment, layer_of)
        # per micro-batch a stage sends its boundary on once, or once per chunk when interleaved
        # (the last stage's last chunk ends the model)
        k = sends(s, p, v)
        stages.append((res["time"] + (w.slots * k * tabs.p2p[b] if k else 0.0), res))
    return {**combine_stages(stages, tabs.buffers, n),
            "pp_bytes": 2.0 * v * shape.micro_batches * tabs.p2p_bytes[b]}


def price_stage(op_costs: dict[str, OpCosts], edge_costs: dict[tuple[str, str], EdgeCosts], buffers: float,
                w: Weights, holds: Callable[[str], bool], assignment: Assignment, layer_of: dict[str, int]
                ) -> dict[str, np.ndarray]:
    """`evaluate` of one pipeline stage: the ops it holds (and the edges into them) under its
    weights w."""
    ops = {k: weigh_op(oc, w) for k, oc in op_costs.items() if holds(k)}
    edges = {k: weigh_edge(ec, w) for k, ec in edge_costs.items() if holds(k[1])}
    return evaluate(ops, edges, buffers, assignment, layer_of)


def combine_stages(stages: list[tuple[np.ndarray, dict[str, np.ndarray]]], buffers: float, n: int
                   ) -> dict[str, np.ndarray]:
    """A pipeline's time, memory and parts from its stages' (time with the sends, `price_stage`'s
    result): the slowest stage's time, the heaviest stage's memory and that stage's parts."""
    T, M = np.stack([t for t, _ in stages]), np.stack([res["memory"] for _, res in stages])
    worst = np.argmax(M, axis=0)
    return {"time": T.max(axis=0), "memory": M.max(axis=0), "stage_time": T.T, "stage_memory": M.T,
            "parts": np.stack([res["parts"] for _, res in stages])[worst, np.arange(n)],
            "buffers": np.full(n, buffers), "comm": np.stack([res["comm"] for _, res in stages]).max(axis=0)}
