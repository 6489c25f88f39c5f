"""One mesh's factor graph and its elimination (ft.py, steps 2 to 4).

On one mesh every op is a variable whose values are its configurations. Each op contributes a
unary factor (one point per configuration: its time and memory), each producer -> consumer pair
and each pair constraint (search/prices/boundaries.py) a pairwise factor, and each layer of the
block stack a 0/1 recomputation variable. `eliminate_all` eliminates variables in min-weight
order, Pareto-reducing after every join. `prepare_mesh` solves what does not depend on pruning:
with a block stack, the template layer to a factor over its boundary (`unit`) and the rest of
the graph to a factor over the boundary (`outside`, or for a pipeline its `head` and `tail`).

FT (ft.py) finishes each problem; the pipeline stage search (pipeline.py) builds one per stage
weighting, the ops' tables weighed by the caller and the edges here (`edge_weights`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache

import numpy as np

from search.algorithm.chain import Chain, after_stack, find_chain, layer_index, recompute_var
from search.algorithm.evaluate import Weights, mesh_costs, weigh_edge
from search.algorithm.frontier import (
    Factor,
    Stats,
    add_stats,
    eliminate_var,
    join,
    leaf,
    renamed,
    restrict_equal,
    union,
)
from search.algorithm.minsum import least_sums
from search.algorithm.segments import Solved, find_segments, solve_segments
from search.models.graph import Op, OpGraph, block_layout, module_layer
from search.prices.boundaries import Pair
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, add_edges, recomputed_mem
from search.prices.mesh import Mesh, op_configs


def _op_factor(name: str, oc: OpCosts, rc: str | None = None,
               act: tuple[np.ndarray, np.ndarray] | None = None) -> Factor:
    """One point per configuration; inside a block also per recomputation choice of the block.
    `act`: the op's activations without and with recomputation, kept as the second memory
    component."""
    c = np.arange(len(oc.configs))
    if rc is None:
        return leaf((name,), c[:, None], oc.time, oc.mem, note=f"op {name}", m2=None if act is None else act[0])
    keys = np.concatenate([np.stack([c, np.zeros_like(c)], 1), np.stack([c, np.ones_like(c)], 1)])
    return leaf((name, rc), keys, np.concatenate([oc.time, oc.time_rc]), np.concatenate([oc.mem, oc.mem_rc]),
                note=f"op {name}", m2=None if act is None else np.concatenate(act))


@cache
def _pair_keys(cu: int, cv: int, recompute: bool) -> np.ndarray:
    """Every (producer, consumer) configuration pair, row-major (and then each with the block's
    recomputation 0, then 1): the keys of every edge of that size, made once and read-only
    (factors never write their keys)."""
    ku, kv = np.meshgrid(np.arange(cu), np.arange(cv), indexing="ij")
    keys = np.stack([ku.ravel(), kv.ravel()], axis=1).astype(np.int32)
    if recompute:
        n = len(keys)
        keys = np.concatenate([np.c_[keys, np.zeros(n, np.int32)], np.c_[keys, np.ones(n, np.int32)]])
    keys.flags.writeable = False
    return keys


def _edge_factor(ec: EdgeCosts, src_name: str, dst_name: str, rc: str | None = None,
                 act: np.ndarray | None = None) -> Factor:
    """Resharding time and the kept redistributed copy; a recomputed block keeps no copy and runs
    its forward collectives again. `act`: the copy's bytes kept as the second memory component
    (then `ec.mem` holds what does not scale with it)."""
    cu, cv = ec.time.shape
    if rc is None or not (ec.mem.any() or ec.time_rc is not None or (act is not None and act.any())):
        return leaf((src_name, dst_name), _pair_keys(cu, cv, False), ec.time.ravel(), ec.mem.ravel(),
                    note=f"edge {src_name}->{dst_name}", m2=None if act is None else act.ravel())
    keys = _pair_keys(cu, cv, True)
    return leaf((src_name, dst_name, rc), keys, np.concatenate([ec.time.ravel(), ec.recomputed_time.ravel()]),
                np.concatenate([ec.mem.ravel(), recomputed_mem(ec.mem.ravel())]), note=f"edge {src_name}->{dst_name}",
                m2=None if act is None else np.concatenate([act.ravel(), recomputed_mem(act.ravel())]))


class JoinMemo:
    """Joins and eliminations shared by the problems of one mesh (its ZeRO stages, a layer's
    recomputation cases): many ops cost the same under each (no parameters, no recomputed
    activations), so their leaves match and so do the joins among them. A result is a function
    of its inputs' contents, `domain` and `eps` (one memo per mesh and eps), so sharing it is
    exact; what a join adds to `Stats` is replayed, so the counts stay those of a plain run.
    Leaves of equal contents are made one object (`leaf`), so a join is known by its inputs'
    identities; the memo holds every input it has seen, so no identity is reused."""

    def __init__(self) -> None:
        self.leaves: dict[tuple[object, ...], Factor] = {}
        self.done: dict[tuple[object, ...], tuple[Factor, Stats, tuple[Factor, ...]]] = {}
        # segments eliminated, by kind (segments.py): shared by name, not identity
        self.kinds: dict[Hashable, Solved] = {}

    def leaf(self, f: Factor) -> Factor:
        """The first leaf seen with f's contents (f itself if none)."""
        content = (f.scope, f.note, f.keys.dtype.str, f.keys.shape, f.keys.tobytes(), f.t.tobytes(),
                   f.m.tobytes(), None if f.m2 is None else f.m2.tobytes())
        return self.leaves.setdefault(content, f)

    def run(self, key: tuple[object, ...], inputs: tuple[Factor, ...], make: Callable[[Stats], Factor],
            stats: Stats | None) -> Factor:
        """`make`'s factor over `inputs`, made once per key and inputs; `make` counts into the
        Stats it is given, and those counts go to `stats` on every call."""
        full = (key, *map(id, inputs))
        hit = self.done.get(full)
        if hit is None:
            own = Stats()
            hit = (make(own), own, inputs)
            self.done[full] = hit
        f, own, _ = hit
        if stats is not None:
            add_stats(stats, own)
        return f


