"""The rules that keep every offered configuration executable as priced (search/prices/boundaries.py):
one conversion per tensor shared by its readers, tied parameters placed alike, no conversion
inside a module."""

from __future__ import annotations

import numpy as np

from search.models.graph import Op, OpGraph, ParamRef
from search.prices.boundaries import INFEASIBLE, Boundaries
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, EdgeCosts, TrainingJob
from search.prices.mesh import Mesh, MeshAxis, op_configs
from tests.search.graphs import act, linear, norm, pointwise

TP4 = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("tp", 4, 1, "tensor")))


def fan_graph(modules: bool = False) -> OpGraph:
    """ln -> (q, k): one tensor, two readers, as a norm feeding attention's projections."""
    ln = norm("ln", act(None, ("batch", "seq", "h")))
    q = linear("q", act("ln", ln.output.dims), "fq")
    k = linear("k", act("ln", ln.output.dims), "fk")
    if modules:
        ln, q, k = (op.model_copy(update={"module": m}) for op, m in ((ln, "ln"), (q, "attn.q"), (k, "attn.k")))
    return OpGraph(name="fan", ops=(ln, q, k))


def model(g: OpGraph) -> CostModel:
    return CostModel(g, make_cluster("h100-80gb", 4), TrainingJob(global_batch=8, seq_len=None))


def test_the_first_reader_pays_for_the_conversion():
    g = fan_graph()
    b = Boundaries(g)
    assert b.first_reader == {("ln", "k"): "q"} and b.pays("ln", "q") and not b.pays("ln", "k")
    cm = model(g)
    cfg_ln = op_configs(g.op("ln"), TP4)
    cfg_q, cfg_k = op_configs(g.op("q"), TP4), op_configs(g.op("k"), TP4)
    eq, ek = cm.edge_costs(g.op("ln"), g.op("q"), TP4, cfg_ln, cfg_q), cm.edge_costs(g.op("ln"), g.op("k"), TP4, cfg_ln, cfg_k)
    # ln sequence-split, q column-parallel (reads the whole input): an all-gather, priced once
    i, j = cfg_ln.index((None, "seq")), cfg_q.index((None, "fq"))
    assert eq.time[i, j] > 0 and eq.comm[i, j].sum() > 0 and eq.mem[i, j] > 0
    assert not ek.time.any() and not ek.comm.any() and not ek.mem.any()


def test_readers_of_one_tensor_read_it_alike():
    g = fan_graph()
    cm = model(g)
    (pair,) = cm.bounds.pairs
    cfg_q, cfg_k = op_configs(g.op("q"), TP4), op_configs(g.op("k"), TP4)
    pc = cm.pair_costs(pair, TP4, cfg_q, cfg_k)
    col_q, col_k = cfg_q.index((None, "fq")), cfg_k.index((None, "fk"))
    rep_q, rep_k = cfg_q.index((None, None)), cfg_k.index((None, None))
    # both column-parallel: the same input (whole) and gradient (partial) placement: free
    assert pc.time[col_q, col_k] == 0.0 and pc.mem[col_q, col_k] == 0.0
    # both replicated: whole input, whole gradient: free
    assert pc.time[rep_q, rep_k] == 0.0
    # one column-parallel (partial gradient), one replicated (whole gradient): two conversions back
    assert pc.time[col_q, rep_k] == INFEASIBLE and pc.mem[col_q, rep_k] == INFEASIBLE
    row_q = cfg_q.index((None, "h"))  # row-parallel reads the input split on h
    assert pc.time[row_q, col_k] == INFEASIBLE


def test_tied_parameters_are_placed_alike():
    w = ParamRef(name="emb.weight", shape=(512, 512), dims=("vocab", "h"))
    emb = Op(name="emb", kind="embedding", inputs=(act(None, ("batch", "seq")),), output=act(None, ("batch", "seq", "h")),
             params=(w,), splittable=("batch", "vocab", "h"), flops=0.0, saves="none")
    head = Op(name="head", kind="linear", inputs=(act("emb", ("batch", "seq", "h")),),
              output=act(None, ("batch", "seq", "vocab")), params=(w.model_copy(update={"owner": False}),),
              splittable=("batch", "vocab", "h"), flops=1.0, saves="inputs")
    g = OpGraph(name="tied", ops=(emb, head))
    cm = model(g)
    tied = [p for p in cm.bounds.pairs if p.kind == "tied"]
    assert [(p.a, p.b, p.tensor) for p in tied] == [("emb", "head", "emb.weight")]
    ce, ch = op_configs(emb, TP4), op_configs(head, TP4)
    pc = cm.pair_costs(tied[0], TP4, ce, ch)
    assert pc.time[ce.index((None, "vocab")), ch.index((None, "vocab"))] == 0.0
    assert pc.time[ce.index((None, "vocab")), ch.index((None, None))] == INFEASIBLE


