"""One pipeline shape's cost tables over an encoder-decoder's block stacks, and the exact price of
given assignments and cuts (the reference `exhaustive_stacks` and the plans' re-costing).

The units are the layers of every block stack in graph order (the encoder's, then the
decoder's); every other op sits with a unit (`anchors`: with the unit it follows when it reads
some layer, else with the first unit that reads it). What crosses a cut is sent point-to-point
once per micro-batch to each stage that reads it (`StackTables.p2p`). stacks.py says how the
search uses these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from search.algorithm.chain import layer_index, recompute_var
from search.algorithm.evaluate import (
    Assignment,
    PipeShape,
    combine_stages,
    every_assignment,
    price_stage,
    stage_weights,
)
from search.algorithm.families import (
    Family,
)
from search.algorithm.frontier import (
    pareto_mask,
)
from search.algorithm.pipeline import STAGE_BAND, partitions
from search.algorithm.results import Split
from search.models.graph import OpGraph
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts
from search.prices.mesh import Mesh, op_configs, output_placement, shard_factor, unplaceable_op

# a stage holds within this many units of n / p: decoder layers weigh about 1.5 encoder layers,
# and the embeddings and the head sit on the end stages, so balanced cuts stray further than
# in one stack of identical layers
STACKS_BAND = STAGE_BAND + 1


def is_multi_stack(graph: OpGraph) -> bool:
    """More than one block family: the graph pipelines through this module, not pipeline.py."""
    return len(graph.blocks) > 1


def units(graph: OpGraph) -> list[tuple[str, ...]]:
    """The layers of every block stack, in graph order (the encoder's, then the decoder's)."""
    return [layer for b in graph.blocks for layer in b.layers]


def anchors(graph: OpGraph) -> dict[str, int]:
    """Per op, the unit whose stage holds it (stacks.py: where the other ops go)."""
    unit_of = {name: i for i, layer in enumerate(units(graph)) for name in layer}
    last = len(units(graph)) - 1
    out: dict[str, int] = dict(unit_of)
    for op in graph.topological():  # ops reading some layer: with the last unit they read
        if op.name in out:
            continue
        got = [out[t.source] for t in op.inputs if t.source is not None and t.source in out]
        if got:
            out[op.name] = max(got)
    consumers = graph.consumers()
    for op in reversed(graph.topological()):  # the rest: with the first unit that reads them
        if op.name not in out:
            readers = [out[c] for c, _ in consumers[op.name] if c in out]
            out[op.name] = min(readers) if readers else 0
    for op in graph.topological():  # nothing sits before what it reads
        for t in op.inputs:
            if t.source is not None and out[t.source] > out[op.name]:
                assert op.name not in unit_of, f"layer op {op.name} reads {t.source} from a later unit"
                out[op.name] = out[t.source]
    return {k: min(v, last) for k, v in out.items()}


@dataclass
class StackTables:
    """One shape's unweighted tables for one micro-batch on the stage sub-mesh, and the sizes of
    the tensors that may cross a cut."""

    shape: PipeShape
    graph: OpGraph                               # the micro-batch graph
    cm: CostModel
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    anchor: dict[str, int]
    n_units: int
    p2p: dict[str, np.ndarray] = field(default_factory=dict)        # seconds per micro-batch, both ways
    p2p_bytes: dict[str, np.ndarray] = field(default_factory=dict)  # bytes per micro-batch, one way

    @property
    def mesh(self) -> Mesh:
        return self.shape.mesh

    def stage_of(self, split: Split) -> dict[str, int]:
        bounds = np.cumsum(split)
        return {name: int(np.searchsorted(bounds, u, side="right")) for name, u in self.anchor.items()}

    def received(self, stage_of: dict[str, int], s: int) -> list[str]:
        """The ops whose outputs stage s reads from other stages, each once."""
        out: dict[str, None] = {}
        for op in self.graph.ops:
            if stage_of[op.name] == s:
                for t in op.inputs:
                    if t.source is not None and stage_of[t.source] != s:
                        out[t.source] = None
        return list(out)


class SharedTables:
    """What the shapes of one micro-batch graph share per stage sub-mesh, whatever their ZeRO
    stage and stage count: whether every op can run there, the edges (pair constraints
    included; neither configurations nor edge prices depend on the ZeRO stage) and the bytes
    each op's output sends per configuration; and the graph's anchors. Made once per sub-mesh
    (BART's 96 shapes have 42 pairs of micro-batch count and sub-mesh) and read, never written,
    by the tables that hold them."""

    def __init__(self, graph: OpGraph, cm: CostModel) -> None:
        self.graph, self.cm = graph, cm
        self.anchor = anchors(graph)
        self.n_units = len(units(graph))
        self.placeable: dict[Mesh, bool] = {}
        self.edges: dict[Mesh, dict[tuple[str, str], EdgeCosts]] = {}
        self.p2p_bytes: dict[Mesh, dict[str, np.ndarray]] = {}

    def can_place(self, sub: Mesh) -> bool:
        if sub not in self.placeable:
            self.placeable[sub] = unplaceable_op(list(self.graph.ops), sub, self.graph.batch_label) is None
        return self.placeable[sub]

    def edge_costs(self, sub: Mesh, ops: dict[str, OpCosts]) -> dict[tuple[str, str], EdgeCosts]:
        """Every edge of the graph on the sub-mesh, between the configurations of `ops`."""
        if sub not in self.edges:
            graph, cm = self.graph, self.cm
            edges: dict[tuple[str, str], EdgeCosts] = {}
            for op in graph.ops:
                for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
                    edges[(src, op.name)] = cm.edge_costs(graph.op(src), op, sub, ops[src].configs,
                                                          ops[op.name].configs)
            cm.add_pair_edges(edges, sub, lambda name: ops[name].configs, cm.bounds.pairs)
            self.edges[sub] = edges
        return self.edges[sub]

    def sent_bytes(self, sub: Mesh) -> dict[str, np.ndarray]:
        """Per op, the bytes of its output per configuration on the sub-mesh (one way)."""
        if sub not in self.p2p_bytes:
            graph, cm = self.graph, self.cm
            self.p2p_bytes[sub] = {
                op.name: np.array([op.output.numel * cm.esize(op.output) / shard_factor(output_placement(c, op), sub)
                                   for c in op_configs(op, sub, graph.batch_label)])
                for op in graph.ops}
        return self.p2p_bytes[sub]


def stack_tables(graph: OpGraph, cm: CostModel, shape: PipeShape, shared: SharedTables | None = None
                 ) -> StackTables | None:
    """The tables of one shape on its micro-batch graph `graph` (None where an op cannot run on
    the stage's sub-mesh). `shared`: what other shapes of this graph and cost model made."""
    shared = shared if shared is not None else SharedTables(graph, cm)
    sub = Mesh(pp=1, axes=shape.mesh.axes)
    if not shared.can_place(sub):
        return None
    outputs = {layer[-1] for layer in units(graph)}
    ops = {op.name: cm.op_costs(op, sub, shape.zero, checkpoint=op.name in outputs) for op in graph.ops}
    tabs = StackTables(shape=shape, graph=graph, cm=cm, op_costs=ops, edge_costs=shared.edge_costs(sub, ops),
                       buffers=cm.buffers(sub, list(graph.ops), shape.zero), anchor=shared.anchor,
                       n_units=shared.n_units)
    if shape.stages > 1:
        alpha, beta = cm.p2p_coefficients(shape.stages, shape.mesh.num_devices // shape.stages)
        for name, nbytes in shared.sent_bytes(sub).items():
            tabs.p2p[name], tabs.p2p_bytes[name] = 2.0 * (alpha + beta * nbytes), nbytes
    return tabs


def evaluate_stacks(tabs: StackTables, assignment: Assignment, split: Split) -> dict[str, np.ndarray]:
    """Time, memory and their parts for many assignments of one cut, stage by stage."""
    shape = tabs.shape
    p = shape.stages
    weights = stage_weights(p, shape.micro_batches, shape.schedule)
    stage_of = tabs.stage_of(split)
    layer_of = layer_index(tabs.graph)
    n = np.size(next(iter(assignment.values())))
    stages = []
    pp_bytes = np.zeros(n)
    for s in range(p):
        w = weights[s]
        held = {k for k, at in stage_of.items() if at == s}
        res = price_stage(tabs.op_costs, tabs.edge_costs, tabs.buffers, w, held.__contains__, assignment, layer_of)
        t = res["time"]
        for src in tabs.received(stage_of, s):
            c = np.asarray(assignment[src]).reshape(-1)
            t = t + w.slots * tabs.p2p[src][c]
            pp_bytes += 2.0 * shape.micro_batches * tabs.p2p_bytes[src][c]
        stages.append((t, res))
    return {**combine_stages(stages, tabs.buffers, n), "pp_bytes": pp_bytes}


def exhaustive_stacks(tabs: StackTables, recompute: bool = True, limit: int = 2_000_000,
                      tie: tuple[Family, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The reference: every cut and every assignment of every op (and recomputation choice),
    priced by `evaluate_stacks`, Pareto-reduced. With `tie`, only the assignments in which each
    family's copies (and a solo last layer) output in its boundary's configuration, as the
    search with block reuse offers. Exponential: tiny graphs only."""
    p = tabs.shape.stages
    # a tied output is not enumerated: it takes its boundary's configuration
    tied = {layer[-1]: fam.chain.boundary for fam in tie for layer in fam.chain.layers[1:]}
    rc = sorted({recompute_var(i) for i in layer_index(tabs.graph).values()}) if recompute else []
    assign, _ = every_assignment(tabs.graph, tabs.op_costs, tied, rc, limit, "the encoder-decoder reference")
    ts, ms = [], []
    for split in partitions(tabs.n_units, p, 1, STACKS_BAND):
        res = evaluate_stacks(tabs, assign, split)
        ts.append(res["time"])
        ms.append(res["memory"])
    t, m = np.concatenate(ts), np.concatenate(ms)
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m)
    order = np.argsort(t[keep], kind="stable")
    return t[keep][order], m[keep][order]