def _join(a: Factor, b: Factor, drop: tuple[str, ...], domain: dict[str, int], eps: float, stats: Stats | None,
          memo: JoinMemo | None) -> Factor:
    if memo is None:
        return join(a, b, drop=drop, domain=domain, eps=eps, stats=stats)
    return memo.run(("join", drop), (a, b), lambda own: join(a, b, drop=drop, domain=domain, eps=eps, stats=own),
                    stats)


def _eliminate(f: Factor, v: str, domain: dict[str, int], eps: float, memo: JoinMemo | None) -> Factor:
    if memo is None:
        return eliminate_var(f, v, domain, eps)
    return memo.run(("elim", v), (f,), lambda own: eliminate_var(f, v, domain, eps), None)


def eliminate_all(factors: list[Factor], domain: dict[str, int], keep: tuple[str, ...] = (), eps: float = 0.0,
                  stats: Stats | None = None, memo: JoinMemo | None = None) -> Factor:
    """Variable elimination in min-weight order (the variable whose elimination makes the
    smallest table goes first; ties: fewest points, then name); returns one factor over `keep`.
    `memo`: joins already made on this mesh (same domain and eps), shared."""
    live: dict[int, Factor] = dict(enumerate(factors))
    next_id = len(live)
    by_var: dict[str, set[int]] = {}
    for fid, f in live.items():
        for v in f.scope:
            by_var.setdefault(v, set()).add(fid)
    remaining = set(by_var) - set(keep)
    id_of = {id(f): fid for fid, f in live.items()}

    def density(f: Factor) -> float:
        """Points per assignment of f's scope (weighed again and again: kept per factor)."""
        keys = 1
        for u in f.scope:
            keys *= domain[u]
        return max(len(f), 1) / keys

    dens = {fid: density(f) for fid, f in live.items()}

    def weight(v: str) -> tuple[float, str]:
        """Expected number of point pairs the elimination combines: the joint assignment space
        times the average frontier size per assignment of every factor involved."""
        scope: set[str] = set()
        est = 1.0
        for fid in by_var[v]:
            scope.update(live[fid].scope)
            est *= dens[fid]
        for u in scope:
            est *= domain[u]
        return (est, v)

    # a variable's weight changes only when a factor touching it does: keep the weights in a
    # heap and push anew those of the variables that shared a factor with the one eliminated
    # (all of them in the new factor's scope); an entry that is no longer the variable's weight
    # is stale and skipped. The least (weight, name) goes first, as a scan would pick it.
    weights = {u: weight(u) for u in remaining}
    heap = list(weights.values())
    heapq.heapify(heap)
    while remaining:
        w = heapq.heappop(heap)
        v = w[1]
        if v not in remaining or weights[v] != w:
            continue
        mine = sorted((live.pop(fid) for fid in by_var.pop(v)), key=len)
        for f in mine:
            for u in f.scope:
                if u != v:
                    by_var[u].discard(id_of[id(f)])
        if len(mine) == 1:
            acc = _eliminate(mine[0], v, domain, eps, memo)
        else:
            acc = mine[0]
            for k, f in enumerate(mine[1:]):
                acc = _join(acc, f, (v,) if k == len(mine) - 2 else (), domain, eps, stats, memo)
        live[next_id] = acc
        id_of[id(acc)] = next_id
        dens[next_id] = density(acc)
        for u in acc.scope:
            by_var[u].add(next_id)
        next_id += 1
        remaining.discard(v)
        for u in acc.scope:
            if u in remaining:
                weights[u] = weight(u)
                heapq.heappush(heap, weights[u])
    rest = sorted(live.values(), key=len)
    acc = rest[0]
    for f in rest[1:]:
        acc = _join(acc, f, (), domain, eps, stats, memo)
    return acc