def test_no_conversion_between_two_ops_of_one_module():
    x = act(None, ("batch", "seq", "h"))
    a = pointwise("a", [x]).model_copy(update={"module": "blk"})
    b = pointwise("b", [act("a", x.dims)]).model_copy(update={"module": "blk"})
    c = pointwise("c", [act("b", x.dims)]).model_copy(update={"module": "blk.sub"})
    g = OpGraph(name="mod", ops=(a, b, c))
    bounds = Boundaries(g)
    assert not bounds.convertible(a, b)  # both in blk's forward
    assert bounds.convertible(b, c)      # c's module blk.sub is entered
    cm = model(g)
    ca, cb = op_configs(a, TP4), op_configs(b, TP4)
    ec = cm.edge_costs(a, b, TP4, ca, cb)
    same = [(i, cb.index(c)) for i, c in enumerate(ca)]
    assert all(ec.time[i, j] < INFEASIBLE for i, j in same)
    assert ec.time[ca.index((None, "seq")), cb.index((None, None))] == INFEASIBLE
    # a graph without module names carries no such rule
    plain = OpGraph(name="plain", ops=tuple(op.model_copy(update={"module": ""}) for op in g.ops))
    assert Boundaries(plain).convertible(plain.op("a"), plain.op("b"))


def test_a_module_of_its_own_converts_at_its_output():
    g = fan_graph(modules=True)
    bounds = Boundaries(g)
    assert bounds.own_module(g.op("ln")) and bounds.convertible(g.op("ln"), g.op("q"))


def test_no_frontier_point_breaks_a_rule():
    """The frontier of a graph with fan-out and modules holds finite points only, and each
    assignment satisfies every pair (re-costed, no INFEASIBLE term)."""
    from search.algorithm.evaluate import evaluate, tables
    from search.algorithm.ft import SearchOptions, search

    g = fan_graph(modules=True)
    cl = make_cluster("h100-80gb", 4)
    job = TrainingJob(global_batch=8, seq_len=None)
    res = search(g, cl, job, SearchOptions(meshes=(TP4,), recompute=False, zero_stages=(0,)))
    assert res.points and all(p.time_s < 1e3 and p.memory_bytes < 1e15 for p in res.points)
    ops, edges = tables(g, model(g), TP4)
    for p in res.points:
        r = evaluate(ops, edges, 0.0, {k: np.asarray(v)[p.row:p.row + 1] for k, v in p.configs.items()})
        assert r["time"][0] < INFEASIBLE


def test_leaving_a_module_only_makes_whole_or_shards_what_the_reader_takes_as_is():
    """A style's output hook (RowwiseParallel's or ColwiseParallel's output_layouts) may reduce a
    partial sum or gather a shard whole (the reader then gets the full tensor, whatever it views:
    Megatron's LM head gathers its logits for the loss), or shard a tensor its reader takes without
    a view; re-splitting there would reach the enclosing module's code (attention's
    view(b, t, -1, head_dim)) in a shape it does not expect."""
    from search.prices.boundaries import exit_allowed

    assert exit_allowed("P", "R", same_shape=False)           # row-parallel output, all-reduced
    assert exit_allowed("P", "S:seq", same_shape=True)        # ... reduce-scattered (sequence parallel)
    assert exit_allowed("R", "S:seq", same_shape=True)        # the embedding scattered over the sequence
    assert not exit_allowed("R", "S:seq", same_shape=False)   # q's output, then viewed into heads
    assert not exit_allowed("S:heads", "S:seq", same_shape=True)  # an all-to-all inside attention
    assert exit_allowed("S:h", "R", same_shape=False)         # a gather: the full tensor, any view
    x = act(None, ("batch", "seq", "h"))
    lin = linear("blk.fc", x, "f").model_copy(update={"module": "blk.fc"})
    add = pointwise("blk:add", [act("blk.fc", lin.output.dims)]).model_copy(update={"module": "blk"})
    g = OpGraph(name="exit", ops=(lin, add))
    assert Boundaries(g).crossing(lin, add) == "exit"
    cm = model(g)
    cl, ca = op_configs(lin, TP4), op_configs(add, TP4)
    ec = cm.edge_costs(lin, add, TP4, cl, ca)
    assert ec.time[cl.index((None, "h")), ca.index((None, None))] < INFEASIBLE     # P -> R: all-reduce
    assert ec.time[cl.index((None, "f")), ca.index((None, None))] < INFEASIBLE     # S -> R: a gather


