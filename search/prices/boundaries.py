"""Where a plan may change a tensor's placement, and which ops must agree with each other.

torch's tensor parallelism changes placements at module boundaries only (a style's layouts,
``PrepareModuleInput`` / ``PrepareModuleOutput``; worker/analyze.py). For every configuration the
search offers to run as priced (docs/design.md), three rules follow from the captured graph:

- *one conversion per entry:* a tensor's readers that enter the same module from outside (q, k
  and v entering attention; ln1 and the residual add entering a block) read it in one placement
  and return their gradients in one placement: torch converts it once at that module's boundary,
  and autograd sums the readers' gradients before converting them back once. So the conversion is
  priced on the edge to the group's first reader only, and its other readers are tied to the
  first by a pair constraint. Readers entering different modules (BERT's q, k, v and the residual
  add of the attention's output block) convert separately.
- *tied parameters:* ops that share a parameter (GPT's token embedding and lm head) place it alike.
- *conversions at module entries:* a tensor changes placement where its reader enters a module
  (``PrepareModuleInput``, a style's input layout): the module's own code then sees the converted
  tensor, shapes included. Leaving a producer's module (a style's output layout) a partial sum may
  be reduced whole (a row-parallel output's all-reduce), and, when the reader takes the tensor as
  it is (no view between them), reduced or sliced into shards (sequence parallelism's
  reduce-scatter after a row-parallel Linear, its scatter after the embedding). Gathering or
  re-splitting there, or sharding a tensor the enclosing code then reshapes, would hand that code
  (attention's ``view(b, t, -1, head_dim)``) a shape it does not expect.
  Between two ops of one module's forward there is no boundary, so such an edge keeps its placement.
  What a producer's module does as it ends, and what a module's input hook does, serves every
  reader inside: a reader entering a module of its own beside a reader in the forward around it
  (BART's fc1 and residual add, both reading the post-LN layer norm), or inside a module another
  reader converts the tensor at (q, k and v inside the layer whose residual add reads its input),
  receives the tensor in that outer reader's placement, converted or not, and converts from there
  (`Boundaries.outer_reader`, priced on a pair between the two readers).
  Nor does a tensor change placement where it leaves its module when it is handed on past the
  forward that reads it there (converted there, it would reach its later readers converted too,
  unpriced: `Boundaries.read_elsewhere`), nor where it enters a module that receives another tensor of its
  shape (MPT's ``ffn(hidden, residual)``) or another tensor first (T5's position bias, entering a
  later layer's attention after its hidden states): ``PrepareModuleInput`` converts the module's
  first input, which may be the other one (`Boundaries.ambiguous_entry`).

The rules bind on tensor axes only: a data axis splits the batch everywhere, and the gradients
of what it replicates are reduced by DDP/FSDP over the parameters, not at module boundaries.
Graphs without module names (hand-written or random test graphs) get the first two rules only.
A pair that breaks a rule is priced INFEASIBLE in both objectives: it is dominated by every real
plan (replicating everywhere always satisfies all three), so it never reaches a frontier, and
the tables stay plain sums over ops and edges (an outer pair being one more edge), which keeps FT
exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

from search.models.graph import Op, OpGraph, calls_of_one_op, own_modules

INFEASIBLE = 1e30  # seconds and bytes: beyond any real plan, still finite so sums stay ordered


@dataclass(frozen=True)
class Pair:
    """Two ops whose configurations must agree: `a` reads tensor `tensor` first and `b` reads it
    too (kind 'reader'), or both hold parameter `tensor` (kind 'tied'); or two readers of tensor
    `tensor`, one whose conversion serves the other (where the producer's module ends, or where a
    module around the other's enters) and one converting it again from there (kind 'outer',
    priced: `Boundaries.outer_reader`)."""

    a: str
    b: str
    kind: str
    tensor: str


@dataclass(eq=False)
class Boundaries:
    graph: OpGraph

    @classmethod
    def of(cls, graph: OpGraph) -> Boundaries:
        """The graph's Boundaries, made once: the stack proof (chain.py) and the search's cost
        model both read its pair constraints, a walk of every op's modules. Kept on the graph,
        keyed by its ops (as chain.after_stack keeps its answers)."""
        hit: tuple[object, Boundaries] | None = graph.__dict__.get("_boundaries")
        if hit is None or hit[0] is not graph.ops:
            hit = (graph.ops, cls(graph))
            object.__setattr__(graph, "_boundaries", hit)
        return hit[1]

    @cached_property
    def consumers(self) -> dict[str, list[tuple[str, int]]]:
        return self.graph.consumers()

    @cached_property
    def first_reader(self) -> dict[tuple[str, str], str]:
        """(producer, reader) -> the first reader converting at the same module, for every reader
        but the first of its group."""
        out: dict[tuple[str, str], str] = {}
        for prod, readers in self.consumers.items():
            first: dict[str, str] = {}
            for c in dict.fromkeys(c for c, _ in readers):
                at = self.conversion_module(self.graph.op(prod), self.graph.op(c))
                if at in first:
                    out[(prod, c)] = first[at]
                else:
                    first[at] = c
        return out

    def conversion_module(self, prod: Op, reader: Op) -> str:
        """Where the reader's copy of prod's output changes placement: the innermost module it
        enters from outside that is not its own (its readers there share one conversion); its own
        module when that is all it enters (a style's input layout); '' without module names.
        Where another reader of the tensor converts it at a module around that one, and the reader
        is one op of a module of several (a layer norm), the outermost such module: its input hook
        converts the tensor for everything inside (T5's layer norm, inside the attention layer whose
        residual add reads the layer's input too), so the inner reader receives it converted and
        the two share one conversion (worker/analyze.py). A reader with a module of its own (BART's
        column-parallel q, k and v, inside the attention its layer's residual add encloses) keeps
        its own: its style returns a partial gradient the residual's does not, reduced apart."""
        if not self.has_modules:
            return ""
        own = self._innermost_entry(prod, reader)
        if self.own_module(reader):
            return own
        around = self._entries_of(prod.name)
        outer = [m for m in _ancestors(own)[:-1] if m in around]
        return outer[0] if outer else own

    def _entries_of(self, prod: str) -> frozenset[str]:
        """The innermost modules where the readers of prod's output enter (`_innermost_entry`)."""
        memo: dict[str, frozenset[str]] = self.__dict__.setdefault("_entries_memo", {})
        if prod not in memo:
            p = self.graph.op(prod)
            memo[prod] = frozenset(self._innermost_entry(p, self.graph.op(c)) for c, _ in self.consumers.get(prod, []))
        return memo[prod]

    def _innermost_entry(self, prod: Op, reader: Op) -> str:
        # a function of the two modules (`own_module` reads the reader's module alone), every
        # edge and pair constraint asks
        return self._per_module_pair("_entry_memo", prod, reader, self._entered)

    def _per_module_pair(self, memo_name: str, prod: Op, reader: Op, find: Callable[[Op, Op], str]) -> str:
        """`find(prod, reader)` where it reads the two ops' modules alone: found once per pair of
        modules (in the memo `memo_name`), not per pair of ops."""
        memo: dict[tuple[str, str], str] = self.__dict__.setdefault(memo_name, {})
        key = (prod.module, reader.module)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = find(prod, reader)
        return hit

    def _entered(self, prod: Op, reader: Op) -> str:
        around = set(_ancestors(prod.module))
        entered = [m for m in _ancestors(reader.module) if m not in around]
        if entered and self.own_module(reader) and entered[-1] == reader.module:
            entered = entered[:-1] or entered
        if entered:
            return entered[-1]
        # no module entered: where prod's own module ends, its style or output hook converts the
        # tensor once, for every reader outside it (Mamba's logits, read by the loss's cast and by
        # the cast the model returns): those readers share that one conversion
        return f"<exit {prod.module}>" if self.own_module(prod) else f"<inside {reader.module}>"

    @cached_property
    def outer_reader(self) -> dict[tuple[str, str], str]:
        """(producer, reader) -> the reader whose conversion of prod's output `reader` receives and
        converts again, for the first reader of each group converting the tensor where it enters
        a module: the first reader of the group converting it at the nearest module around this
        group's (BART's residual add, converting the layer's input where the layer enters, around
        q, k and v converting it where the attention enters), else the first reader taking it
        where prod's module ends (BART's post-LN layer norm: read by the residual add in the
        layer's own forward and by fc1, entering its Linear). An outer hook converts the tensor
        for everything inside it, whatever the placement the reader then wants: the tensor
        reaches the reader in the outer reader's placement (converted there, or as made when that
        reader takes it so), and the reader converts it from there. So its conversion is priced
        on a pair (kind 'outer') between the two readers, from the outer reader's placement to
        its own, and its edge from prod carries none."""
        out: dict[tuple[str, str], str] = {}
        for prod, readers in self.consumers.items():
            p = self.graph.op(prod)
            names = list(dict.fromkeys(c for c, _ in readers))
            exits = [c for c in names if self.crossing(p, self.graph.op(c)) == "exit"]
            firsts = [c for c in names if (prod, c) not in self.first_reader and self.crossing(p, self.graph.op(c)) == "entry"]
            at = {c: self.conversion_module(p, self.graph.op(c)) for c in firsts}
            for c in firsts:
                around = [o for o in firsts if o != c and at[o] in _ancestors(at[c])[:-1]]
                if around:
                    out[(prod, c)] = max(around, key=lambda o: len(_ancestors(at[o])))
                elif exits:
                    out[(prod, c)] = exits[0]
        return out

    def outer_reader_of(self, prod: str, reader: str) -> str | None:
        """The reader whose placement `reader` receives prod's output in and converts from
        (`outer_reader`, for the first reader of its group and the others converting with it)."""
        return self.outer_reader.get((prod, self.first_reader.get((prod, reader), reader)))

    @cached_property
    def pairs(self) -> list[Pair]:
        """Every constraint between two ops, the first-named op before the second in graph order."""
        out = [Pair(a=first, b=reader, kind="reader", tensor=prod) for (prod, reader), first in self.first_reader.items()]
        order = {op.name: i for i, op in enumerate(self.graph.ops)}
        for (prod, reader), outer in self.outer_reader.items():
            a, b = sorted((reader, outer), key=order.__getitem__)
            out.append(Pair(a=a, b=b, kind="outer", tensor=prod))
        holders: dict[str, list[str]] = {}
        for op in self.graph.ops:
            for p in op.params:
                holders.setdefault(p.name, []).append(op.name)
        for pname, ops in holders.items():
            for other in dict.fromkeys(ops[1:]):
                if other != ops[0]:
                    out.append(Pair(a=ops[0], b=other, kind="tied", tensor=pname))
        return out

    def pays(self, prod: str, reader: str) -> bool:
        """Whether the edge prod -> reader carries the conversion of prod's output (first reader;
        not one converting from an outer reader's placement, `outer_reader`)."""
        return (prod, reader) not in self.first_reader and (prod, reader) not in self.outer_reader

    def any_reader_keeps(self, prod: str) -> bool:
        """Whether some reader of prod's output keeps it for its backward."""
        return any(self.graph.op(c).saves in ("inputs", "attention") for c, _ in self.consumers[prod])

    @cached_property
    def _own_modules(self) -> frozenset[str]:
        return own_modules(self.graph.ops)

    @cached_property
    def has_modules(self) -> bool:
        return any(op.module for op in self.graph.ops)

    def own_module(self, op: Op) -> bool:
        """The op is the only op of a module without submodules: its output leaves that module.
        A module called more than once per forward (an RNN's recurrent GEMM, once per time step)
        records one op per call: it counts as the op's own when every op it holds is a call of
        the same kind on the same parameters."""
        return bool(op.module) and op.module in self._own_modules

    @cached_property
    def calls_of_one_op(self) -> dict[str, bool]:
        """module -> whether all its ops are calls of one parameterised op (graph.calls_of_one_op)."""
        return calls_of_one_op(self.graph.ops)

    def crossing(self, prod: Op, reader: Op) -> str:
        """How the edge prod -> reader may change placement: 'entry' (the reader enters a module
        prod is not in: any change), 'exit' (only prod's own module is left: a partial sum may
        be reduced to whole or shards, nothing else), 'none' (inside one module's forward). Without
        module names every edge is an 'entry'."""
        # a function of the two modules (`own_module` reads prod's module alone), asked per edge priced
        return self._per_module_pair("_crossing_memo", prod, reader, self._crossing)

    def _crossing(self, prod: Op, reader: Op) -> str:
        if not self.has_modules or set(_ancestors(reader.module)) - set(_ancestors(prod.module)):
            return "entry"
        return "exit" if self.own_module(prod) and not self.read_elsewhere(prod) else "none"

    def read_elsewhere(self, prod: Op) -> bool:
        """Some reader of prod's output lies outside every module in whose forward a reader takes
        it as prod's module leaves it: the tensor is handed on past that forward (T5's position
        bias, made in layer 0's attention and read there, and returned to the layer stack for every
        later layer's attention). Converted where it leaves prod's module, for layer 0's reader,
        it would reach the later layers converted too, which the pricing of their own edges (from
        prod's placement) does not see: such a tensor leaves its module as made, and each reader
        converts it where it enters a module (gathered for layer 0, the bias reached later layers
        reading it split whole). Readers inside the forward that reads it (Phi-3's activation
        module beside the split of its fused gate_up) get the converted tensor alike, which
        worker/analyze.py checks. Read per module, as `crossing` is: any op of prod's own module
        (its only op, or its calls of one op)."""
        memo: dict[str, bool] = self.__dict__.setdefault("_elsewhere_memo", {})
        if prod.module not in memo:
            around = set(_ancestors(prod.module))
            readers = [self.graph.op(c).module for op in self._ops_within.get(prod.module, [prod])
                       for c, _ in self.consumers.get(op.name, [])]
            # the exit readers' modules, the root's included ('': Mamba's loss cast of the logits,
            # beside the model's own), which holds every module
            forwards = {m for m in readers if m in around or not m}
            memo[prod.module] = bool(forwards) and any(not ({"", *_ancestors(m)} & forwards) for m in readers)
        return memo[prod.module]

    def convertible(self, prod: Op, reader: Op) -> bool:
        """Whether the edge may change placement at all (an entry, or a reduction at an exit)."""
        return self.crossing(prod, reader) != "none"


    def ambiguous_entry(self, prod: Op, reader: Op, shape: tuple[int, ...], graph: OpGraph | None = None) -> bool:
        """Whether converting prod's output where the reader enters its conversion module is
        ambiguous to torch: PrepareModuleInput converts a module's first input, right only when the
        tensor is the one of its shape entering the module, and the first to enter it. MPT's MLP, `ffn(hidden, residual)`, takes
        two [batch, seq, hidden] tensors, so a plan converting one of them there cannot run (the
        executor refuses it, worker/analyze.py `refuse_ambiguous_entry`). Not ambiguous: a reader's
        own style's input layout (its own module, a Linear's), and a module called once per tensor
        (ViT's one dropout, each call's tensor its first).

        `shape` is the tensor's shape in `graph` (default: this Boundaries' own graph), whose
        shapes the other tensors entering the module are read from: a Boundaries serves graphs
        with its graph's ops and modules but other shapes (the micro-batch graphs, whose cost
        models share one), and whether two tensors have one shape depends on the batch the
        executor runs (T5's encoder output and decoder stream do where their sequences agree)."""
        if not self.has_modules:
            return False
        m = self.conversion_module(prod, reader)
        if m == reader.module and self.own_module(reader) and reader.params:
            return False
        return (self._entering(m, shape, self.graph if graph is None else graph) > 1
                or not self.enters_first(m, prod.name))

    def enters_first(self, m: str, prod: str) -> bool:
        """Whether prod's output is the first tensor entering module m, read first inside it (a
        module called once per tensor: each call's). PrepareModuleInput converts the module's first
        input: a later one, of any shape, is not what it converts (T5's position bias entering a
        later layer's attention after its hidden states, BART's encoder output entering the
        cross-attention after the decoder's stream)."""
        sources = self._sources_entering(m)
        return sources is None or not sources or sources[0][2] == prod

    def _sources_entering(self, m: str) -> list[tuple[str, int, str]] | None:
        """Module m's entering inputs (reader, input index, source) read from outside it, in order
        (None: a module called once per tensor); found once per module."""
        if m not in self._entering_sources:
            inside = self._ops_within.get(m, [])
            if (len(inside) > 1 and all(op.module == m for op in inside) and len({op.target for op in inside}) == 1
                    and all(len(op.inputs) == 1 for op in inside)):
                self._entering_sources[m] = None  # one call per tensor
            else:
                names = {op.name for op in inside}
                self._entering_sources[m] = [(op.name, i, t.source if t.source is not None else "<graph input>")
                                             for op in inside for i, t in enumerate(op.inputs)
                                             if t.source not in names]
        return self._entering_sources[m]

    def _entering(self, m: str, shape: tuple[int, ...], graph: OpGraph) -> int:
        """How many distinct tensors of `shape` in `graph` enter module m (1 for a module called
        once per tensor). Cached per graph, the graph kept alive in the entry so its id stays its own."""
        held, cache = self._entering_cache.setdefault(id(graph), (graph, {}))
        assert held is graph
        sources = self._sources_entering(m)
        if sources is None:
            return 1
        if shape not in cache.setdefault(m, {}):
            cache[m][shape] = len({src for name, i, src in sources if tuple(graph.op(name).inputs[i].shape) == shape})
        return cache[m][shape]

    @cached_property
    def _ops_within(self) -> dict[str, list[Op]]:
        """module -> the ops inside it, its submodules' included."""
        out: dict[str, list[Op]] = {}
        for op in self.graph.ops:
            for m in _ancestors(op.module):
                out.setdefault(m, []).append(op)
        return out

    @cached_property
    def _entering_sources(self) -> dict[str, list[tuple[str, int, str]] | None]:
        """module -> its entering inputs (reader, input index, source) read from outside it, in
        any graph with this one's ops (None: a module called once per tensor)."""
        return {}

    @cached_property
    def _entering_cache(self) -> dict[int, tuple[OpGraph, dict[str, dict[tuple[int, ...], int]]]]:
        """id(graph) -> (graph, module -> shape -> `_entering`)."""
        return {}


def exit_allowed(src: str, dst: str, same_shape: bool) -> bool:
    """Whether a placement may change from src to dst as the tensor leaves its producer's module
    (codes 'R', 'P', 'S:label'; `same_shape`: the reader takes the tensor with no view between)."""
    if src == dst or (dst == "R" and (src == "P" or src.startswith("S:"))):
        return True  # reduced or gathered whole: the reader gets the full tensor, whatever it views
    return same_shape and src in ("P", "R") and dst.startswith("S:")


@cache
def _ancestors(fqn: str) -> tuple[str, ...]:
    """A module's enclosing modules, outermost first, itself last. Cached: an edge's pricing asks
    for both ends' (hundreds of thousands of times in a large MoE's search, a few hundred names)."""
    parts = fqn.split(".") if fqn else []
    return tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))