def eliminate_segmented(factors: list[Factor], owners: list[str], segment_of: Callable[[str], int | None],
                        domain: dict[str, int], keep: tuple[str, ...] = (), eps: float = 0.0,
                        stats: Stats | None = None, memo: JoinMemo | None = None,
                        kinds: dict[Hashable, Solved] | None = None) -> Factor:
    """`eliminate_all`, each segment (segments.py: a periodic stack's module layer, by
    `segment_of` of the op that made each factor, `owners`) eliminated once per kind and shared
    with the others of its kind under their names; with none, `eliminate_all` itself. `kinds`:
    the kinds other eliminations with this domain and eps solved (`memo.kinds` if not given)."""
    segments, rest = find_segments(factors, owners, segment_of, keep)
    if not segments:
        return eliminate_all(factors, domain, keep, eps, stats, memo)

    def eliminate(part: list[Factor], interface: tuple[str, ...], own: Stats) -> Factor:
        return eliminate_all(part, domain, interface, eps, own, memo)

    def share(f: Factor, names: dict[str, str]) -> Factor:
        # one view per factor and names: the problems of a mesh that share f share its views
        # too, and with them the joins among them (JoinMemo)
        if memo is None:
            return renamed(f, names)
        return memo.run(("rename", tuple(names.items())), (f,), lambda own: renamed(f, names), None)

    if kinds is None and memo is not None:
        kinds = memo.kinds
    solved = solve_segments(segments, domain, eliminate, share, kinds, stats)
    return eliminate_all(rest + solved, domain, keep, eps, stats, memo)


def segment_index(graph: OpGraph) -> dict[str, int]:
    """op name -> its module layer, for the ops of a periodic block stack (period > 1: a stack
    layer of several module layers, some alike); empty otherwise, so other graphs are
    eliminated as before. Kept on the graph (keyed by its ops, as `find_chain`): every mesh
    problem asks."""
    cache: tuple[object, dict[str, int]] | None = graph.__dict__.get("_segments")
    if cache is None or cache[0] is not graph.ops:
        found: dict[str, int] = {}
        if graph.blocks and block_layout(graph, graph.blocks[0])[1] > 1:
            block = graph.blocks[0]
            for op in graph.ops:
                if (i := module_layer(graph, block, op.name)) is not None:
                    found[op.name] = i
        cache = (graph.ops, found)
        object.__setattr__(graph, "_segments", cache)
    return cache[1]


@dataclass
class MeshProblem:
    """One mesh's factor graph, with everything that does not depend on pruning solved: the
    template layer eliminated to its per-boundary frontier (`unit`) and the rest of the graph to
    a factor over the boundary (`outside`); without a block stack, just the factors."""

    mesh: Mesh
    chain: Chain | None
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    domain: dict[str, int]
    buffers: float
    stats: Stats
    factors: list[Factor]
    unit: Factor | None = None
    outside: Factor | None = None
    zero: int = 0
    head: Factor | None = None   # with split_outside: the ops before the stack and layer 0
    tail: Factor | None = None   # ... and the ops after the stack (pipelines put them on other stages)
    families: tuple[Chain, ...] = ()  # stacks solved through their templates (families.py)


