"""The search's fast paths against the general ones they stand in for: each must give the same
result to the bit (bench/frontier_diff.py checks whole frontiers; these check the parts)."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm import frontier
from search.algorithm.frontier import Factor, Stats, join, leaf, peak_join


def _factor(rng: np.random.Generator, scope: tuple[str, ...], domain: dict[str, int], n: int, ties: bool) -> Factor:
    keys = np.stack([rng.integers(0, domain[v], n) for v in scope], axis=1) if scope else np.zeros((n, 0), int)
    # few distinct values make equal sums (and equal-time clusters) common
    t = rng.integers(1, 6, n).astype(float) if ties else rng.uniform(1.0, 10.0, n)
    m = rng.integers(1, 6, n).astype(float) if ties else rng.uniform(1.0, 10.0, n)
    return leaf(scope, keys, t, m)


def _pair(rng: np.random.Generator, names: list[str], least: int) -> tuple[dict[str, int], Factor, Factor]:
    """Two random factors over random subsets of `names`, `least` to 11 points each, with equal
    times and memories common in about a third of the draws."""
    domain = {v: int(rng.integers(1, 4)) for v in names}
    a_scope = tuple(v for v in names if rng.random() < 0.6)
    b_scope = tuple(v for v in names if rng.random() < 0.6)
    ties = bool(rng.random() < 0.3)
    a = _factor(rng, a_scope, domain, int(rng.integers(least, 12)), ties)
    b = _factor(rng, b_scope, domain, int(rng.integers(least, 12)), ties)
    return domain, a, b


def _same(x: Factor, y: Factor) -> None:
    assert x.scope == y.scope
    assert x.keys.dtype == y.keys.dtype and np.array_equal(x.keys, y.keys)
    assert np.array_equal(x.t, y.t) and np.array_equal(x.m, y.m)
    assert all(np.array_equal(p, q) for p, q in zip(x.parent_idx, y.parent_idx, strict=True))
    assert x.parents == y.parents


@pytest.mark.parametrize("seed", range(300))
def test_small_join_equals_numpy_join(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    domain, a, b = _pair(rng, ["u", "v", "w", "x"], least=0)
    a_scope, b_scope = a.scope, b.scope
    shared = [v for v in a_scope if v in b_scope]
    drop = tuple(v for v in shared if rng.random() < 0.5)
    s_small, s_numpy = Stats(), Stats()
    small = join(a, b, drop=drop, domain=domain, stats=s_small)
    monkeypatch.setattr(frontier, "SMALL_PAIRS", -1)  # the numpy path only
    ref = join(a, b, drop=drop, domain=domain, stats=s_numpy)
    _same(small, ref)
    assert s_small == s_numpy


@pytest.mark.parametrize("seed", range(300))
def test_small_join_with_admit_equals_numpy_join(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an `admit` veto (and its rows' `bound`, as the pipeline search's envelope passes
    them) the plain-Python path keeps what the numpy path keeps, to the bit."""
    rng = np.random.default_rng(seed)
    domain, a, b = _pair(rng, ["u", "v", "w", "x"], least=0)
    shared = [v for v in a.scope if v in b.scope]
    drop = tuple(v for v in shared if rng.random() < 0.5)
    # a known plan's staircase: a pair is vetoed where some step is no slower and no heavier
    steps_t, steps_m = np.sort(rng.uniform(2.0, 20.0, 3)), np.sort(rng.uniform(2.0, 20.0, 3))[::-1]

    def beaten_by_steps(t: np.ndarray, m: np.ndarray) -> np.ndarray:
        return ~np.any((steps_t[None, :] <= t[:, None]) & (steps_m[None, :] <= m[:, None]), axis=1)

    def admit(t: np.ndarray, m: np.ndarray, keys: np.ndarray) -> np.ndarray:
        assert keys.shape == (len(t), len(join_scope))
        return beaten_by_steps(t, m)

    join_scope = tuple(v for v in a.scope if v not in drop) + tuple(v for v in b.scope if v not in a.scope and v not in drop)
    s_small, s_numpy = Stats(), Stats()
    small = join(a, b, drop=drop, domain=domain, stats=s_small, admit=admit, bound=beaten_by_steps)
    monkeypatch.setattr(frontier, "SMALL_PAIRS", -1)  # the numpy path only
    ref = join(a, b, drop=drop, domain=domain, stats=s_numpy, admit=admit, bound=beaten_by_steps)
    _same(small, ref)
    assert s_small == s_numpy