def test_a_module_called_once_per_step_is_its_ops_own_module():
    """An LSTM's recurrent GEMM runs once per time step, so its module holds one op per call: each
    call's output leaves the module (a gather or a reduction there is allowed, as the style's output
    layout runs it per call), while a module holding two different ops stays 'inside'."""
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = capture_model(get_model("lstm-tiny"), 8)
    b = Boundaries(g)
    hh = [op for op in g.ops if op.module == "layers.0.hh"]
    assert len(hh) > 1 and all(b.own_module(op) for op in hh)
    add = next(c for c, _ in g.consumers()[hh[0].name])
    assert b.crossing(hh[0], g.op(add)) == "exit"
    # the layer's own module holds many different ops: an edge between two of them has no boundary
    pointwise = [op for op in g.ops if op.module == "layers.0"]
    assert not b.own_module(pointwise[0])
    reader = next(c for c, _ in g.consumers()[pointwise[0].name] if g.op(c).module == "layers.0")
    assert b.crossing(pointwise[0], g.op(reader)) == "none"


def test_a_module_receiving_two_tensors_of_one_shape_converts_neither_at_its_entry():
    """MPT's block: `ffn(norm_2(x), x)`. PrepareModuleInput would convert ffn's first input, so
    changing the placement of x (the residual) where it enters ffn is infeasible; the same change
    entering a module that receives x alone (norm_2) is not."""
    x = act(None, ("batch", "seq", "h"))
    attn = pointwise("attn", [x]).model_copy(update={"module": "blk.attn"})
    n2 = norm("n2", act("attn", x.dims)).model_copy(update={"module": "blk.norm_2"})
    up = linear("up", act("n2", x.dims), "f").model_copy(update={"module": "blk.ffn.up"})
    down = linear("down", act("up", ("batch", "seq", "f")), "h").model_copy(update={"module": "blk.ffn.down"})
    add = pointwise("add", [act("down", x.dims), act("attn", x.dims)]).model_copy(update={"module": "blk.ffn"})
    g = OpGraph(name="mpt-block", ops=(attn, n2, up, down, add))
    bounds = Boundaries(g)
    shape = tuple(add.inputs[1].shape)
    assert bounds.ambiguous_entry(attn, add, shape) and not bounds.ambiguous_entry(attn, n2, shape)
    cm = model(g)
    ca, cadd = op_configs(attn, TP4), op_configs(add, TP4)
    ec = cm.edge_costs(attn, add, TP4, ca, cadd)
    rep, seq = (None, None), (None, "seq")
    assert ec.time[ca.index(rep), cadd.index(seq)] == INFEASIBLE  # converted entering ffn: ambiguous
    assert ec.time[ca.index(seq), cadd.index(seq)] < INFEASIBLE   # no conversion: fine
    cn = op_configs(n2, TP4)
    assert cm.edge_costs(attn, n2, TP4, ca, cn).time[ca.index(rep), cn.index(seq)] < INFEASIBLE


def nested_graph() -> OpGraph:
    """T5's layer: its input x (the previous layer's residual add) read by the layer norm's first
    op, inside `layer.norm` (a module of two ops), and by the residual add of `layer` itself."""
    x = pointwise("x", [act(None, ("batch", "seq", "h"))]).model_copy(update={"module": "prev"})
    to = pointwise("to", [act("x", x.output.dims)]).model_copy(update={"module": "layer.norm"})
    ln = norm("ln", act("to", x.output.dims)).model_copy(update={"module": "layer.norm"})
    f = linear("f", act("ln", x.output.dims), "h").model_copy(update={"module": "layer.f"})
    add = pointwise("add", [act("x", x.output.dims), act("f", x.output.dims)]).model_copy(update={"module": "layer"})
    return OpGraph(name="nested", ops=(x, to, ln, f, add))