def _with_recompute(oc: OpCosts, r: int) -> OpCosts:
    """The op's tables with its block's recomputation fixed to r (as the plain arrays)."""
    if not r:
        return oc
    return OpCosts(configs=oc.configs, time=oc.time_rc, mem=oc.mem_rc, parts=oc.parts_rc, comm=oc.comm,
                   time_rc=oc.time_rc, mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, estimated=oc.estimated,
                   step=oc.step)


PartKey = tuple[tuple[str, ...], tuple[tuple[int, int], ...]]


def _part_key(ops: list[Op], fixed: dict[int, int]) -> PartKey:
    """The ops and fixed recomputation choices whose factors `MeshFactors.factors` makes once."""
    return tuple(op.name for op in ops), tuple(sorted(fixed.items()))


class MeshFactors:
    """The factors of one mesh's ops and edges, and their elimination with a layer's
    recomputation chosen. Edge tables are priced once and kept in `edge_costs`."""

    def __init__(self, graph: OpGraph, cm: CostModel, mesh: Mesh, op_costs: dict[str, OpCosts],
                 layer_of: dict[str, int], chain: Chain | None, eps: float, edge_weights: Weights | None,
                 activations: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 memo: JoinMemo | None = None, weighed_from: tuple[MeshFactors, float] | None = None) -> None:
        self.graph, self.cm, self.mesh, self.op_costs = graph, cm, mesh, op_costs
        # (bare, inflight): every leaf is bare's, its activations weighed by inflight (`weighed_like`)
        self.weighed_from = weighed_from
        self.memo = memo  # joins shared with the other problems on this mesh (eliminate_all)
        self.activations = activations
        self.raw_mem: dict[tuple[str, str], np.ndarray] = {}  # edges' unweighted kept copies
        self.layer_of, self.eps, self.edge_weights = layer_of, eps, edge_weights
        self.stats = Stats()
        # ops after the stack read the last layer's output; the boundary variable stands for it -
        # or, with the last layer solved on its own, for the output it reads, its own output tied
        # to the boundary by an equality factor (`solo_out`)
        self.rename: dict[str, str] = {}
        self.solo_out: str | None = None
        if chain and chain.solo:
            self.rename = {chain.layers[-2][-1]: chain.boundary}
            self.solo_out = chain.layers[-1][-1]
        elif chain:
            self.rename = {chain.layers[-1][-1]: chain.boundary}
        self.chain = chain
        self.boundary = chain.boundary if chain else None
        self.template = set(chain.template) if chain else set()  # solved under its own names
        self.domain = {name: len(oc.configs) for name, oc in op_costs.items()}
        self.domain.update({recompute_var(i): 2 for i in set(layer_of.values())})
        self.choices = (0, 1) if recompute_var(1) in self.domain else (0,)
        self.edge_costs: dict[tuple[str, str], EdgeCosts] = {}
        self.pairs: dict[str, list[Pair]] = {}
        # the leaves of each (ops, fixed recomputation) asked for: a bound (`least`) and the
        # elimination (`solved`) of the same part share them
        self.leaves: dict[PartKey, list[Factor]] = {}
        self.owners: dict[PartKey, list[str]] = {}  # per leaf, the op that made it (segment reuse)
        self.segment_of = segment_index(graph).get
        # segment kinds solved on this mesh (the memo's: shared with its other problems), so the
        # template, the rest of the graph and each recomputation case share them
        self.kinds: dict[Hashable, Solved] = memo.kinds if memo is not None else {}
        for pair in cm.bounds.pairs:
            self.pairs.setdefault(pair.b, []).append(pair)

    def _weighed(self, ec: EdgeCosts) -> EdgeCosts:
        return weigh_edge(ec, self.edge_weights) if self.edge_weights is not None else ec

    def edge(self, src: str, dst: str) -> EdgeCosts:
        """Costs of dst reading src's output, priced with the real producer (for the ops after
        the stack: the last layer's output op, whose configurations mirror the boundary's), plus
        any pair constraint between the two (search/prices/boundaries.py)."""
        if (src, dst) not in self.edge_costs:
            graph, cm, mesh = self.graph, self.cm, self.mesh
            prod, cons = graph.op(src), graph.op(dst)
            prod_cfgs = op_configs(prod, mesh, graph.batch_label)
            ec = None
            if any(t.source == src for t in cons.inputs):
                ec = cm.edge_costs(prod, cons, mesh, prod_cfgs, self.op_costs[dst].configs)
            for pair in self.pairs.get(dst, []):
                if pair.a == src:
                    ec = add_edges(ec, cm.pair_costs(pair, mesh, prod_cfgs, self.op_costs[dst].configs))
            assert ec is not None
            self.edge_costs[(src, dst)] = self._weighed(ec)
            self.raw_mem[(src, dst)] = ec.mem
        return self.edge_costs[(src, dst)]

    def factors(self, ops: list[Op], fixed: dict[int, int]) -> list[Factor]:
        """Factors of `ops`; a layer in `fixed` takes that recomputation choice, any other
        layer keeps its choice as a variable. Built once per (ops, fixed); factors are never
        modified, so every caller may share them."""
        key = _part_key(ops, fixed)
        if key not in self.leaves:
            if self.weighed_from is not None:
                bare, inflight = self.weighed_from
                made = [_weighed_leaf(f, inflight) for f in bare.factors(ops, fixed)]
                self.owners[key] = bare.owners[key]
            else:
                made, self.owners[key] = self._factors(ops, fixed)
            self.leaves[key] = [self.memo.leaf(f) for f in made] if self.memo is not None else made
        return self.leaves[key]

    def _factors(self, ops: list[Op], fixed: dict[int, int]) -> tuple[list[Factor], list[str]]:
        """The factors and, for each, the op that made it (its own, its tie, the edges it reads)."""
        out: list[Factor] = []
        owners: list[str] = []
        names = {op.name for op in ops}
        for op in ops:
            layer = self.layer_of.get(op.name)
            rc = recompute_var(layer) if layer is not None and layer not in fixed else None
            oc = self.op_costs[op.name]
            act = self.activations[op.name] if self.activations is not None else None
            if layer is not None and layer in fixed:
                oc = _with_recompute(oc, fixed[layer])
                if act is not None and fixed[layer]:
                    act = (act[1], act[1])
            out.append(_op_factor(op.name, oc, rc, act))
            if op.name == self.solo_out and self.boundary is not None:
                same = np.arange(len(oc.configs))
                out.append(leaf((self.boundary, op.name), np.stack([same, same], 1), np.zeros(len(same)),
                                np.zeros(len(same)), note=f"tie {op.name}={self.boundary}"))
            # its producers, and the ops it must agree with among those solved together
            partners = [pr.a for pr in self.pairs.get(op.name, []) if pr.a in names]
            for src in dict.fromkeys([*(t.source for t in op.inputs if t.source is not None), *partners]):
                ec = self.edge(src, op.name)
                raw = self.raw_mem[(src, op.name)] if self.activations is not None else None
                if layer is not None and fixed.get(layer):
                    ec = EdgeCosts(src=ec.src, dst=ec.dst, time=ec.recomputed_time, mem=recomputed_mem(ec.mem),
                                   comm=ec.comm)
                    raw = None if raw is None else recomputed_mem(raw)
                # the template reads the boundary already; with a stack of 3 whose last layer is
                # solved on its own, its output is the renamed op, but not to itself
                src_var = src if op.name in self.template else self.rename.get(src, src)
                out.append(_edge_factor(ec, src_var, op.name, rc, raw))
            owners.extend([op.name] * (len(out) - len(owners)))
        return out, owners

    def solved(self, ops: list[Op], layer: int | None, keep: tuple[str, ...],
               finish: Callable[[Factor], Factor] | None = None) -> Factor:
        """`ops` eliminated down to `keep` (then `finish`ed), with the recomputation of `layer`
        (if any) chosen: once per choice, the frontiers united."""
        def run(fixed: dict[int, int]) -> Factor:
            f = eliminate_segmented(self.factors(ops, fixed), self.owners[_part_key(ops, fixed)], self.segment_of,
                                    self.domain, keep=keep, eps=self.eps, stats=self.stats, memo=self.memo,
                                    kinds=self.kinds)
            return finish(f) if finish is not None else f

        if layer is None or not any(self.layer_of.get(op.name) == layer for op in ops):
            return run({})
        cases = [run({layer: r}) for r in self.choices]
        if len(cases) == 1:
            return cases[0]
        var = recompute_var(layer)
        return eliminate_var(union(cases, var), var, self.domain, self.eps)



