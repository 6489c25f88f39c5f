"""The block stack: the repeated layers (transformer blocks) that FT solves once.

A graph's first block stack is the unit of two choices the search makes per layer: whether the
layer's activations are recomputed (one 0/1 variable per layer, `recompute_var`), and - when
its wiring lets one template stand for every layer (`find_chain`) - block reuse: the template
layer is solved once and n layers are combined by doubling (ft.py, step 4). The pipeline stage
search cuts the same stack into stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from search.models.graph import Op, OpGraph, block_layout, module_layer
from search.prices.boundaries import Boundaries


@dataclass
class Chain:
    """Block reuse on one graph: layers[0] is solved with the rest of the graph, layers[1] is the
    template, layers[1:] are covered by the chain factor - but for the last layer when `solo`:
    it prices otherwise than the template (whatever reads its output keeps it for backward, or
    does not, unlike the next layer's ops), so it is priced with its own tables and solved with
    the rest of the graph, its output's layout tied to the boundary's all the same."""

    layers: list[tuple[str, ...]]
    solo: bool = False

    @property
    def reused(self) -> int:
        """How many layers the chain factor covers (the template's copies)."""
        return len(self.layers) - 1 - int(self.solo)

    @property
    def covered(self) -> set[str]:
        """The ops priced through the template's tables: those of layers 2.. the chain covers."""
        return {name for layer in self.layers[2:1 + self.reused] for name in layer}

    @cached_property
    def copies(self) -> frozenset[str]:
        """The ops of layers 2..: the pipeline search prices them through the template's tables.
        Found once per chain (the search asks per shape and part; a deep stack has thousands)."""
        return frozenset(name for layer in self.layers[2:] for name in layer)

    @cached_property
    def copy_of(self) -> tuple[tuple[str, str], ...]:
        """(op of layers 2.., the template op it copies), layer by layer: each pipeline shape
        gives layers 2.. the template's tables, found once per chain."""
        return tuple((b, a) for layer in self.layers[2:] for a, b in zip(self.template, layer, strict=True))

    @property
    def template(self) -> tuple[str, ...]:
        return self.layers[1]

    @property
    def boundary(self) -> str:
        """The first layer's output op: its variable stands for every layer boundary."""
        return self.layers[0][-1]

    def layer_maps(self) -> list[dict[str, str]]:
        """Per layer 1.., the template's variable names -> that layer's op names."""
        maps = []
        for i in range(1, len(self.layers)):
            m = dict(zip(self.template, self.layers[i], strict=True))
            m[self.boundary] = self.layers[i - 1][-1]
            m[recompute_var(1)] = recompute_var(i)
            maps.append(m)
        return maps


def recompute_var(layer: int) -> str:
    """The variable choosing whether layer `layer` of the block stack is recomputed (0 or 1)."""
    return f"recompute@{layer}"


def layer_index(graph: OpGraph) -> dict[str, int]:
    """op name -> its layer in the block stack (the unit of activation recomputation)."""
    return {name: i for b in graph.blocks[:1] for i, layer in enumerate(b.layers) for name in layer}


def layer_outputs(graph: OpGraph) -> set[str]:
    """The last op of every layer: its output is kept even when its layer is recomputed. A
    periodic stack's layer is p module layers (search/models/capture.py), each checkpointed on its
    own by the executor (worker/parallelize.py), which so holds every module layer's input: the
    last op of each of them is kept too. (One checkpoint per period would hold its input alone,
    but its backward's replay would hold p layers' activations at once: far more, measured.)"""
    out: set[str] = set()
    for b in graph.blocks[:1]:
        period = block_layout(graph, b)[1]
        for layer in b.layers:
            out.add(layer[-1])
            if period > 1:
                # a module layer's input: what its ops read from an earlier module layer of the period
                where = {name: module_layer(graph, b, name) for name in layer}
                for name in layer:
                    for t in graph.op(name).inputs:
                        if t.source is None:
                            continue
                        src, mine = where.get(t.source), where[name]
                        if src is not None and mine is not None and src < mine:
                            out.add(t.source)
    return out


def _signature(op: Op) -> tuple[object, ...]:
    """A cheap first filter: what two ops must share for one to be priced with the other's tables."""
    return (op.kind, op.output.shape, op.flops, len(op.inputs), len(op.splittable))


def find_chain(graph: OpGraph, min_layers: int = 3, solo: bool = False) -> Chain | None:
    """The graph's block stack, if its wiring lets one template stand for every layer: layer i
    reads only its own ops, the previous layer's output op and graph inputs; only its output op
    is read from outside it (by the next layer, or after the stack by the ops that follow); and
    every layer from the first on prices exactly like the template (`_uniform`), the last one
    included, whatever reads its output - or, with `solo` (FT's block reuse, which can price the
    last layer on its own: `Chain.solo`), every layer but the last. Block reuse needs at least 3
    layers; a pipeline of one given plan can cut 2 (`min_layers`). The answer is kept on the
    graph: FT asks once per mesh and ZeRO stage, and the proof reads every layer."""
    # keyed by the ops and blocks themselves: a model_copy with new ops (a micro-batch graph)
    # carries the cache over but not its key
    cache: tuple[object, object, dict[tuple[int, bool], Chain | None]] | None = graph.__dict__.get("_chains")
    if cache is None or cache[0] is not graph.ops or cache[1] is not graph.blocks:
        cache = (graph.ops, graph.blocks, {})
        object.__setattr__(graph, "_chains", cache)
    found = cache[2]
    if (min_layers, solo) not in found:
        found[(min_layers, solo)] = _find_chain(graph, min_layers, solo)
    return found[(min_layers, solo)]


def carry_chains(full: OpGraph, part: OpGraph) -> None:
    """Give `part`, the graph of one micro-batch of `full` (evaluate.micro_batch_graph), the
    stacks already proven on `full`, so each micro-batch count does not read every layer again.
    Sound: the micro-batch graph divides every tensor's batch dimension and every batched op's
    FLOPs alike, so layers that wire and price alike on the full batch still do (the same map
    applied to equal ops gives equal ops); a stack not found on `full` is asked afresh."""
    cache: tuple[object, object, dict[tuple[int, bool], Chain | None]] | None = full.__dict__.get("_chains")
    if cache is None or cache[0] is not full.ops or cache[1] is not full.blocks:
        return
    found = {key: chain for key, chain in cache[2].items() if chain is not None}
    object.__setattr__(part, "_chains", (part.ops, part.blocks, found))
    after: tuple[object, dict[str, frozenset[str]]] | None = full.__dict__.get("_after")
    if after is not None and after[0] is full.ops:  # the same wiring: the same ops after the stack
        object.__setattr__(part, "_after", (part.ops, dict(after[1])))


def _find_chain(graph: OpGraph, min_layers: int, solo: bool) -> Chain | None:
    if not graph.blocks:
        return None
    layers = list(graph.blocks[0].layers)
    n = len(layers)
    if n < max(min_layers, 2):
        return None
    uniform = _stack_proof(graph)
    if uniform is None:
        return None
    if uniform == n:
        return Chain(layers=layers)
    if solo and uniform == n - 1 and n >= 3:
        return Chain(layers=layers, solo=True)
    return None


def _stack_proof(graph: OpGraph) -> int | None:
    """The first block's wiring checked and its layers compared (`_uniform`): None if the wiring
    forbids a stack, else how many layers price like the template. Kept on the graph: FT's block
    reuse (solo) and the pipeline search (not solo) ask for the same graph's stack, and the
    proof, which reads every layer, is the same for both."""
    cache: tuple[object, object, int | None] | None = graph.__dict__.get("_stack_proof")
    if cache is None or cache[0] is not graph.ops or cache[1] is not graph.blocks:
        cache = (graph.ops, graph.blocks, _prove_stack(graph))
        object.__setattr__(graph, "_stack_proof", cache)
    return cache[2]


def _prove_stack(graph: OpGraph) -> int | None:
    layers = list(graph.blocks[0].layers)
    n = len(layers)
    consumers = graph.consumers()
    member = {name: i for i, layer in enumerate(layers) for name in layer}
    template = [_signature(graph.op(x)) for x in layers[1]]
    for i, layer in enumerate(layers):
        if [_signature(graph.op(x)) for x in layer] != template:
            return None
        for name in layer:
            for t in graph.op(name).inputs:
                if t.source is None or member.get(t.source) == i:
                    continue
                if i > 0 and t.source != layers[i - 1][-1]:
                    return None
            for c, _ in consumers[name]:
                if member.get(c) == i:
                    continue
                if name != layer[-1]:
                    return None
                if i < n - 1 and member.get(c) != i + 1:
                    return None
                if i == n - 1 and c in member:
                    return None
    return _uniform(graph, layers)


def _uniform(graph: OpGraph, layers: list[tuple[str, ...]]) -> int:
    """How many layers from the first are priced by the cost model exactly as the template
    (layer 1) is, with layer i - 1's output in the place of layer 0's - the premise of pricing
    them through the template's tables (evaluate.mesh_costs) and of FT's block reuse; 0 if
    layer 0 (or, but for its wiring, the last layer) does not even configure alike. The wiring
    alone does not prove it: the cost model also reads what the ops are (shapes, labels, dtypes,
    parameters, the torch target a profile is keyed by), whether some reader keeps an op's
    output for backward (the last layer's output is read by the ops after the stack, or by
    nothing), the module boundaries an edge crosses and the pair constraints between ops
    (search/prices/boundaries.py). So each layer is spelled with names replaced by positions
    and compared; layer 0, priced with its own tables, need only configure alike (its output is
    the boundary whose layout every layer's output shares). Cost: one pass over the stack."""
    bounds = Boundaries.of(graph)
    pos = {name: (i, j) for i, layer in enumerate(layers) for j, name in enumerate(layer)}
    pairs: dict[str, list[tuple[object, ...]]] = {}
    for p in bounds.pairs:
        la, lb = pos.get(p.a), pos.get(p.b)
        if (la is None or la[0] == 0) and (lb is None or lb[0] == 0):
            continue  # solved with the rest of the graph, real tables on both sides
        if la is None or lb is None or la[0] != lb[0]:
            return 0  # a constraint across a layer boundary: the template cannot carry it
        tensor = _ref(layers, la[0], p.tensor) if p.kind != "tied" else \
            [q.name for q in graph.op(p.a).params].index(p.tensor)
        pairs.setdefault(p.b, []).append((p.kind, la[1], tensor))

    def spelled(i: int, edges: bool = True) -> list[tuple[object, ...]]:
        """Layer i with names replaced by positions; without `edges`, only what the ops are
        (their configurations follow from it), not how they connect."""
        own: dict[str, int] = {}

        def lab(dims: tuple[str, ...]) -> tuple[object, ...]:
            # the cost model reads labels only to tell one dimension from another within an op
            # and across an edge (capture names a layer's own after its parameters), and the
            # batch label by name: any other is spelled by its order of appearance in the layer
            return tuple(d if d == graph.batch_label else own.setdefault(d, len(own)) for d in dims)

        out: list[tuple[object, ...]] = []
        for name in layers[i]:
            op = graph.op(name)
            ins = []
            for t in op.inputs:
                edge: tuple[object, ...] = ()
                if t.source is not None and edges:
                    prod = graph.op(t.source)
                    edge = (_ref(layers, i, t.source), prod.output.shape, lab(prod.output.dims), prod.output.dtype,
                            bounds.crossing(prod, op), bounds.pays(t.source, name),
                            bounds.any_reader_keeps(t.source))
                ins.append((t.source is None, t.shape, lab(t.dims), t.dtype, edge))
            params = tuple((p.shape, lab(p.dims), p.dtype, p.owner, None if p.owner else p.name) for p in op.params)
            links = (bounds.any_reader_keeps(name), sorted(map(str, pairs.get(name, [])))) if edges else ()
            out.append((op.kind, op.target, op.saves, op.flops, lab(op.splittable), op.output.shape,
                        lab(op.output.dims), op.output.dtype, tuple(ins), params, links))
        return out

    n, template, shape = len(layers), spelled(1), spelled(1, edges=False)
    # layer 0 is priced with its own tables, and so may be the last layer: they need only
    # configure alike (their outputs share the boundary's layout)
    if spelled(0, edges=False) != shape or spelled(n - 1, edges=False) != shape:
        return 0
    for i in range(2, n):
        if spelled(i) != template:
            return i
    return n


def _ref(layers: list[tuple[str, ...]], i: int, name: str) -> tuple[object, ...]:
    """An op as layer i sees it: its position in the layer, the previous layer's output, or
    (anything else) its name."""
    if name in layers[i]:
        return ("local", layers[i].index(name))
    if i > 0 and name == layers[i - 1][-1]:
        return ("previous",)
    return ("op", name)


def after_stack(graph: OpGraph, chain: Chain) -> set[str]:
    """The ops after the block stack: those reading, directly or not, the last layer's output.
    Kept on the graph (keyed by its ops, as `find_chain`): the pipeline search asks per shape,
    and each answer walks every op's consumers."""
    cache: tuple[object, dict[str, frozenset[str]]] | None = graph.__dict__.get("_after")
    if cache is None or cache[0] is not graph.ops:
        cache = (graph.ops, {})
        object.__setattr__(graph, "_after", cache)
    last = chain.layers[-1][-1]
    if last not in cache[1]:
        cache[1][last] = frozenset(_after_stack(graph, last))
    return set(cache[1][last])


def _after_stack(graph: OpGraph, last: str) -> set[str]:
    consumers = graph.consumers()
    out: set[str] = set()
    todo = [c for c, _ in consumers[last]]
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(c for c, _ in consumers[name])
    return out