def test_a_reader_inside_another_readers_module_shares_its_conversion():
    """The layer's input hook converts x for everything inside `layer`, the norm included, so the
    norm's reader and the residual add convert x once, at `layer` (the executor does one all-gather
    there; T5's plans priced a second one at `layer.norm`), and read it alike."""
    g = nested_graph()
    b = Boundaries(g)
    assert b.conversion_module(g.op("x"), g.op("to")) == b.conversion_module(g.op("x"), g.op("add")) == "layer"
    assert b.pays("x", "to") and not b.pays("x", "add")
    assert [(p.a, p.b, p.tensor) for p in b.pairs if p.kind == "reader"] == [("to", "add", "x")]
    cm = model(g)
    cx, cto, cadd = (op_configs(g.op(n), TP4) for n in ("x", "to", "add"))
    seq, whole_to = cx.index((None, "seq")), cto.index((None, None))
    # x sequence-split, both readers want it whole: one all-gather, on the first reader's edge
    assert cm.edge_costs(g.op("x"), g.op("to"), TP4, cx, cto).comm[seq, whole_to].sum() > 0
    assert not cm.edge_costs(g.op("x"), g.op("add"), TP4, cx, cadd).comm.any()



def test_readers_outside_a_producers_own_module_share_its_exit_conversion():
    """Mamba's lm head: its logits leave the head (a module of its own) to the loss's cast, at the
    top level, and to the cast the model returns, inside `model`. Neither enters a module, so the
    head's style converts the tensor once where it ends, for both: they must read it alike (the
    search once priced one reading shards and the other whole, which the executor refused)."""
    h = act(None, ("batch", "seq", "h"))
    head = linear("head", h, "vocab").model_copy(update={"module": "model.head"})
    out = pointwise("out", [act("head", head.output.dims)]).model_copy(update={"module": "model"})
    loss = pointwise("loss", [act("head", head.output.dims)])
    g = OpGraph(name="exit", ops=(head, out, loss))
    b = Boundaries(g)
    assert b.conversion_module(head, out) == b.conversion_module(head, loss)
    assert [(p.a, p.b, p.tensor) for p in b.pairs if p.kind == "reader"] == [("out", "loss", "head")]


def post_ln_graph(layers: int = 1) -> OpGraph:
    """BART's post-LN layer: the layer norm ends the attention block (a module of its own) and its
    output is read by fc1, entering its Linear, and by the residual add of the layer's own
    forward, after the MLP."""
    ops: list[Op] = []
    src = None
    for i in range(layers):
        x = pointwise(f"x{i}", [act(src, ("batch", "seq", "h"))]).model_copy(update={"module": f"l{i}.attn"})
        ln = norm(f"ln{i}", act(x.name, x.output.dims)).model_copy(update={"module": f"l{i}.ln"})
        fc1 = linear(f"fc1_{i}", act(ln.name, x.output.dims), "f").model_copy(update={"module": f"l{i}.fc1"})
        fc2 = linear(f"fc2_{i}", act(fc1.name, fc1.output.dims), "h").model_copy(update={"module": f"l{i}.fc2"})
        add = pointwise(f"add{i}", [act(ln.name, x.output.dims), act(fc2.name, x.output.dims)]).model_copy(
            update={"module": f"l{i}"})
        ops += [x, ln, fc1, fc2, add]
        src = add.name
    return OpGraph(name="post-ln", ops=tuple(ops))


def outer_pair_costs(g: OpGraph, prod: str, reader: str, outer: str) -> tuple[CostModel, EdgeCosts]:
    """Checks that `reader` converts prod's output from `outer`'s placement (the graph's one
    'outer' pair, the reader's edge from prod paying nothing) and returns the cost model and the
    pair's tables, indexed [reader's configuration, outer's]."""
    b = Boundaries(g)
    assert b.outer_reader == {(prod, reader): outer} and not b.pays(prod, reader) and b.pays(prod, outer)
    (pair,) = [p for p in b.pairs if p.kind == "outer"]
    assert (pair.a, pair.b, pair.tensor) == (reader, outer, prod)
    cm = model(g)
    cp, cr, co = (op_configs(g.op(n), TP4) for n in (prod, reader, outer))
    assert not cm.edge_costs(g.op(prod), g.op(reader), TP4, cp, cr).comm.any()
    return cm, cm.pair_costs(pair, TP4, cr, co)