def _weighed_leaf(f: Factor, inflight: float) -> Factor:
    """A leaf kept with its activations apart (m2), under `inflight` micro-batches in flight."""
    return Factor(scope=f.scope, keys=f.keys, t=f.t, m=f.m if f.m2 is None else f.m + inflight * f.m2, note=f.note)


def weighed_like(bare: MeshFactors, op_costs: dict[str, OpCosts], w: Weights) -> MeshFactors:
    """The factors `mesh_factors` makes under stage weights w, made from `bare`'s - the same
    graph, sub-mesh, stack and eps under w's slots and weight copies with no micro-batch in
    flight, activations kept apart (`activations`) - by one multiply-add per leaf instead of
    pricing every op and edge again: the end stages of a pipeline differ only in their
    micro-batches in flight. The same leaves to the bit: a weighed op's memory is its parts
    summed in order, the activations last (`weigh_op`), here the bare sum (activations x 0)
    plus w.inflight x activations; an edge's kept copy scales by w.inflight, and with
    w.inflight >= 1 a recomputed copy stays INFEASIBLE exactly where the bare one is. `op_costs`:
    the ops' tables under w (the problem's, as `mesh_factors` takes them); edges are not priced
    again, so `edge_costs` stays empty."""
    ew = bare.edge_weights
    assert ew is not None and bare.activations is not None and ew.inflight == 0.0
    assert (w.slots, w.copies) == (ew.slots, ew.copies) and w.inflight >= 1.0
    assert op_costs.keys() == bare.op_costs.keys()
    return MeshFactors(bare.graph, bare.cm, bare.mesh, op_costs, bare.layer_of, bare.chain, bare.eps, w,
                       weighed_from=(bare, w.inflight))


