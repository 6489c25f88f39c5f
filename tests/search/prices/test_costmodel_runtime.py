"""The cost model prices what the executor runs (issue 15, items 4 and 5): FSDP2's collectives per
wrapped unit, a tensor-parallel partial gradient's own all-reduce, ZeRO-1 as DDP plus per-tensor
broadcasts, the forward collectives a recomputed layer runs again, the logits the loss keeps and
makes, ZeRO-3's gathered units, and the framework overheads and sync cost a profile carries.

Every expected figure is derived here from the rule it checks (catalog h100-80gb figures as in
test_costmodel.py, or a hand-made profile with round numbers), not read back from the model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from search.algorithm.chain import layer_index, recompute_var
from search.algorithm.evaluate import Weights, evaluate, tables, weigh_op
from search.models.graph import BlockInfo, Op, OpGraph, ParamRef, TensorRef
from search.prices.cluster import Cluster, get_device, make_cluster
from search.prices.costmodel import (
    ALL_GATHER,
    ALL_REDUCE,
    LOSS_COPIES,
    CostModel,
    TrainingJob,
    runs_on_dtensor,
    sync_unit_shares,
)
from search.prices.mesh import Mesh, MeshAxis, op_configs
from search.prices.profile import Calibration, CollectiveFit, DeviceProfile, HostInfo, LinearFit, Overheads
from tests.search.graphs import B, H, S, act, linear, norm, pointwise, stack

HBM = 3.35e12
INTRA_LAT = 3e-6


def dp(n: int) -> Mesh:
    return Mesh(pp=1, axes=(MeshAxis("dp", n, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))


def tp(n: int) -> Mesh:
    return Mesh(pp=1, axes=(MeshAxis("dp", 1, n, "data"), MeshAxis("tp", n, 1, "tensor")))


def dp_tp(d: int, t: int) -> Mesh:
    return Mesh(pp=1, axes=(MeshAxis("dp", d, t, "data"), MeshAxis("tp", t, 1, "tensor")))


def catalog(graph: OpGraph, n: int = 8, precision: str = "bf16") -> CostModel:
    """The h100-80gb figures with nothing hidden behind compute, so that each collective's price
    shows whole in the step (how much of it backward hides is test_costmodel.py's)."""
    device = get_device("h100-80gb").model_copy(update={"comm_overlap": 0.0})
    cluster = Cluster(device=device, num_devices=n, devices_per_node=min(n, 8))
    return CostModel(graph, cluster, TrainingJob(global_batch=8, precision=precision))


def cfg_with(oc, want: tuple) -> int:
    return oc.configs.index(want)


def adam_bytes_time(elements: float, b: int = 2, g: int = 2, o: int = 12) -> float:
    """The catalog's optimizer step: read + write of parameter, gradient and Adam state."""
    return elements * 2 * (b + g + o) / (HBM * get_device("h100-80gb").memory_efficiency)


# ---- FSDP2: one collective per wrapped unit ------------------------------------------------------
def test_unit_shares_sum_to_one_per_unit() -> None:
    g = stack(2)  # inp (root), blocks.{0,1}.{ln, fc, add}, head (root)
    sh = sync_unit_shares(g)
    h = 512
    layer = h + h * h  # the norm's weight and the linear's
    assert sh["blocks.0.ln.weight"] == pytest.approx(h / layer)
    assert sh["blocks.1.fc.weight"] == pytest.approx(h * h / layer)
    assert sh["inp.weight"] == pytest.approx(0.5) and sh["head.weight"] == pytest.approx(0.5)
    assert sum(sh.values()) == pytest.approx(3.0)  # three units: two layers and the root


def test_zero0_pays_one_all_reduce_latency_per_unit() -> None:
    """FSDP2's replicate all-reduces a layer's gradients in one call: the layer's ops together
    pay one latency (was: each parameter's share of a 25 MiB bucket, about nothing)."""
    g = stack(2)
    cm = catalog(g)
    mesh = dp(8)
    alpha, beta = cm.collective_coefficients(mesh, 0)
    t_sync = 0.0
    for name in ("blocks.0.ln", "blocks.0.fc"):
        op = g.op(name)
        oc = cm.op_costs(op, mesh, zero=0)
        c = cfg_with(oc, ("batch", None))
        elements = sum(p.numel for p in op.params)
        t_sync += oc.step[c] - adam_bytes_time(elements)
    h = 512
    grads = (h + h * h) * 2  # bf16
    assert t_sync == pytest.approx(alpha[ALL_REDUCE] + beta[ALL_REDUCE] * grads, rel=1e-9)
    assert alpha[ALL_REDUCE] == pytest.approx(2 * INTRA_LAT * 3)  # one latency, not 2/25 MiB of one


def test_zero3_pays_three_collective_latencies_per_unit() -> None:
    g = stack(2)
    cm = catalog(g)
    mesh = dp(8)
    alpha, beta = cm.collective_coefficients(mesh, 0)
    op = g.op("blocks.0.fc")
    oc = cm.op_costs(op, mesh, zero=3)
    c = cfg_with(oc, ("batch", None))
    share = sync_unit_shares(g)["blocks.0.fc.weight"]
    w = op.params[0].numel * 2
    expected = share * (alpha[1] + 2 * alpha[ALL_GATHER]) + beta[1] * w + 2 * beta[ALL_GATHER] * w
    # ZeRO-3's collectives repeat per micro-batch (outside the step), where ZeRO-0's all-reduce,
    # after the last micro-batch, is in it: the compute is the same
    oc0 = cm.op_costs(op, mesh, zero=0)
    c0 = cfg_with(oc0, ("batch", None))
    per_micro_batch = (oc.time[c] - oc.step[c]) - (oc0.time[c0] - oc0.step[c0])
    assert per_micro_batch == pytest.approx(expected, rel=1e-9)
    assert oc.step[c] == pytest.approx(adam_bytes_time(op.params[0].numel / 8), rel=1e-9)


def test_accumulation_syncs_ddp_once_and_repeats_zero3_per_micro_batch() -> None:
    """Four micro-batches of gradient accumulation: DDP all-reduces once, after the last
    (no_sync before it); FSDP2's ZeRO-3 gathers and reduce-scatters for every micro-batch."""
    g = stack(2)
    cm = catalog(g)
    mesh = dp(8)
    op = g.op("blocks.0.fc")
    extra = {}
    for zero in (0, 3):
        oc = cm.op_costs(op, mesh, zero=zero)
        c = cfg_with(oc, ("batch", None))
        one, four = weigh_op(oc, Weights(1, 1, 1)), weigh_op(oc, Weights(4, 1, 1))
        extra[zero] = four.time[c] - one.time[c]  # three more micro-batches
        per_mb = oc.time[c] - oc.step[c]
        assert extra[zero] == pytest.approx(3 * per_mb, rel=1e-9)
    alpha, beta = cm.collective_coefficients(mesh, 0)
    share = sync_unit_shares(g)["blocks.0.fc.weight"]
    w = op.params[0].numel * 2
    zero3_collectives = share * (alpha[1] + 2 * alpha[ALL_GATHER]) + beta[1] * w + 2 * beta[ALL_GATHER] * w
    assert extra[3] - extra[0] == pytest.approx(3 * zero3_collectives, rel=1e-9)


def test_tensor_axis_partial_gradient_pays_a_whole_all_reduce() -> None:
    """A sequence-parallel norm's weight is replicated on the tensor axis but sees split tokens:
    its gradient is partial and a hook of its own all-reduces it (a full latency)."""
    x = act(None, ("batch", "seq", "hidden"))
    op = norm("ln", x)
    # a twin reading the same input with the weight tied to ln's: the same compute, no sync
    twin = norm("ln_tied", x)
    twin = twin.model_copy(update={"params": (twin.params[0].model_copy(update={"name": "ln.weight", "owner": False}),)})
    g = OpGraph(name="ln", ops=(op, twin))
    cm = catalog(g)
    mesh = tp(8)
    oc, ot = cm.op_costs(op, mesh), cm.op_costs(twin, mesh)
    c, ct = cfg_with(oc, (None, "seq")), cfg_with(ot, (None, "seq"))
    alpha, beta = cm.collective_coefficients(mesh, 1)
    grads = 512 * 2
    # the hook all-reduces the partial gradient every backward: per micro-batch, not in the step
    per_micro_batch = (oc.time[c] - oc.step[c]) - (ot.time[ct] - ot.step[ct])
    assert per_micro_batch == pytest.approx(alpha[ALL_REDUCE] + beta[ALL_REDUCE] * grads, rel=1e-9)
    assert oc.step[c] == pytest.approx(adam_bytes_time(512), rel=1e-9)


# ---- ZeRO-1 as the executor runs it --------------------------------------------------------------
def test_zero1_broadcasts_every_tensor_and_runs_as_zero2_under_tensor_parallelism() -> None:
    g = stack(2)
    cm = catalog(g)
    op = g.op("blocks.0.fc")
    n = op.params[0].numel
    mesh = dp(8)
    oc = cm.op_costs(op, mesh, zero=1)
    c = cfg_with(oc, ("batch", None))
    alpha, beta = cm.collective_coefficients(mesh, 0)
    grads = n * 2
    buckets = math.ceil(g.param_count() * 2 / (25 * 2**20))
    all_reduce = alpha[ALL_REDUCE] * grads / (g.param_count() * 2) * buckets + beta[ALL_REDUCE] * grads
    broadcast = alpha[ALL_GATHER] + beta[ALL_GATHER] * grads  # no broadcast fit: priced as an all-gather
    assert oc.step[c] - adam_bytes_time(n / 8) == pytest.approx(all_reduce + broadcast, rel=1e-9)
    # grads stay whole (DDP), optimizer state sharded
    assert oc.parts[c, 1] == pytest.approx(n * 4) and oc.parts[c, 2] == pytest.approx(n * 8 / 8)  # fp32 held
    # with a tensor axis the executor shards gradients too (FSDP2, reshard_after_forward=False)
    m2 = dp_tp(4, 2)
    z1, z2 = cm.op_costs(op, m2, zero=1), cm.op_costs(op, m2, zero=2)
    assert np.array_equal(z1.time, z2.time) and np.array_equal(z1.mem, z2.mem)


# ---- recomputation runs the forward collectives again --------------------------------------------
def mlp_stack(n_layers: int) -> OpGraph:
    """n layers x -> up (hidden -> ffn) -> down (ffn -> hidden) -> act."""
    ops: list[Op] = []
    prev = None
    layers = []
    for i in range(n_layers):
        up = linear(f"blocks.{i}.up", act(prev, ("batch", "seq", "hidden")), "ffn")
        down = linear(f"blocks.{i}.down", act(up.name, up.output.dims), "hidden")
        out = pointwise(f"blocks.{i}.act", [act(down.name, down.output.dims)])
        ops += [up, down, out]
        layers.append((up.name, down.name, out.name))
        prev = out.name
    return OpGraph(name="mlp", ops=tuple(ops), blocks=(BlockInfo(prefix="blocks", layers=tuple(layers)),))


def test_recomputed_layer_pays_its_forward_collectives_twice() -> None:
    g = mlp_stack(3)
    cm = catalog(g)
    mesh = tp(8)
    down, add = g.op("blocks.0.down"), g.op("blocks.0.act")
    d_cfgs, a_cfgs = op_configs(down, mesh, "batch"), op_configs(add, mesh, "batch")
    ec = cm.edge_costs(down, add, mesh, d_cfgs, a_cfgs)
    # a row-parallel down (its input features split) leaves a partial sum, all-reduced into the
    # replicated activation; its replicated gradient goes back as it is
    cu, cv = d_cfgs.index((None, "ffn")), a_cfgs.index((None, None))
    alpha, beta = cm.collective_coefficients(mesh, 1)
    fwd = alpha[ALL_REDUCE] + beta[ALL_REDUCE] * down.output.numel * 2
    assert ec.time[cu, cv] == pytest.approx(fwd, rel=1e-9)
    assert ec.recomputed_time[cu, cv] == pytest.approx(2 * fwd, rel=1e-9)
    # evaluate charges it again only when the consumer's layer is recomputed
    ops, edges = tables(g, cm, mesh)
    assignment: dict[str, np.ndarray | int] = {name: np.array([0]) for name in ops}
    for i in range(3):
        assignment[f"blocks.{i}.up"] = np.array([op_configs(g.op(f"blocks.{i}.up"), mesh, "batch").index((None, "ffn"))])
        assignment[f"blocks.{i}.down"] = np.array([cu])
    layers = layer_index(g)
    t = {}
    for rc in (0, 1):
        a = dict(assignment)
        for i in range(3):
            a[recompute_var(i)] = np.array([rc if i == 1 else 0])
        t[rc] = float(evaluate(ops, edges, 0.0, a, layers)["time"][0])
    again = sum(float(ops[n].time_rc[int(assignment[n][0])] - ops[n].time[int(assignment[n][0])])
                for n in ("blocks.1.up", "blocks.1.down", "blocks.1.act"))
    assert t[1] - t[0] == pytest.approx(again + fwd, rel=1e-9)


# ---- memory ---------------------------------------------------------------------------------------
def lm_head_and_loss(vocab: int = 1024) -> OpGraph:
    x = TensorRef(source=None, shape=(8, 64, 512), dims=("batch", "seq", "hidden"))
    head = Op(name="head", kind="linear", inputs=(x,), output=TensorRef(shape=(8, 64, vocab), dims=("batch", "seq", "vocab")),
              params=(ParamRef(name="head.weight", shape=(vocab, 512), dims=("vocab", "hidden")),),
              splittable=("batch", "seq", "vocab", "hidden"), flops=2.0 * 8 * 64 * vocab * 512, saves="inputs")
    tgt = TensorRef(source=None, shape=(8, 64), dims=("batch", "seq"), dtype="int64")
    logits = TensorRef(source="head", shape=(8, 64, vocab), dims=("batch", "seq", "vocab"))
    loss = Op(name="loss", kind="loss", inputs=(logits, tgt), output=TensorRef(shape=(), dims=()),
              splittable=("batch", "seq"), flops=8.0 * 64 * vocab * 4, saves="output")
    return OpGraph(name="lm", ops=(head, loss))


def test_loss_keeps_its_log_probabilities_and_makes_two_logit_gradients() -> None:
    """Cross entropy keeps log-probabilities (one logits copy) and its backward, the step's first,
    makes two more: three copies at the loss's local input shape - a quarter of the logits on 4
    data-parallel ranks, all of them when tensor parallelism leaves the loss whole."""
    g = lm_head_and_loss()
    logits = 8 * 64 * 1024 * 4  # fp32
    cm = catalog(g, 4, "fp32")
    loss = g.op("loss")
    on_dp = cm.op_costs(loss, dp(4))
    scalar = 4  # the loss value itself, kept
    assert on_dp.parts[cfg_with(on_dp, ("batch", None)), 3] == pytest.approx(LOSS_COPIES * logits / 4 + scalar)
    on_tp = cm.op_costs(loss, tp(4))
    assert LOSS_COPIES == 3 and on_tp.parts[cfg_with(on_tp, (None, None)), 3] == pytest.approx(3 * logits + scalar)
    # the workspace constant leaves the logits to the loss: none of the ops' outputs counts there
    assert cm.buffers(dp(4)) == 0.0


def test_zero3_holds_the_root_and_two_block_layers_gathered() -> None:
    g = stack(4)
    cm = catalog(g)
    mesh = dp(8)
    h = 512
    layer = (h + h * h) * 2  # one block layer's parameters, bf16, gathered whole
    root = 2 * h * h * 2     # inp and head
    worst = 2 * 8 * 64 * h * 2 / 8  # the largest output and its gradient, batch split 8 ways
    assert cm.buffers(mesh, zero=3) == pytest.approx(root + 2 * layer + worst)
    assert cm.buffers(mesh, zero=2) == pytest.approx(worst)


# ---- a profile's overheads and calibrated sync ---------------------------------------------------
def profile(dtensor_op: float = 3e-4, recompute_op: float = 5e-5, **cal) -> DeviceProfile:
    fits = [CollectiveFit(kind=k, group_size=4, alpha=1e-3, beta=1e-9)
            for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")]
    return DeviceProfile(device="cpu", host=HostInfo(cpu_count=0), collectives=fits,
                         optimizer={"fp32": LinearFit(alpha=5e-4, beta=2e-9)},
                         overheads=Overheads(optimizer_tensor=1e-5, optimizer_dtensor=1e-4, dtensor_op=dtensor_op,
                                             recompute_op=recompute_op),
                         calibration=Calibration(**cal) if cal else None)


def cpu_model(g: OpGraph, prof: DeviceProfile) -> CostModel:
    return CostModel(g, make_cluster("cpu", 4, devices_per_node=4), TrainingJob(global_batch=8, precision="fp32"),
                     profile=prof)


def test_profile_prices_the_optimizer_per_tensor() -> None:
    g = stack(2)
    cm = cpu_model(g, profile())
    op = g.op("blocks.0.fc")  # one weight tensor of 512 x 512
    n = op.params[0].numel
    total = g.param_count() * 4
    # ZeRO-0 (FSDP2's replicate): a DTensor parameter; its unit's all-reduce, its share of one latency
    z0 = cm.op_costs(op, dp(4), zero=0)
    c = cfg_with(z0, ("batch", None))
    sync0 = 1e-3 * sync_unit_shares(g)["blocks.0.fc.weight"] + 1e-9 * n * 4
    assert z0.step[c] == pytest.approx(sync0 + 2e-9 * n + 1e-4, rel=1e-9)
    # ZeRO-1 (DDP + ZeroRedundancyOptimizer): plain tensors, a quarter of them stepped here; DDP's
    # one bucket's all-reduce and a broadcast of the tensor (no broadcast fit: an all-gather's)
    z1 = cm.op_costs(op, dp(4), zero=1)
    sync1 = (1e-3 * n * 4 / total * math.ceil(total / (25 * 2**20)) + 1e-9 * n * 4) + (1e-3 + 1e-9 * n * 4)
    assert z1.step[c] == pytest.approx(sync1 + 2e-9 * n / 4 + 1e-5 / 4, rel=1e-9)


def test_profile_prices_dtensor_dispatch_and_checkpointing_per_op() -> None:
    g = stack(2)
    op = g.op("blocks.0.ln")  # a norm: replicated, or sequence-parallel under a style
    mesh = tp(4)
    bare = cpu_model(g, profile(dtensor_op=0.0, recompute_op=0.0)).op_costs(op, mesh)
    full = cpu_model(g, profile()).op_costs(op, mesh)
    sp, rep = full.configs.index((None, "seq")), full.configs.index((None, None))
    assert runs_on_dtensor(op, full.configs[sp], mesh) and not runs_on_dtensor(op, full.configs[rep], mesh)
    # the styled op pays the dispatch (half of it in its forward, which recomputation repeats);
    # every recomputed op pays the checkpoint's own work; the optimizer steps a DTensor either way
    assert full.time[sp] - bare.time[sp] == pytest.approx(3e-4, rel=1e-9)
    assert full.time[rep] - bare.time[rep] == pytest.approx(0.0, abs=1e-15)
    assert (full.time_rc[sp] - full.time[sp]) - (bare.time_rc[sp] - bare.time[sp]) == pytest.approx(3e-4 / 2 + 5e-5)
    assert (full.time_rc[rep] - full.time[rep]) - (bare.time_rc[rep] - bare.time[rep]) == pytest.approx(5e-5)


def test_calibrated_sync_is_added_to_every_collective_call() -> None:
    g = stack(2)
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    job = TrainingJob(global_batch=8, precision="fp32")
    plain = CostModel(g, cluster, job, profile=profile())
    synced = CostModel(g, cluster, job, profile=profile(sync_s=0.01))
    a0, b0 = plain.collective_coefficients(dp(4), 0)
    a1, b1 = synced.collective_coefficients(dp(4), 0)
    assert a0[ALL_REDUCE] == pytest.approx(1e-3) and a1[ALL_REDUCE] == pytest.approx(1e-3 + 0.01)
    assert a1[0] == 0.0 and np.array_equal(b0, b1)
    assert synced.p2p_coefficients(2, 2)[0] == pytest.approx(plain.p2p_coefficients(2, 2)[0] + 0.01)


def test_calibrated_op_cost_is_paid_by_every_op_and_half_again_when_recomputed() -> None:
    g = stack(2)
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    job = TrainingJob(global_batch=8, precision="fp32")
    plain = CostModel(g, cluster, job, profile=profile())
    costly = CostModel(g, cluster, job, profile=profile(op_s=2e-4))
    for op in g.ops:
        a, b = plain.op_costs(op, dp(4)), costly.op_costs(op, dp(4))
        assert np.allclose(b.time - a.time, 2e-4, rtol=0, atol=1e-12)
        assert np.allclose(b.time_rc - a.time_rc, 3e-4, rtol=0, atol=1e-12)


def test_shared_calibration_recovers_a_compute_factor_a_sync_and_an_op_cost() -> None:
    from profiler.calibrate import OPS, SYNC, PlanParts, fit_factors

    rng = np.random.default_rng(3)
    parts = [PlanParts(base=float(rng.uniform(1e-3, 5e-3)), compute={"*": float(rng.uniform(5e-3, 5e-2))},
                       comm={SYNC: float(rng.integers(1, 12)) * 1e-3, OPS: float(rng.integers(30, 80)) * 1e-3},
                       memory=1e6) for _ in range(15)]
    true = {"*": 1.8, SYNC: 6.5, OPS: 0.25}
    measured = [p.time({"*": true["*"]}, {SYNC: true[SYNC], OPS: true[OPS]}) for p in parts]
    c, a = fit_factors(parts, measured, {"*": 1.0}, {SYNC: 0.0, OPS: 0.0})
    assert c["*"] == pytest.approx(true["*"], rel=0.02)
    assert a[SYNC] == pytest.approx(true[SYNC], rel=0.02)
    assert a[OPS] == pytest.approx(true[OPS], rel=0.05)


def test_attention_keeps_the_repeated_kv_of_grouped_query_attention() -> None:
    """K with 2 heads read by an attention of 4 query heads (repeat_interleave, folded into the edge):
    autograd keeps the repeated copy beside K's own output, so the attention's saved bytes include it."""
    x = TensorRef(source=None, shape=(8, 64, 64), dims=("batch", "seq", "hidden"))
    k = Op(name="k", kind="linear", inputs=(x,), output=TensorRef(shape=(8, 64, 32), dims=("batch", "seq", "kv")),
           params=(ParamRef(name="k.weight", shape=(32, 64), dims=("kv", "hidden")),),
           splittable=("batch",), flops=2.0 * 8 * 64 * 32 * 64, saves="inputs")

    def attention(kv_shape: tuple[int, ...]) -> Op:
        src = TensorRef(source="k", shape=kv_shape, dims=("batch", "heads", "seq", "hd"))
        return Op(name="attn", kind="attention", inputs=(src,),
                  output=TensorRef(shape=(8, 4, 64, 16), dims=("batch", "heads", "seq", "hd")),
                  splittable=("batch",), flops=1e6, saves="attention")

    def saved(kv_shape: tuple[int, ...]) -> float:
        att = attention(kv_shape)
        cm = catalog(OpGraph(name="gqa", ops=(k, att)), precision="fp32")
        oc = cm.op_costs(att, dp(8))
        return float(oc.parts[oc.configs.index(("batch", None)), 3])

    plain, repeated = saved((8, 2, 64, 16)), saved((8, 4, 64, 16))
    local = 8 * 4 * 64 * 16 / 8  # the repeated K on one of 8 data-parallel ranks
    assert repeated - plain == pytest.approx(local * 0.5 * 4)  # the half K's own output does not hold, fp32


def test_bf16_loss_holds_three_fp32_copies_of_the_logits() -> None:
    """Under bf16 the loss still upcasts (`F.cross_entropy(logits.float())`): GPT-2's vocabulary
    over 8 x 64 = 512 tokens holds three fp32 logits-sized tensors at the loss's backward,
    3 x 4 x 512 x 50,257 = 308,779,008 bytes (the bf16 count was half of it)."""
    g = lm_head_and_loss(vocab=50257)
    cm = catalog(g, 1, "bf16")
    oc = cm.op_costs(g.op("loss"), dp(1))
    assert oc.parts[0, 3] == pytest.approx(308_779_008 + 4)  # and the fp32 loss value


def test_autocast_holds_fp32_residuals_and_a_bf16_copy_per_matmul() -> None:
    """One device, bf16 under torch.autocast: the residual stream is fp32 (an fp32 input plus a
    bf16 matmul output), a norm keeps its fp32 input and returns fp32, and each of the three
    projections reading the norm's output keeps its own bf16 cast of it; a matmul's output is
    bf16. Each weight a matmul reads is held as fp32 plus autocast's cached bf16 copy; the
    norm's weight, which autocast never casts, as fp32 alone."""
    x = act(None, ("batch", "seq", "h"))
    up = linear("up", x, "h")
    res = pointwise("res", [x, act("up", ("batch", "seq", "h"))], saves="none")
    ln = norm("ln", act("res", ("batch", "seq", "h")))
    q, k, v = (linear(n, act("ln", ("batch", "seq", "h")), "h") for n in ("q", "k", "v"))
    g = OpGraph(name="ac", ops=(up, res, ln, q, k, v))
    cm = catalog(g, 1, "bf16")
    n = B * S * H  # elements of the helpers' activations

    def kept(name: str) -> float:
        return float(cm.op_costs(g.op(name), dp(1)).parts[0, 3])

    assert kept("res") == pytest.approx(4 * n)  # fp32, kept by the norm
    assert kept("ln") == pytest.approx(3 * 2 * n)  # three bf16 casts, the fp32 output itself unkept
    assert kept("q") == 0.0  # nothing reads it
    assert kept("up") == pytest.approx(2 * n)  # the bf16 cast of its graph input; the add keeps nothing
    w = H * H
    assert cm.op_costs(g.op("q"), dp(1)).parts[0, :3].tolist() == [w * 6.0, w * 4.0, w * 8.0]
    assert cm.op_costs(ln, dp(1)).parts[0, :3].tolist() == [H * 4.0, H * 4.0, H * 8.0]
    # fp32 runs keep every tensor at 4 bytes and no copies: the norm's output once, as before
    cm32 = catalog(g, 1, "fp32")
    assert float(cm32.op_costs(ln, dp(1)).parts[0, 3]) == pytest.approx(4 * n)


def tied_lm(vocab: int, tokens: int) -> OpGraph:
    """Token embedding, an LM head reading the same table (GPT-2's tie) and the loss."""
    ids = TensorRef(source=None, shape=(1, tokens), dims=("batch", "seq"), dtype="int64")
    table = ParamRef(name="emb.weight", shape=(vocab, 512), dims=("vocab", "hidden"))
    hidden = TensorRef(shape=(1, tokens, 512), dims=("batch", "seq", "hidden"))
    emb = Op(name="emb", kind="embedding", inputs=(ids,), output=hidden, params=(table,), splittable=("batch", "seq"),
             flops=0.0, saves="none")
    x = TensorRef(source="emb", shape=(1, tokens, 512), dims=("batch", "seq", "hidden"))
    head = Op(name="head", kind="linear", inputs=(x,), output=TensorRef(shape=(1, tokens, vocab), dims=("batch", "seq", "vocab")),
              params=(table.model_copy(update={"owner": False}),), splittable=("batch", "seq", "vocab", "hidden"),
              flops=2.0 * tokens * vocab * 512, saves="inputs")
    tgt = TensorRef(source=None, shape=(1, tokens), dims=("batch", "seq"), dtype="int64")
    logits = TensorRef(source="head", shape=(1, tokens, vocab), dims=("batch", "seq", "vocab"))
    loss = Op(name="loss", kind="loss", inputs=(logits, tgt), output=TensorRef(shape=(), dims=()),
              splittable=("batch", "seq"), flops=4.0 * tokens * vocab, saves="output")
    return OpGraph(name="tied", ops=(emb, head, loss))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_tied_tables_two_gradients_are_summed_beside_every_gradient(precision: str) -> None:
    """At the backward's end autograd sums the head's and the embedding's gradients of the one
    table into a new tensor: two extra fp32 copies, 2 x 4 x 1000 x 512 = 4,096,000 bytes, when the
    activations (here the loss's three fp32 logits copies, 3 x 4 x 64 x 1000 = 768,000 bytes, the
    rest being smaller) are gone. The workspace adds what the copies exceed the loss's by; with
    as many tokens as 2/3 of the width (the loss's copies then outweigh them) it adds nothing."""
    cm = catalog(tied_lm(1000, 64), 1, precision)
    assert cm.tied_sum(dp(1), list(cm.graph.ops)) == pytest.approx(4_096_000 - 768_000)
    assert cm.buffers(dp(1)) == pytest.approx(4_096_000 - 768_000)
    many = catalog(tied_lm(1000, 512), 1, precision)
    assert many.tied_sum(dp(1), list(many.graph.ops)) == 0.0
    # a stage holding only one of the readers (a pipeline's first stage) sums nothing
    assert cm.tied_sum(dp(1), [cm.graph.op("emb")]) == 0.0


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_op_without_params_priced_alike_under_zero_0_2_3(precision: str) -> None:
    """op_costs makes one table for ZeRO stages 0, 2 and 3 of an op without parameters (the
    stage reaches it only through the mixed precision, which differs for ZeRO-1 alone): each
    stage's table priced on its own must equal the shared one, on data- and tensor-parallel
    meshes, with and without mixed precision."""
    from search.prices.mesh import mesh_candidates

    graph = stack(3)
    cluster = make_cluster("h100-80gb", 4)
    cm = CostModel(graph, cluster, TrainingJob(global_batch=8, precision=precision))
    free = [op for op in graph.ops if not op.params]
    assert free
    fields = ("time", "mem", "parts", "comm", "time_rc", "mem_rc", "parts_rc", "step")
    for mesh in mesh_candidates(cluster):
        for op in free:
            for checkpoint in (False, True):
                for zero in (0, 2, 3):
                    shared, own = cm.op_costs(op, mesh, zero, checkpoint), cm._op_costs(op, mesh, zero, checkpoint)
                    for f in fields:
                        np.testing.assert_array_equal(getattr(shared, f), getattr(own, f), err_msg=f"{op.name} {f}")
                    assert shared.configs == own.configs and shared.estimated == own.estimated