def test_a_reader_entering_its_own_module_converts_from_what_the_outer_reader_takes():
    """The norm's style converts its output where the norm ends for every reader (the add reads it
    there, in the layer's forward), so fc1 receives it in the add's placement and its own entry
    converts from there, not from the norm's: that conversion is priced on the pair (add, fc1),
    and the edge norm -> fc1 carries nothing. (The search priced fc1 from the norm's placement: a
    norm computed whole, split for the add where it ends, reached fc1 split, and fc1's gather back
    was unpriced; the executor refused BART's two such pp4 plans.)"""
    g = post_ln_graph()
    ln, fc1, add = g.op("ln0"), g.op("fc1_0"), g.op("add0")
    b = Boundaries(g)
    assert b.crossing(ln, add) == "exit" and b.crossing(ln, fc1) == "entry"
    cm, pc = outer_pair_costs(g, "ln0", "fc1_0", "add0")
    cln, cfc, cadd = (op_configs(op, TP4) for op in (ln, fc1, add))
    col, rep = cfc.index((None, "f")), cfc.index((None, None))   # column-parallel fc1 reads the norm whole
    seq, whole = cadd.index((None, "seq")), cadd.index((None, None))
    assert pc.comm[col, seq].sum() > 0 and pc.time[col, seq] > 0   # the add took it split: fc1 gathers
    assert pc.mem[col, seq] > 0                                     # and keeps the gathered copy
    # taken whole: no forward conversion, no copy; a column-parallel fc1's partial input gradient
    # is all-reduced back to the add's whole one (as a Linear reading the norm directly would)
    assert pc.mem[col, whole] == 0.0 and 0 < pc.time[col, whole] <= pc.time[col, seq]
    assert pc.time[rep, whole] == 0.0 and not pc.comm[rep, whole].any()
    # the exit itself splitting a whole norm output for the add: allowed, and free (a slice)
    ec = cm.edge_costs(ln, add, TP4, cln, cadd)
    assert ec.time[cln.index((None, None)), seq] < INFEASIBLE


def test_outer_pairs_keep_the_search_exact():
    """FT against the exhaustive reference on post-LN stacks (1 and 3 layers) and a layer whose q
    converts inside its residual's conversion, whose pairs are priced conversions rather than
    constraints."""
    from tests.search.algorithm.tied_exact import assert_ft_equals_exhaustive

    for g, recompute in ((post_ln_graph(1), False), (post_ln_graph(3), True), (nested_own_graph(), False)):
        assert_ft_equals_exhaustive(g, make_cluster("h100-80gb", 4), TrainingJob(global_batch=8, seq_len=None),
                                    (TP4,), recompute=recompute)


def nested_own_graph() -> OpGraph:
    """A layer whose residual add reads its input x, and whose attention's q (a Linear, a module
    of its own) reads x too."""
    x = pointwise("x", [act(None, ("batch", "seq", "h"))]).model_copy(update={"module": "prev"})
    q = linear("q", act("x", x.output.dims), "f").model_copy(update={"module": "layer.attn.q"})
    o = linear("o", act("q", q.output.dims), "h").model_copy(update={"module": "layer.attn.o"})
    add = pointwise("add", [act("x", x.output.dims), act("o", x.output.dims)]).model_copy(update={"module": "layer"})
    return OpGraph(name="nested-own", ops=(x, q, o, add))


def test_a_reader_inside_a_module_another_reader_converts_at_converts_from_there():
    """The layer's input hook (the residual add converts the layer's input where the layer
    enters) converts the tensor for everything inside the layer: q, a Linear of the attention
    inside it, receives it in the add's placement and converts it again where the attention
    enters, from there. So q's conversion is priced on an 'outer' pair from the add's placement,
    and the edge x -> q carries nothing. (It was priced from x's own placement, and the executor
    refused the plans whose two placements differed.)"""
    g = nested_own_graph()
    x, q, add = g.op("x"), g.op("q"), g.op("add")
    b = Boundaries(g)
    assert b.conversion_module(x, add) == "layer" and b.conversion_module(x, q) == "layer.attn"
    _, pc = outer_pair_costs(g, "x", "q", "add")
    cq, cadd = op_configs(q, TP4), op_configs(add, TP4)
    col, seq, whole = cq.index((None, "f")), cadd.index((None, "seq")), cadd.index((None, None))
    assert pc.comm[col, seq].sum() > 0 and pc.mem[col, seq] > 0   # split for the add: q gathers it back
    assert pc.mem[col, whole] == 0.0                                # whole for both: no copy