def least_of(fgs: list[MeshFactors], ops: list[Op], layer: int | None, keep: tuple[str, ...],
             weights: np.ndarray) -> list[np.ndarray]:
    """Per problem of `fgs` (one graph and mesh under several weightings) and per assignment of
    `keep`, the least w0 * t + w1 * m over every assignment of the other variables of what
    `MeshFactors.solved` eliminates (the same factors, the same recomputation cases), for each
    row (w0, w1) of `weights`: the minima of those frontiers, without them, in one min-sum
    elimination for every problem and case."""
    fg = fgs[0]
    cases: list[dict[int, int]] = [{}]
    if layer is not None and any(fg.layer_of.get(op.name) == layer for op in ops):
        cases = [{layer: r} for r in fg.choices]
    out = least_sums([f.factors(ops, fixed) for f in fgs for fixed in cases], fg.domain, keep, weights)
    out = out.reshape(*out.shape[:-2], len(fgs), len(cases), out.shape[-1]).min(axis=-2)
    return [out[..., i, :] for i in range(len(fgs))]


def stage_parts(graph: OpGraph, chain: Chain, op_costs: dict[str, OpCosts], tail: set[str] | None = None
                ) -> tuple[list[Op], list[Op], list[Op]]:
    """A pipeline's parts of the ops in `op_costs`, in their order there: the template layer, the
    ops before the stack (with layer 0: the first stage's) and those after it (`tail`, if the
    caller has it: the last stage's)."""
    template = set(chain.template)
    tail = tail if tail is not None else after_stack(graph, chain)
    costed = [graph.op(name) for name in op_costs]
    return ([op for op in costed if op.name in template],
            [op for op in costed if op.name not in template and op.name not in tail],
            [op for op in costed if op.name not in template and op.name in tail])


def mesh_factors(graph: OpGraph, cm: CostModel, mesh: Mesh, eps: float, recompute: bool,
                 op_costs: dict[str, OpCosts], edge_weights: Weights, chain: Chain) -> MeshFactors:
    """The factors of a pipeline stage's ops (weighed by the caller) and edges (under
    `edge_weights`), built on demand: what `prepare_mesh(..., factors=)` eliminates and
    `MeshFactors.least` bounds."""
    return MeshFactors(graph, cm, mesh, op_costs, layer_index(graph) if recompute else {}, chain, eps, edge_weights)


