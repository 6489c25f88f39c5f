"""Hand-worked checks of search.prices.costmodel: every expected number below is derived in comments
from the formulas of docs/cost-model.md (alpha-beta collectives, roofline compute, Adam state),
not read back from the implementation.

Device figures used (h100-80gb catalog entry): bf16 peak 989.4e12 FLOP/s, HBM 3.35e12 B/s,
intra-node link 450e9 B/s with 3e-6 s per ring step, inter-node 50e9 B/s with 1e-5 s per step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from search.models.graph import Op, OpGraph, ParamRef, TensorRef
from search.prices.cluster import make_cluster
from search.prices.compute import Kernel, op_time
from search.prices.costmodel import ALL_REDUCE, CostModel, TrainingJob
from search.prices.mesh import Mesh, MeshAxis, op_configs

PEAK_BF16 = 989.4e12
HBM = 3.35e12
INTRA_BW, INTRA_LAT = 450e9, 3e-6
INTER_BW, INTER_LAT = 50e9, 1e-5


def T(source: str | None, shape: tuple[int, ...], dims: tuple[str, ...]) -> TensorRef:
    return TensorRef(source=source, shape=shape, dims=dims)


def linear(name: str, src: TensorRef, n_label: str, n: int) -> Op:
    """x[..., k] @ W[n, k]^T, no bias."""
    k_label, k = src.dims[-1], src.shape[-1]
    out = T(None, src.shape[:-1] + (n,), src.dims[:-1] + (n_label,))
    tokens = math.prod(src.shape[:-1])
    return Op(name=name, kind="linear", inputs=(src,), output=out,
              params=(ParamRef(name=f"{name}.weight", shape=(n, k), dims=(n_label, k_label)),),
              splittable=(src.dims[0], n_label, k_label), flops=2.0 * tokens * n * k, saves="inputs")


def dp_mesh(n: int) -> Mesh:
    return Mesh(pp=1, axes=(MeshAxis("dp", n, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))


def dp_tp_mesh(d: int, t: int) -> Mesh:
    return Mesh(pp=1, axes=(MeshAxis("dp", d, t, "data"), MeshAxis("tp", t, 1, "tensor")))


def test_catalog_figures_used_below() -> None:
    c = make_cluster("h100-80gb", 8)
    assert c.device.peak("bf16") == PEAK_BF16
    assert c.device.memory_bandwidth == HBM
    assert (c.intra_node_bandwidth, c.intra_node_latency) == (INTRA_BW, INTRA_LAT)
    assert (c.inter_node_bandwidth, c.inter_node_latency) == (INTER_BW, INTER_LAT)


# ---------------------------------------------------------------- data parallelism

# One Linear: x [B=16, S=4, K=16] (batch, seq, k) @ W [H=32, K=16]^T.
B, S, K, H = 16, 4, 16, 32


@pytest.mark.parametrize(
    ("n", "per_node", "bw", "lat"),
    [
        (8, 8, INTRA_BW, INTRA_LAT),   # dp group of 8 = one node: NVLink figures
        (16, 8, INTER_BW, INTER_LAT),  # dp group of 16 spans two nodes: InfiniBand figures
        (2, 8, INTRA_BW, INTRA_LAT),   # two GPUs of one node
    ],
)
def test_data_parallel_gradient_all_reduce(n: int, per_node: int, bw: float, lat: float) -> None:
    op = linear("fc", T(None, (B, S, K), ("batch", "seq", "k")), "h", H)
    g = OpGraph(name="one", ops=(op,))
    cluster = make_cluster("h100-80gb", n, devices_per_node=per_node)
    cm = CostModel(g, cluster, TrainingJob(global_batch=B, precision="bf16"))
    mesh = dp_mesh(n)
    costs = cm.op_costs(op, mesh)
    cfg = ("batch", None)
    assert costs.configs == [cfg]  # on a data axis an op that carries the batch splits it
    c = 0

    # weight: 32 * 16 = 512 elements, bf16 gradient = 2 bytes each -> 1024 bytes to all-reduce
    grad_bytes = H * K * 2
    assert grad_bytes == 1024
    # ring all-reduce sends and receives 2 (n-1)/n of the buffer per device
    expected_volume = 2 * (n - 1) / n * grad_bytes  # n=8: 1792; n=16: 1920; n=2: 1024
    assert costs.comm[c, 0] == pytest.approx(expected_volume, rel=1e-12)
    assert costs.comm[c, 1] == 0.0

    # all-reduce time: alpha = 2 * latency * ceil(log2 n), beta = 2 (n-1)/n / bandwidth, at the
    # bandwidth NCCL reaches (the link times its efficiency; across nodes through the members' NICs)
    bw = cluster.link(n, 1)[0]
    assert bw == (INTRA_BW * 0.8 if n <= per_node else min(INTRA_BW * 0.8, per_node * INTER_BW * 0.9))
    steps = math.ceil(math.log2(n))  # 3, 4, 1
    alpha, beta = cm.collective_coefficients(mesh, 0)
    assert alpha[ALL_REDUCE] == pytest.approx(2 * lat * steps, rel=1e-12)
    assert beta[ALL_REDUCE] == pytest.approx(2 * (n - 1) / n / bw, rel=1e-12)
    # ZeRO-0 runs as FSDP2's replicate: one all-reduce per wrapped unit (each block layer, the
    # root), whatever its size; this graph has no blocks, so the weight is the root unit's only
    # parameter and pays the whole latency
    t_allreduce = 2 * lat * steps + expected_volume / bw

    # compute, per device with the batch split n ways, at achievable speed (search/prices/compute.py):
    #   flops = 2 * B*S * H*K = 2 * 64 * 512 = 65536, / n on each device
    #   bytes moved = out (B*S*H/n)*2 + in (B*S*K/n)*2 + weight 512*2
    flops = 2 * B * S * H * K
    moved = (B * S * H / n) * 2 + (B * S * K / n) * 2 + H * K * 2
    kt = op_time(op, Kernel(flops=flops / n, bytes=moved, rows=B * S / n, cols=H), cluster.device, PEAK_BF16)
    # Adam step: read+write param (2) + grad (2) + optimizer (12) bytes per element
    t_opt = H * K * 2 * (2 + 2 + 12) / cm.mem_bw
    # the all-reduce runs during backward: only what outlasts the op's own backward shows
    exposed = max(0.0, t_allreduce - kt.backward)
    assert costs.time[c] == pytest.approx(kt.forward + kt.backward + exposed + t_opt, rel=1e-9)

    # the same op replicated (here: on a tensor axis) synchronises nothing and costs the full compute
    rep = cm.op_costs(op, Mesh(pp=1, axes=(MeshAxis("dp", 1, n, "data"), MeshAxis("tp", n, 1, "tensor"))))
    moved_r = B * S * H * 2 + B * S * K * 2 + H * K * 2
    assert rep.configs[0] == (None, None) and rep.comm[0].tolist() == [0.0, 0.0]
    kr = op_time(op, Kernel(flops=flops, bytes=moved_r, rows=B * S, cols=H), cluster.device, PEAK_BF16)
    assert rep.time[0] == pytest.approx(kr.forward + kr.backward + t_opt, rel=1e-9)

    # sharding the weight itself (column "h" or row "k") needs no gradient all-reduce
    for lab in ("h", "k"):
        assert rep.comm[rep.configs.index((None, lab)), 1] == 0.0

    # each device holds the whole weight under data parallelism, as the executor keeps it under
    # mixed precision: fp32 parameter + its bf16 copy (FSDP2's unsharded compute copy), fp32
    # gradient, two fp32 moments: 512 * (4 + 2, 4, 8) bytes
    assert costs.parts[c, :3].tolist() == [3072.0, 2048.0, 4096.0]


# ---------------------------------------------------------------- Megatron MLP

# x [B, S, H] -> ln -> fc1 [F, H] (column) -> gelu -> fc2 [H, F] (row) -> add(ln, fc2)
MB, MS, MH, MF = 8, 8, 16, 64


def megatron_graph() -> OpGraph:
    x = T(None, (MB, MS, MH), ("batch", "seq", "h"))
    ln = Op(name="ln", kind="norm", inputs=(x,), output=T(None, (MB, MS, MH), ("batch", "seq", "h")),
            params=(ParamRef(name="ln.weight", shape=(MH,), dims=("h",)),),
            splittable=("batch", "seq"), flops=8.0 * MB * MS * MH, saves="inputs")
    fc1 = linear("fc1", T("ln", (MB, MS, MH), ("batch", "seq", "h")), "f", MF)
    gelu = Op(name="gelu", kind="elementwise", inputs=(T("fc1", (MB, MS, MF), ("batch", "seq", "f")),),
              output=T(None, (MB, MS, MF), ("batch", "seq", "f")), splittable=("batch", "seq", "f"),
              flops=float(MB * MS * MF), saves="inputs")
    fc2 = linear("fc2", T("gelu", (MB, MS, MF), ("batch", "seq", "f")), "h", MH)
    add = Op(name="add", kind="elementwise",
             inputs=(T("ln", (MB, MS, MH), ("batch", "seq", "h")), T("fc2", (MB, MS, MH), ("batch", "seq", "h"))),
             output=T(None, (MB, MS, MH), ("batch", "seq", "h")), splittable=("batch", "seq", "h"),
             flops=float(MB * MS * MH), saves="none")
    return OpGraph(name="mlp", ops=(ln, fc1, gelu, fc2, add))


@pytest.mark.parametrize("d", [1, 2])
def test_megatron_mlp_two_all_reduces(d: int) -> None:
    t = 4
    g = megatron_graph()
    cluster = make_cluster("h100-80gb", d * t, devices_per_node=8)
    cm = CostModel(g, cluster, TrainingJob(global_batch=MB, precision="bf16"))
    mesh = dp_tp_mesh(d, t)
    b = "batch" if d > 1 else None  # data parallel on dp when it exists
    cfg = {"ln": (b, None), "fc1": (b, "f"), "gelu": (b, "f"), "fc2": (b, "f"), "add": (b, None)}
    for op in g.ops:
        assert cfg[op.name] in op_configs(op, mesh)

    def edge(u: str, v: str):
        e = cm.edge_costs(g.op(u), g.op(v), mesh, [cfg[u]], [cfg[v]])
        return e.comm[0, 0], e.time[0, 0], e.mem[0, 0]

    # the [B, S, H] activation: 8*8*16 = 1024 elements * 2 bytes = 2048 bytes, / d per dp shard
    act_bytes = MB * MS * MH * 2 / d
    # one ring all-reduce on tp (t = 4): 2 * 3/4 * act_bytes = 1.5 * act_bytes (3072 B at d=1)
    one_ar = 2 * (t - 1) / t * act_bytes
    alpha, beta = cm.collective_coefficients(mesh, 1)
    ar_time = 2 * INTRA_LAT * math.ceil(math.log2(t)) + one_ar / (INTRA_BW * cluster.device.intra_node_efficiency)
    assert alpha[ALL_REDUCE] + beta[ALL_REDUCE] * act_bytes == pytest.approx(ar_time, rel=1e-12)

    expected = {
        # forward: ln's replicated output is what fc1 reads (free); backward: fc1's input
        # gradient is Partial over tp (each rank saw a slice of F) -> all-reduce to Replicate
        ("ln", "fc1"): one_ar,
        # column -> gelu -> row: the F-sharded activation and its gradient stay where they are
        ("fc1", "gelu"): 0.0,
        ("gelu", "fc2"): 0.0,
        # forward: fc2's output is Partial (it reduced over the sharded F) -> all-reduce;
        # backward: add's input gradient is Replicate, which is what a Partial output needs
        ("fc2", "add"): one_ar,
        # the residual branch is replicated at both ends
        ("ln", "add"): 0.0,
    }
    total = np.zeros(2)
    for (u, v), tp_bytes in expected.items():
        comm, time, mem = edge(u, v)
        assert comm[1] == pytest.approx(tp_bytes, rel=1e-12), (u, v)
        assert comm[0] == 0.0, (u, v)  # the batch stays split the same way on dp
        assert time == pytest.approx(ar_time if tp_bytes else 0.0, rel=1e-12), (u, v)
        assert mem == 0.0  # nothing is redistributed in the forward pass into an op that keeps it
        total += comm
    # exactly one forward and one backward all-reduce of [B, S, H]: 2 * 1.5 * 2048 / d bytes
    assert total[1] == pytest.approx(2 * (2 * (t - 1) / t * MB * MS * MH * 2) / d, rel=1e-12)
    assert total[1] == pytest.approx(6144 / d, rel=1e-12)

    # the weights are split by tp, so the only gradient sync is over dp (when there is one):
    # fc1/fc2 weights 64*16/4 = 256 elements * 2 B = 512 B, all-reduced with 2 (d-1)/d
    for name in ("fc1", "fc2"):
        oc = cm.op_costs(g.op(name), mesh)
        c = oc.configs.index(cfg[name])
        assert oc.comm[c, 1] == 0.0
        assert oc.comm[c, 0] == pytest.approx(2 * (d - 1) / d * MF * MH / t * 2, rel=1e-12)


def test_megatron_wrong_layout_costs_more() -> None:
    """Row-then-column (the wrong Megatron order) needs an all-gather/reshard between fc1 and
    fc2 instead of nothing: a sanity check that the zero above is not vacuous."""
    t = 4
    g = megatron_graph()
    cm = CostModel(g, make_cluster("h100-80gb", t), TrainingJob(global_batch=MB, precision="bf16"))
    mesh = dp_tp_mesh(1, t)
    # fc1 row-parallel (shards its reduction label h): output Partial; gelu wants it sharded on f
    e = cm.edge_costs(g.op("fc1"), g.op("gelu"), mesh, [(None, "h")], [(None, "f")])
    # forward Partial -> Shard(f) is a reduce-scatter of [B, S, F] = 8*8*64*2 = 8192 B:
    #   3/4 * 8192 = 6144 B; backward gelu's Shard(f) gradient -> Replicate all-gather: 6144 B
    assert e.comm[0, 0, 1] == pytest.approx(2 * 3 / 4 * MB * MS * MF * 2, rel=1e-12)
    assert e.comm[0, 0, 1] == pytest.approx(12288, rel=1e-12)


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sharded_linear_state_memory(t: int) -> None:
    g = megatron_graph()
    cm = CostModel(g, make_cluster("h100-80gb", t), TrainingJob(global_batch=MB, precision="bf16"))
    mesh = dp_tp_mesh(1, t)
    fc1 = g.op("fc1")
    oc = cm.op_costs(fc1, mesh)
    w = MF * MH  # 1024 weight elements
    # bf16 mixed precision with AdamW as the executor holds it: the fp32 parameter and autocast's
    # cached bf16 copy (4 + 2 B), the fp32 gradient (4 B), two fp32 moments (8 B) per element of
    # the local shard - the 16 B of the usual count (2 + 2 + 12) and the 2-byte copy
    for lab in ("f", "h"):  # column- and row-parallel both split the weight t ways
        c = oc.configs.index((None, lab))
        assert oc.parts[c, :3].tolist() == pytest.approx([w / t * 6, w / t * 4, w / t * 8], rel=1e-12)
        # t = 4: [1536, 1024, 2048]
    c = oc.configs.index((None, None))
    assert oc.parts[c, :3].tolist() == [w * 6.0, w * 4.0, w * 8.0]  # [6144, 4096, 8192]
    on_dp = cm.op_costs(fc1, dp_tp_mesh(t, 1))  # data parallel: the full weight on every device
    assert on_dp.configs == [("batch", None)]
    assert on_dp.parts[0, :3].tolist() == [w * 6.0, w * 4.0, w * 8.0]
    # its output [B, S, F] is kept for gelu's backward: column-parallel keeps a 1/t slice,
    #   8*8*64 / t * 2 bytes (t = 4: 2048 B)
    c = oc.configs.index((None, "f"))
    assert oc.parts[c, 3] == pytest.approx(MB * MS * MF / t * 2, rel=1e-12)
    assert oc.mem[c] == pytest.approx(oc.parts[c].sum(), rel=1e-12)


def test_fp32_state_memory() -> None:
    g = megatron_graph()
    cm = CostModel(g, make_cluster("h100-80gb", 4), TrainingJob(global_batch=MB, precision="fp32"))
    oc = cm.op_costs(g.op("fc2"), dp_tp_mesh(1, 4))
    c = oc.configs.index((None, "f"))
    # fp32: param 4, grad 4, Adam moments 8 bytes per element; 1024 / 4 = 256 local elements
    assert oc.parts[c, :3].tolist() == [1024.0, 1024.0, 2048.0]


# ---------------------------------------------------------------- configuration space


def test_indivisible_label_is_not_offered() -> None:
    # a Linear whose output label "f" has size 6
    op = linear("fc", T(None, (8, 4, 16), ("batch", "seq", "k")), "f", 6)
    on4 = op_configs(op, dp_tp_mesh(1, 4))
    # 6 % 4 != 0: "f" cannot be sharded 4 ways; k (16) can (the batch is never split on a tensor axis)
    assert on4 == [(None, None), (None, "k")]
    # 6 is divisible by 2 and by 3
    assert (None, "f") in op_configs(op, dp_tp_mesh(1, 2))
    assert (None, "f") in op_configs(op, Mesh(pp=1, axes=(MeshAxis("dp", 1, 3, "data"), MeshAxis("tp", 3, 1, "tensor"))))
    # on dp x tp the data axis splits the batch and the tensor axis one of the op's own dimensions
    assert op_configs(op, dp_tp_mesh(2, 2)) == [("batch", None), ("batch", "f"), ("batch", "k")]
    # a batch that does not split over the data axis leaves the op nowhere to run
    assert op_configs(op, dp_tp_mesh(3, 1)) == []


# ---- ZeRO stages and recomputation (worked by hand) ----------------------------------------------
def _dp_linear_costs(zero: int, n: int = 8):
    """One linear W[64, 32] (2048 weights) with batch sharded on a dp axis of n: the weight is
    replicated, so its whole data-parallel group is the axis."""
    from search.models.graph import Op, OpGraph, ParamRef, TensorRef
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, CostModel, TrainingJob
    from search.prices.mesh import Mesh, MeshAxis, op_configs

    x = TensorRef(source=None, shape=(16, 4, 32), dims=("batch", "seq", "k"))
    op = Op(name="fc", kind="linear", inputs=(x,), output=TensorRef(shape=(16, 4, 64), dims=("batch", "seq", "n")),
            params=(ParamRef(name="fc.weight", shape=(64, 32), dims=("n", "k")),),
            splittable=("batch", "n", "k"), flops=2.0 * 16 * 4 * 64 * 32)
    g = OpGraph(ops=(op,))
    cm = CostModel(g, make_cluster("h100-80gb", n), TrainingJob(global_batch=16, precision="bf16"))
    mesh = Mesh(pp=1, axes=(MeshAxis("dp", n, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
    c = op_configs(op, mesh).index(("batch", None))
    oc = cm.op_costs(op, mesh, zero=zero)
    return cm, mesh, oc, c, (ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER)


@pytest.mark.parametrize("zero,params,grads,opt", [
    # bf16 as the executor holds it: fp32 parameter (sharded from ZeRO-3) and its bf16 compute
    # copy, held whole to the end of the backward below ZeRO-3 (ZeRO-3's gathered units are
    # `buffers`'), fp32 gradient (sharded from 2), two fp32 moments (sharded from 1)
    (0, 2048 * (4 + 2), 2048 * 4, 2048 * 8),      # everything replicated over dp=8
    (1, 2048 * (4 + 2), 2048 * 4, 2048 * 8 / 8),  # optimizer states sharded
    (2, 2048 * (4 + 2), 2048 * 4 / 8, 2048 * 8 / 8),
    (3, 2048 * 4 / 8, 2048 * 4 / 8, 2048 * 8 / 8),
])
def test_zero_stages_shard_states_over_the_data_parallel_group(zero, params, grads, opt):
    _, _, oc, c, _ = _dp_linear_costs(zero)
    assert oc.parts[c, 0] == pytest.approx(params)
    assert oc.parts[c, 1] == pytest.approx(grads)
    assert oc.parts[c, 2] == pytest.approx(opt)


def test_zero_communication_volumes():
    # per device, ring collectives over n=8 of a 4096-byte gradient / weight (bf16):
    # ZeRO-0: all-reduce 2*(7/8)*4096; ZeRO-2: reduce-scatter + all-gather = the same volume;
    # ZeRO-3: one more all-gather of the weights (forward and backward each gather them);
    # ZeRO-1 as the executor runs it (DDP and ZeroRedundancyOptimizer): the all-reduce, then
    # the owner's broadcast of the updated weight
    vol = {z: _dp_linear_costs(z)[2].comm[_dp_linear_costs(z)[3], 0] for z in (0, 1, 2, 3)}
    assert vol[0] == pytest.approx(2 * 7 / 8 * 4096)
    assert vol[2] == pytest.approx(vol[0])
    assert vol[3] == pytest.approx(3 * 7 / 8 * 4096)
    assert vol[1] == pytest.approx(3 * 7 / 8 * 4096)


def test_recompute_costs_one_more_forward_and_keeps_no_activations():
    cm, mesh, oc, c, _ = _dp_linear_costs(0)
    # forward of the batch-sharded op on one of 8 devices, bf16: it moves its output [2,4,64],
    # its input [2,4,32] and the whole weight [64,32], 2 bytes each = 5632 bytes, far more time
    # than its 2*2*4*64*32 = 32768 FLOPs take, so the roofline is memory-bound
    op = cm.graph.ops[0]
    kt = op_time(op, Kernel(flops=32768, bytes=(2 * 4 * 64 + 2 * 4 * 32 + 2048) * 2, rows=8, cols=64), cm.device, cm.peak)
    assert kt.forward > 32768 / cm.peak + cm.device.kernel_overhead  # memory-bound, plus its launch
    assert oc.time_rc[c] - oc.time[c] == pytest.approx(kt.forward)
    assert oc.parts[c, 3] > 0 and oc.parts_rc[c, 3] == 0
    assert (oc.parts_rc[c, :3] == oc.parts[c, :3]).all()
    # a block's output op keeps its output (the checkpoint the next block recomputes from), its
    # local [2,4,64] in bf16, whatever the op itself saves (its input, recomputed)
    kept = cm.op_costs(cm.graph.ops[0], mesh, checkpoint=True)
    assert kept.parts[c, 3] == 2 * 4 * 32 * 2 and kept.parts_rc[c, 3] == 2 * 4 * 64 * 2


# ---------------------------------------------------------------- a scan's saved states

def test_a_scans_workspace_is_kept_for_backward_and_moved_in_fp32():
    """A selective scan (search/models/scan.py) over u [B=16, D=32, L=4] whose reference keeps
    3 x 8 fp32 elements per output element for backward (states of width N=8): on 8 data ranks
    each holds 2 of the 16 sequences, so 2*32*4 = 256 output elements keep 256 * 24 * 4 = 24,576
    bytes beyond the op without that workspace; the op also writes and reads them back once."""
    u = TensorRef(source=None, shape=(16, 32, 4), dims=("batch", "ch", "seq"))

    def scan(workspace: float) -> Op:
        return Op(name="mixer:selective_scan", kind="scan", inputs=(u,),
                  output=TensorRef(shape=(16, 32, 4), dims=("batch", "ch", "seq")),
                  splittable=("batch", "ch"), flops=16 * 32 * 4 * (8 * 8 + 10), saves="inputs", workspace=workspace)

    mesh = dp_mesh(8)
    costs = {}
    for w in (0.0, 24.0):
        op = scan(w)
        cm = CostModel(OpGraph(ops=(op,)), make_cluster("h100-80gb", 8), TrainingJob(global_batch=16, precision="bf16"))
        c = op_configs(op, mesh).index(("batch", None))
        costs[w] = cm.op_costs(op, mesh).parts[c, 3], cm.op_costs(op, mesh).time[c]
    assert costs[24.0][0] - costs[0.0][0] == 2 * 32 * 4 * 24 * 4
    assert costs[24.0][1] > costs[0.0][1]  # 2 x 24,576 more bytes through memory, forward and backward
    # a tensor axis leaves the scan whole: the executor runs transformers' layer code
    assert op_configs(scan(0.0), dp_tp_mesh(4, 2)) == [("batch", None)]