def test_small_join_is_taken() -> None:
    """Without equal times the plain-Python path answers (a test of the path, not of speed)."""
    domain = {"u": 2}
    a = leaf(("u",), np.array([[0], [1]]), np.array([1.0, 2.0]), np.array([2.0, 1.0]))
    b = leaf(("u",), np.array([[0], [1]]), np.array([0.5, 0.25]), np.array([1.0, 3.0]))
    assert frontier._join_small(a, b, ("u",), domain, None) is not None
    tied = leaf(("u",), np.array([[0], [0]]), np.array([1.0, 1.0]), np.array([2.0, 1.0]))
    assert frontier._join_small(tied, b, ("u",), domain, None) is None


def test_stacked_cheapest_equals_per_op_weighing() -> None:
    """`_Cheapest` (shape_bound's stacked tables) equals weighing op by op and summing the
    minima in op order, bit for bit, on a real graph's tables under several stage weightings."""
    from search.algorithm.chain import find_chain
    from search.algorithm.evaluate import Weights, mesh_costs, weigh_op
    from search.algorithm.pipeline import _Cheapest
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import CostModel, TrainingJob
    from search.prices.mesh import mesh_candidates

    graph = capture_model(get_model("gpt2-mini"), 8, 64)
    cluster = make_cluster("h100-80gb", 4)
    cm = CostModel(graph, cluster, TrainingJob(global_batch=8, seq_len=64, precision="bf16"))
    chain = find_chain(graph)
    assert chain is not None
    lams = np.array([1e-12, 3e-10, 2e-8])
    for mesh in mesh_candidates(cluster):
        for zero in (0, 3):
            base = mesh_costs(graph, cm, mesh, zero, chain)
            names = [n for n in base if n not in chain.covered]
            for w in (Weights(7.0, 1, 4.0), Weights(3.0, 2, 1.5), Weights(1.0, 1, 0.0)):
                for scale in (1.0, 0.25):
                    ref = np.zeros(2 + len(lams))
                    for name in names:
                        oc = weigh_op(base[name], w)
                        t = np.concatenate([oc.time, oc.time_rc])
                        m = np.concatenate([oc.mem, oc.mem_rc])
                        ref[0] += t.min()
                        ref[1] += m.min()
                        ref[2:] += (scale * t[:, None] + lams[None, :] * m[:, None]).min(axis=0)
                    assert np.array_equal(_Cheapest(base, names).least(w, lams, scale), ref)


def _walk(root: Factor, idx: np.ndarray, layer_maps: list[dict[str, str]] | None) -> dict[str, np.ndarray]:
    """The provenance walk of `frontier.assignments` without its per-layer table: every node
    of every layer visited."""
    n = len(idx)
    out: dict[str, np.ndarray] = {}
    stack: list[tuple[Factor, np.ndarray, np.ndarray, int, dict[str, str] | None]] = [(root, idx, np.arange(n), 0, None)]
    while stack:
        f, ix, pos, offset, mapping = stack.pop()
        if f.layer_leaf and layer_maps is not None:
            mapping = layer_maps[offset]
        for j, v in enumerate(f.scope):
            out.setdefault(mapping.get(v, v) if mapping else v, np.zeros(n, dtype=np.int64))[pos] = f.keys[ix, j]
        if f.is_union:
            which, inner = f.parent_idx
            for k, p in enumerate(f.parents):
                sel = which[ix] == k
                if sel.any():
                    stack.append((p, inner[ix[sel]], pos[sel], offset, mapping))
            continue
        if f.layers and len(f.parents) == 2 and not f.layer_leaf:
            left, right = f.parents
            stack.append((left, f.parent_idx[0][ix], pos, offset, mapping))
            stack.append((right, f.parent_idx[1][ix], pos, offset + left.layers, mapping))
            continue
        for p, pix in zip(f.parents, f.parent_idx, strict=True):
            stack.append((p, pix[ix], pos, offset, mapping))
    return out