def prepare_mesh(graph: OpGraph, cm: CostModel, mesh: Mesh, reuse_blocks: bool = True, eps: float = 0.0,
                 zero: int = 0, recompute: bool = True, op_costs: dict[str, OpCosts] | None = None,
                 split_outside: tuple[bool, bool] | None = None, edge_weights: Weights | None = None,
                 known: tuple[Chain, set[str]] | None = None,
                 activations: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 factors: MeshFactors | None = None, memo: JoinMemo | None = None, unit: bool = True) -> MeshProblem:
    """Cost tables and factors of one mesh under ZeRO stage `zero`; with `recompute`, every
    layer of the block stack may also be recomputed. With a stack, the template layer and the
    rest of the graph are each solved twice, their layer recomputed or not, and the two
    frontiers united (a hub variable touching every op of a layer would double every table).
    `split_outside` = (head, tail): solve the ops before the stack (with layer 0) and those after
    it separately, as pipelines place them on different stages; `edge_weights`: price the edges
    under one pipeline stage's weights (`op_costs` then come weighed); `known`: the graph's stack
    and the ops after it, when the caller has them (the stage search asks once per weighting);
    `activations`: per op its activation bytes without and with recomputation, kept as a second
    memory component in the template layer's elimination (with `edge_weights` holding no
    micro-batch in flight, the edges' kept copies go there too): the pipeline's middle stages
    weigh one such layer frontier each (only the unit is solved then); `factors`: the factors
    `mesh_factors` made with these same arguments, shared with a bound taken from them; `memo`:
    joins shared with the other problems of this mesh and eps (JoinMemo); `unit=False` with
    `split_outside`: the caller has the layer's frontier from elsewhere (the stage search's
    middle-stage elimination), only the head and tail are solved."""
    layer_of = layer_index(graph) if recompute else {}
    # a pipeline's stages cut the stack layer by layer: every layer, the last too, the template's
    # (the stage search passes its own such chain as `known`)
    chain = ((known[0] if known is not None else find_chain(graph, solo=split_outside is None))
             if reuse_blocks else None)
    if factors is not None:
        op_costs = factors.op_costs
    op_costs = op_costs if op_costs is not None else mesh_costs(graph, cm, mesh, zero, chain)
    # find_chain proves layer 0 configures like the template (chain._uniform): the boundary's
    # layouts are the template output's, which the tied stack relies on
    assert not chain or len(op_costs[chain.boundary].configs) == len(op_costs[chain.template[-1]].configs)
    fg = factors if factors is not None else MeshFactors(graph, cm, mesh, op_costs, layer_of, chain, eps, edge_weights,
                                                        activations, memo)
    costed = [graph.op(name) for name in op_costs]
    prob = MeshProblem(mesh=mesh, chain=chain, op_costs=op_costs, edge_costs=fg.edge_costs, domain=fg.domain,
                       buffers=cm.buffers(mesh, costed, zero), stats=fg.stats, factors=[], zero=zero)
    if not chain:
        prob.factors = fg.factors(costed, {})
        return prob
    template = set(chain.template)
    block_ops = [op for op in costed if op.name in template]
    rest_ops = [op for op in costed if op.name not in template]
    out_t = chain.template[-1]
    if unit or split_outside is None:
        prob.unit = fg.solved(block_ops, 1, (chain.boundary, out_t),
                              lambda f: restrict_equal(f, chain.boundary, out_t, chain.boundary))
        prob.unit.layer_leaf = True
        prob.unit.layers = 1
    if split_outside is not None:
        want_head, want_tail = split_outside
        _, head_ops, tail_ops = stage_parts(graph, chain, op_costs, known[1] if known is not None else None)
        if want_head:
            prob.head = fg.solved(head_ops, 0, (chain.boundary,))
        if want_tail:
            prob.tail = fg.solved(tail_ops, None, (chain.boundary,))
        return prob
    # reduce everything else to a factor over the boundary first: the stack's factor is the
    # largest table, and it should meet one frontier per boundary configuration, not one per
    # configuration of every op it happens to share a table with
    prob.outside = fg.solved(rest_ops, 0, (chain.boundary,))
    return prob