def test_layer_tables_read_back_as_the_full_walk() -> None:
    """Reading a stack's points back through the template layer's table (walked once) gives
    every op's configuration as walking every layer's provenance does."""
    from search.algorithm.frontier import assignments
    from search.algorithm.ft import SearchOptions, search
    from search.algorithm.results import MeshSolution
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    graph = capture_model(get_model("gpt2-mini"), 8, 64)
    result = search(graph, make_cluster("h100-80gb", 4), TrainingJob(global_batch=8, seq_len=64, precision="bf16"),
                    SearchOptions(pipeline=False))
    checked = 0
    rng = np.random.default_rng(0)
    for sol in result.solutions:
        assert isinstance(sol, MeshSolution) and sol.chain is not None
        maps = sol.chain.layer_maps()
        everything = np.arange(len(sol.root))
        for rows in (everything, rng.permutation(everything)[: len(everything) // 2], everything[:0]):
            ref = _walk(sol.root, rows, maps)
            got = assignments(sol.root, rows, maps)
            assert ref.keys() == got.keys()
            assert all(np.array_equal(ref[k], got[k]) for k in ref)
            checked += len(rows)
    assert checked > 0


def test_memoised_op_tables_equal_fresh_pricing() -> None:
    """`CostModel.op_costs` answers a repeat from its memo (ZeRO-1 and ZeRO-2 as one table on a
    tensor-parallel mesh): every table equals a fresh pricing by the unmemoised `_op_costs`."""
    import dataclasses

    from search.algorithm.chain import layer_outputs
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import CostModel, TrainingJob
    from search.prices.mesh import TENSOR, mesh_candidates

    graph = capture_model(get_model("gpt2-mini"), 8, 64)
    cluster = make_cluster("h100-80gb", 4)
    cm = CostModel(graph, cluster, TrainingJob(global_batch=8, seq_len=64, precision="bf16"))
    outputs = layer_outputs(graph)
    shared = 0
    for mesh in mesh_candidates(cluster):
        tp = any(ax.role == TENSOR and ax.size > 1 for ax in mesh.axes)
        for zero in (0, 1, 2, 3):
            for op in graph.ops:
                ck = op.name in outputs
                got = cm.op_costs(op, mesh, zero, checkpoint=ck)
                assert cm.op_costs(op, mesh, zero, checkpoint=ck) is got  # the repeat is the memo's
                ref = cm._op_costs(op, mesh, 2 if zero == 1 and tp else zero, ck)
                for f in dataclasses.fields(ref):
                    x, y = getattr(got, f.name), getattr(ref, f.name)
                    assert np.array_equal(x, y) if isinstance(y, np.ndarray) else x == y, f.name
                if zero == 1 and tp:
                    shared += cm.op_costs(op, mesh, 2, checkpoint=ck) is got
    assert shared  # some mesh had a tensor axis: ZeRO-1 and ZeRO-2 shared their tables


class _Forgetful(dict):
    """A memo that keeps nothing: every lookup misses."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


@pytest.mark.parametrize(("model", "seq", "full_bounds"), [("gpt2-mini", 64, False), ("t5-tiny", 16, False),
                                                        ("t5-tiny", 16, True)])
def test_cost_models_made_alike_price_as_fresh_ones(model: str, seq: int, full_bounds: bool) -> None:
    """Cost models of several micro-batch counts made `like` one another (sharing the parts of
    op and edge tables that read no shape) price every op and edge on every mesh and ZeRO stage
    to the bit as a cost model made alone, whichever count priced a shared part first. T5: its
    cross-attention's keys and values enter the attention module beside the decoder's stream, a
    conversion there ambiguous to torch exactly where the two have one shape (seq 16 both), which
    the shared Boundaries must test on the priced graph's shapes, not the first count's (before,
    the other counts found no tensor of their shapes and allowed it: T5's leanest plan came out
    0.7 MB leaner). `full_bounds`: as the pipeline search makes them, every count's model on the
    full-batch graph's Boundaries."""
    from search.algorithm.evaluate import micro_batch_graph, tables
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.boundaries import Boundaries
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import CostModel, TrainingJob
    from search.prices.mesh import Mesh, mesh_candidates, unplaceable_op

    graph = capture_model(get_model(model), 8, seq)
    cluster = make_cluster("h100-80gb", 4)
    job = TrainingJob(global_batch=8, seq_len=seq, precision="bf16")
    bounds = Boundaries(graph) if full_bounds else None
    shared: CostModel | None = None
    checked = 0
    for m in (4, 1, 2, 8):  # the first priced shares its memos with the rest
        g = micro_batch_graph(graph, m)
        mjob = job.model_copy(update={"global_batch": 8 // m})
        alike = CostModel(g, cluster, mjob, bounds=bounds, like=shared)
        shared = shared or alike
        fresh = CostModel(g, cluster, mjob)
        fresh._shared_memos = {name: _Forgetful() for name in fresh._shared_memos}  # every part priced afresh
        for mesh in [Mesh(pp=1, axes=c.axes) for c in mesh_candidates(cluster)]:
            if unplaceable_op(g.ops, mesh, g.batch_label) is not None:
                continue
            for zero in range(4):
                ops_a, edges_a = tables(g, alike, mesh, zero)
                ops_f, edges_f = tables(g, fresh, mesh, zero)
                for name, oc in ops_f.items():
                    oa = ops_a[name]
                    assert oa.configs == oc.configs and oa.estimated == oc.estimated
                    for field in ("time", "mem", "parts", "comm", "time_rc", "mem_rc", "parts_rc", "step"):
                        assert np.array_equal(getattr(oa, field), getattr(oc, field)), (m, mesh, zero, name, field)
                assert edges_a.keys() == edges_f.keys()
                for key, ec in edges_f.items():
                    ea = edges_a[key]
                    assert (ea.time_rc is None) == (ec.time_rc is None) and ea.estimated == ec.estimated
                    for field in ("time", "mem", "comm", "recomputed_time"):
                        assert np.array_equal(getattr(ea, field), getattr(ec, field)), (m, mesh, zero, key, field)
                checked += 1
    assert checked >= 8
    # the shared memos were filled once and read by the other counts' models
    assert shared._shared_memos["param_terms_alike"] and shared._shared_memos["edge_layout"]
    # edges that read alike (every layer's) share one placement logic, priced once
    assert len(shared._shared_memos["edge_logic"]) < len(shared._shared_memos["edge_layout"])


@pytest.mark.parametrize("seed", range(60))
def test_join_bounded_rows_equal_the_full_join(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`join` with `bound` (rows of either side left out before their pairs are formed) gives
    the same factor as vetoing the same pairs one by one, chunked or not, with the pairs counted
    alike; the envelope of known plans is the stage search's (`pipeline._Envelope`)."""
    from search.algorithm.pipeline import _Envelope

    rng = np.random.default_rng(seed)
    domain = {"u": int(rng.integers(1, 5)), "v": int(rng.integers(1, 3))}
    ties = bool(rng.random() < 0.3)
    a = _factor(rng, ("u",), domain, int(rng.integers(1, 80)), ties)
    b = _factor(rng, ("u", "v"), domain, int(rng.integers(1, 80)), ties)
    known = int(rng.integers(1, 12))
    env = _Envelope(rng.uniform(2.0, 20.0, known), rng.uniform(2.0, 20.0, known), float(rng.uniform(0.0, 2.0)),
                    (float(rng.uniform(0.0, 4.0)), float(rng.uniform(0.0, 4.0))))

    def admit(t: np.ndarray, m: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return env.admit(t, m)

    if rng.random() < 0.5:
        monkeypatch.setattr(frontier, "CHUNK_PAIRS", int(rng.integers(5, 200)))  # several chunks
    s_full, s_bounded = Stats(), Stats()
    full = join(a, b, drop=("u",), domain=domain, stats=s_full, admit=admit)
    bounded = join(a, b, drop=("u",), domain=domain, stats=s_bounded, admit=admit, bound=env.admit)
    _same(bounded, full)
    assert s_bounded == s_full


@pytest.mark.parametrize("seed", range(100))
def test_peak_join_is_the_pareto_set_of_pairwise_maxima(seed: int) -> None:
    """`peak_join` (two pipeline stages side by side, stacks.py): per kept assignment, the
    Pareto set of (max time, max memory) over every pair that agrees on the shared variables."""
    rng = np.random.default_rng(seed)
    domain, a, b = _pair(rng, ["u", "v", "w"], least=1)
    a_scope, b_scope = a.scope, b.scope
    drop = tuple(v for v in dict.fromkeys(a_scope + b_scope) if rng.random() < 0.5)
    got = peak_join(a, b, drop=drop, domain=domain)
    out = got.scope
    want: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    for i in range(len(a)):
        for j in range(len(b)):
            val = {**dict(zip(b.scope, b.keys[j], strict=True)), **dict(zip(a.scope, a.keys[i], strict=True))}
            if any(val[v] != b.keys[j][b.scope.index(v)] for v in b.scope):
                continue  # the pair disagrees on a shared variable
            want.setdefault(tuple(int(val[v]) for v in out), []).append((max(a.t[i], b.t[j]), max(a.m[i], b.m[j])))
    pareto = {k: sorted({p for p in pts if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in pts)})
              for k, pts in want.items()}
    mine: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    for r in range(len(got)):
        mine.setdefault(tuple(int(x) for x in got.keys[r]), []).append((float(got.t[r]), float(got.m[r])))
        i, j = got.parent_idx[0][r], got.parent_idx[1][r]  # provenance: the pair it came from
        assert (got.t[r], got.m[r]) == (max(a.t[i], b.t[j]), max(a.m[i], b.m[j]))
    assert {k: sorted(v) for k, v in mine.items()} == pareto


def test_twin_shapes_left_unsolved_change_no_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline shape that prices as an earlier one with another ZeRO stage (ZeRO 0 and 1 on
    stages without data parallelism) is left unsolved: the frontier is the one solving it gives,
    point by point, plan by plan."""
    from search.algorithm import pipeline
    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    graph = capture_model(get_model("gpt2-mini"), 8, 64)
    cluster = make_cluster("h100-80gb", 4)
    job = TrainingJob(global_batch=8, seq_len=64, precision="bf16")
    options = SearchOptions(pipeline=True, accumulate=True)

    def plans(r) -> list[tuple]:
        return [(p.time_s, p.memory_bytes, r.solutions[p.mesh_index].describe(), p.stages, sorted(p.assignment.items()))
                for p in r.points]

    fast = search(graph, cluster, job, options)
    assert fast.stats["pipeline_shapes_twins"] > 0
    monkeypatch.setattr(pipeline, "_twin_taken", lambda *a: False)
    slow = search(graph, cluster, job, options)
    assert slow.stats["pipeline_shapes_twins"] == 0
    assert plans(fast) == plans(slow)


def test_weighed_like_equals_mesh_factors() -> None:
    """`weighed_like` (a stage's factors from the bare ones, activations weighed) gives the
    leaves `mesh_factors` prices for that stage, bit for bit: every part a stage solves (the
    template layer with its recomputation free or fixed, the ops before and after the stack),
    on a real graph's tables, under 1F1B's stage weights and a fractional interleaved one."""
    from search.algorithm.chain import after_stack, find_chain, layer_index
    from search.algorithm.evaluate import Weights, mesh_costs, weigh_op
    from search.algorithm.factor_graph import MeshFactors, mesh_factors, stage_parts, weighed_like
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import CostModel, TrainingJob
    from search.prices.mesh import Mesh, mesh_candidates

    graph = capture_model(get_model("gpt2-mini"), 8, 64)
    cluster = make_cluster("h100-80gb", 4)
    cm = CostModel(graph, cluster, TrainingJob(global_batch=8, seq_len=64, precision="bf16"))
    chain = find_chain(graph)
    assert chain is not None
    tail = after_stack(graph, chain)
    block = 1  # the template's layer index (what `prepare_mesh` fixes the recomputation of)
    checked = 0
    for mesh in mesh_candidates(cluster):
        sub = Mesh(pp=1, axes=mesh.axes)
        for zero in (0, 1):
            base = {n: oc for n, oc in mesh_costs(graph, cm, sub, zero, chain).items() if n not in chain.copies}
            bare_w = Weights(7.0, 1, 0.0)
            bare = MeshFactors(graph, cm, sub, {n: weigh_op(oc, bare_w) for n, oc in base.items()}, layer_index(graph),
                               chain, 0.0, bare_w, activations={n: (oc.parts[:, 3], oc.parts_rc[:, 3])
                                                                for n, oc in base.items()})
            for w in (Weights(7.0, 1, 4.0), Weights(7.0, 1, 1.0), Weights(7.0, 1, 2.5)):
                weighted = {n: weigh_op(oc, w) for n, oc in base.items()}
                ours = weighed_like(bare, weighted, w)
                ref = mesh_factors(graph, cm, sub, 0.0, True, weighted, w, chain)
                ops, head, after = stage_parts(graph, chain, weighted, tail)
                for part, fixed in ((ops, {}), (ops, {block: 0}), (ops, {block: 1}), (head, {0: 1}), (after, {})):
                    for x, y in zip(ours.factors(part, fixed), ref.factors(part, fixed), strict=True):
                        assert (x.scope, x.note) == (y.scope, y.note) and x.m2 is None and y.m2 is None
                        assert np.array_equal(x.keys, y.keys) and x.keys.dtype == y.keys.dtype
                        assert np.array_equal(x.t, y.t) and np.array_equal(x.m, y.m)
                        checked += 1
    assert checked > 100
