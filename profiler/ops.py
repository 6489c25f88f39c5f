"""Op timing: every distinct op signature the search will consider, forward and backward.

What to time (`enumerate_signatures`): for each mesh the search tries (search.prices.mesh.mesh_candidates)
and each op in each of its configurations (search.prices.mesh.op_configs), the op's signature at its
local shapes (search.prices.profile.op_signature). Repeated layers and meshes that give an op the same
local shapes collapse to one signature, so a 24-layer model costs what one layer does.

How (`time_signature`): a real torch op per kind at the local shapes - F.linear, F.embedding,
layer/RMS/batch norm, scaled_dot_product_attention, the aten op of a pointwise node, cross
entropy, convolution, pooling - run forward then backward (gradients for parameters and for
inputs that come from another op), after warm-up, repeated, median and spread. On CPU the
clock is perf_counter with torch's threads set as the worker runs them (one process per device,
the cores shared); on CUDA, events around forward and backward. A pointwise op whose aten
target cannot be called from its shapes alone is timed through a stand-in with the same shapes
and memory traffic, and the entry says so (`proxy`).

`profile_ops` times what a base profile does not hold yet, so a second model, or a rerun, times
only what is new.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from search import Cluster
from search.models.graph import Op, OpGraph
from search.prices.mesh import (
    Config,
    Mesh,
    context_meshes,
    expert_meshes,
    input_placement,
    mesh_candidates,
    op_configs,
    output_placement,
    param_placement,
)
from search.prices.profile import LinearFit, OpEntry, Stat, is_causal, local_shape, op_signature, short_target, value_dtype

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "i64": torch.int64,
                "i32": torch.int32, "bool": torch.bool}


@dataclass
class OpInstance:
    """One signature to time, with the first (op, mesh, configuration) that produced it."""

    signature: str
    op: Op
    mesh: Mesh
    cfg: Config
    count: int = 1  # (op, mesh, configuration) triples sharing this signature


@dataclass
class SignatureSet:
    items: dict[str, OpInstance] = field(default_factory=dict)
    instances: int = 0  # (op, mesh, configuration) triples seen, before deduplication

    def add(self, other: SignatureSet) -> None:
        for sig, inst in other.items.items():
            if sig in self.items:
                self.items[sig].count += inst.count
            else:
                self.items[sig] = inst
        self.instances += other.instances


def enumerate_signatures(graph: OpGraph, cluster: Cluster, precision: str, meshes: list[Mesh] | None = None,
                         pipelines: list[tuple[OpGraph, Mesh]] | None = None) -> SignatureSet:
    """The distinct op signatures the search will price for `graph` on `cluster`: on every
    mesh, and for pipelines (`pipelines`, from `pipeline_graphs`) on every stage sub-mesh at
    every micro-batch size."""
    # the search also tries expert-parallel variants of each mesh for a graph with routed experts,
    # and context-parallel ones for a long sequence (whose attention is priced as its measured
    # local block, once per ring step: search/prices/costmodel.py)
    meshes = context_meshes(graph, expert_meshes(graph, mesh_candidates(cluster) if meshes is None else meshes))
    out = SignatureSet()
    for g, mesh in [(graph, m) for m in meshes] + list(pipelines or []):
        for op in g.ops:
            for cfg in op_configs(op, mesh, g.batch_label):
                sig = op_signature(op, mesh, cfg, precision)
                out.instances += 1
                if sig in out.items:
                    out.items[sig].count += 1
                else:
                    out.items[sig] = OpInstance(sig, op, mesh, cfg)
    return out


def pipeline_graphs(graph: OpGraph, cluster: Cluster, job, zero_stages: tuple[int, ...] = (0, 1, 2, 3),
                    allow_async: bool = False) -> list[tuple[OpGraph, Mesh]]:
    """(micro-batch graph, stage sub-mesh) pairs the pipeline search prices ops on - the same
    shapes search.algorithm.pipeline.search_pipelines walks (none when the graph cannot be pipelined)."""
    from search.algorithm.chain import find_chain
    from search.algorithm.evaluate import micro_batch_graph, unsupported
    from search.algorithm.pipeline import pipeline_shapes

    chain = find_chain(graph)
    if chain is None or unsupported(graph, chain) is not None:
        return []
    graphs: dict[int, OpGraph] = {}
    pairs: dict[tuple[int, Mesh], tuple[OpGraph, Mesh]] = {}
    for shape in pipeline_shapes(cluster, job, len(chain.layers), zero_stages, allow_async):
        m = shape.micro_batches
        if m not in graphs:
            graphs[m] = micro_batch_graph(graph, m)
        pairs.setdefault((m, shape.mesh), (graphs[m], shape.mesh))
    return list(pairs.values())


# ---- building a runnable op --------------------------------------------------------------------
@dataclass
class Bench:
    """A callable op with its leaf tensors: `fn()` runs the forward from them."""

    fn: Callable[[], torch.Tensor]
    leaves: list[torch.Tensor]
    proxy: bool = False


def _dims_of(reduced_in: tuple[int, ...], out: tuple[int, ...]) -> tuple[list[int], bool]:
    """Which dims a reduction removed (or kept at size 1), from the shapes."""
    if len(out) == len(reduced_in):
        return [i for i, (a, b) in enumerate(zip(reduced_in, out, strict=True)) if a != b], True
    dims, j = [], 0
    for i, a in enumerate(reduced_in):
        if j < len(out) and out[j] == a:
            j += 1
        else:
            dims.append(i)
    return dims, False


def _conv_attrs(x_sp: tuple[int, ...], k_sp: tuple[int, ...], o_sp: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Stride and padding that map input spatial sizes to the output's (dilation 1)."""
    strides, pads = [], []
    for h, k, o in zip(x_sp, k_sp, o_sp, strict=True):
        s = max(1, math.ceil(h / o)) if o > 1 else max(1, h)
        p = 0
        while p <= k and (h + 2 * p - k) // s + 1 < o:
            p += 1
        strides.append(s)
        pads.append(p)
    return strides, pads


class _Factory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def float(self, shape: tuple[int, ...], dtype: torch.dtype, grad: bool) -> torch.Tensor:
        t = (torch.randn(shape, generator=self.gen) * 0.5).to(device=self.device, dtype=dtype)
        return t.requires_grad_(grad)

    def ints(self, shape: tuple[int, ...], high: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.randint(0, max(high, 1), shape, generator=self.gen).to(device=self.device, dtype=dtype)


class _Operands:
    """An op's operands at its local shapes on one device: its parameters, made first and in
    order, and its activations, made on demand (one that another op produces requires grad)."""

    def __init__(self, inst: OpInstance, precision: str, device: torch.device) -> None:
        op, mesh, cfg = inst.op, inst.mesh, inst.cfg
        self.op, self.device, self.fac = op, device, _Factory(device)
        self.name = short_target(op.target)
        self.in_shapes = [local_shape(t.shape, t.dims, input_placement(cfg, t), mesh) for t in op.inputs]
        self.in_dt = [TORCH_DTYPES[value_dtype(t.dtype, precision)] for t in op.inputs]
        self.out_shape = local_shape(op.output.shape, op.output.dims, output_placement(cfg, op), mesh)
        p_shapes = [local_shape(p.shape, p.dims, param_placement(cfg, p.dims), mesh) for p in op.params]
        p_dt = [TORCH_DTYPES[value_dtype(p.dtype, precision)] for p in op.params]
        self.params = [self.fac.float(s, d, True) if d.is_floating_point else self.fac.ints(s, 2, d)
                       for s, d in zip(p_shapes, p_dt, strict=True)]

    def act(self, i: int, high: int = 2) -> torch.Tensor:
        s, d = self.in_shapes[i], self.in_dt[i]
        if d.is_floating_point:
            return self.fac.float(s, d, self.op.inputs[i].source is not None)
        return self.fac.ints(s, high, d)


def build(inst: OpInstance, precision: str, device: torch.device | str = "cpu") -> Bench:
    """A torch op computing what `inst` computes on one device, at its local shapes: the op of
    its kind when its operands allow it, else its pointwise form."""
    o = _Operands(inst, precision, torch.device(device))
    kind_builder = _BUILDERS.get(inst.op.kind)
    bench = kind_builder(o) if kind_builder is not None else None
    if bench is not None:
        return bench
    return _pointwise(inst.op, o.name, [o.act(i) for i in range(len(o.in_shapes))], o.params, o.out_shape)


# Each builder checks its operands before it makes any activation, and returns None when the op
# has not the operands its kind needs (build then times it as a pointwise op).
def _linear(o: _Operands) -> Bench | None:
    if not (o.in_shapes and o.params):
        return None
    x, w = o.act(0), o.params[0]
    b = o.params[1] if len(o.params) > 1 else None
    if w.dim() == 2 and w.shape[-1] == x.shape[-1]:
        return Bench(lambda: F.linear(x, w, b), [x, *o.params])
    if w.dim() == 3 and x.dim() == 3 and w.shape[0] == x.shape[0] and w.shape[-1] == x.shape[-1]:
        # routed experts' stacked weights [E, n, k] against their buffers [E, C, k] (search/models/moe.py)
        return Bench(lambda: torch.bmm(x, w.transpose(1, 2)), [x, *o.params])
    return Bench(lambda: torch.matmul(x, w) + (b if b is not None else 0), [x, *o.params])


def _matmul(o: _Operands) -> Bench | None:
    if len(o.in_shapes) < 2:
        return None
    a, b = o.act(0), o.act(1)
    return Bench(lambda: torch.matmul(a, b), [a, b])


def _attention(o: _Operands) -> Bench | None:
    if len(o.in_shapes) < 3:
        return None
    q, k, v = o.act(0), o.act(1), o.act(2)
    causal = is_causal(o.op)
    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    return Bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa), [q, k, v])


def _embedding(o: _Operands) -> Bench | None:
    if not o.params:
        return None
    w = o.params[0]
    ids = (o.act(0, high=w.shape[0]) if o.in_shapes else
           (torch.arange(math.prod(o.out_shape[:-1]), device=o.device) % w.shape[0]).reshape(o.out_shape[:-1]))
    return Bench(lambda: F.embedding(ids, w), [w])


def _norm(o: _Operands) -> Bench | None:
    if not o.in_shapes:
        return None
    x = o.act(0)
    w = o.params[0] if o.params else None
    b = o.params[1] if len(o.params) > 1 else None
    if "batch_norm" in o.name:
        return Bench(lambda: F.batch_norm(x, None, None, w, b, training=True), [x, *o.params])
    if "group_norm" in o.name:
        groups = 32 if x.shape[1] % 32 == 0 else 1
        return Bench(lambda: F.group_norm(x, groups, w, b), [x, *o.params])
    shape = tuple(w.shape) if w is not None else tuple(x.shape[-1:])
    if "rms" in o.name:
        return Bench(lambda: F.rms_norm(x, shape, w), [x, *o.params])
    return Bench(lambda: F.layer_norm(x, shape, w, b), [x, *o.params])


def _softmax(o: _Operands) -> Bench | None:
    if not o.in_shapes:
        return None
    x = o.act(0)
    if "log" in o.name:
        return Bench(lambda: torch.log_softmax(x, -1), [x])
    return Bench(lambda: torch.softmax(x, -1), [x])


_REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {"mean": torch.mean, "amax": torch.amax, "amin": torch.amin}


def _reduce(o: _Operands) -> Bench | None:
    if not o.in_shapes:
        return None
    x = o.act(0)
    dims, keep = _dims_of(tuple(x.shape), o.out_shape)
    red = _REDUCTIONS.get(o.name, torch.sum)
    if not dims:
        return Bench(lambda: red(x), [x])
    return Bench(lambda: red(x, dim=dims, keepdim=keep), [x])


def _loss(o: _Operands) -> Bench | None:
    if not o.in_shapes:
        return None
    logits = o.act(0)
    c = logits.shape[-1] if logits.dim() > 1 else 2
    tgt = o.act(1, high=c) if len(o.in_shapes) > 1 and not o.in_dt[1].is_floating_point else o.fac.ints(
        tuple(logits.shape[:-1]), c)
    return Bench(lambda: F.cross_entropy(logits.reshape(-1, c), tgt.reshape(-1)), [logits])


_CONVS: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _conv(o: _Operands) -> Bench | None:
    if not (o.in_shapes and o.params):
        return None
    x, w = o.act(0), o.params[0]
    b = o.params[1] if len(o.params) > 1 else None
    strides, pads = _conv_attrs(tuple(x.shape[2:]), tuple(w.shape[2:]), o.out_shape[2:])
    groups = max(1, x.shape[1] // max(w.shape[1], 1))
    conv = _CONVS.get(x.dim() - 2, F.conv2d)
    return Bench(lambda: conv(x, w, b, strides, pads, 1, groups), [x, *o.params])


def _pool(o: _Operands) -> Bench | None:
    if not o.in_shapes:
        return None
    x = o.act(0)
    sp_in, sp_out = tuple(x.shape[2:]), o.out_shape[2:]
    is_max = "max" in o.name
    if "adaptive" in o.name:
        hw = (sp_out[0], sp_out[1])  # the captured adaptive pools are 2-D
        if is_max:
            return Bench(lambda: F.adaptive_max_pool2d(x, hw), [x])
        return Bench(lambda: F.adaptive_avg_pool2d(x, hw), [x])
    ks = [max(1, i // max(s, 1)) for i, s in zip(sp_in, sp_out, strict=True)]
    if x.dim() == 3:
        if is_max:
            return Bench(lambda: F.max_pool1d(x, ks, ks), [x])
        return Bench(lambda: F.avg_pool1d(x, ks, ks), [x])
    if is_max:
        return Bench(lambda: F.max_pool2d(x, ks, ks), [x])
    return Bench(lambda: F.avg_pool2d(x, ks, ks), [x])


_BUILDERS: dict[str, Callable[[_Operands], Bench | None]] = {
    "linear": _linear, "matmul": _matmul, "attention": _attention, "embedding": _embedding, "norm": _norm,
    "softmax": _softmax, "reduce": _reduce, "loss": _loss, "conv": _conv, "pool": _pool,
}


def _pointwise(op: Op, name: str, acts: list[torch.Tensor], params: list[torch.Tensor],
               out_shape: tuple[int, ...]) -> Bench:
    """An elementwise (or opaque) node: its aten op when its shapes say how to call it, else a
    stand-in that reads every operand and writes the output (the memory traffic of a pointwise op)."""
    operands = [*acts, *params]
    leaves = [t for t in operands if t.is_floating_point()]
    if name == "cat" and acts:
        d = next((i for i in range(len(out_shape)) if sum(a.shape[i] for a in acts) == out_shape[i]
                  and any(a.shape[i] != out_shape[i] for a in acts)), 0)
        return Bench(lambda: torch.cat(acts, d), leaves)
    if name in ("to", "_to_copy") and acts:
        x = acts[0]
        return Bench(lambda: x.to(torch.float32), leaves)
    if "dropout" in name and acts:
        x = acts[0]
        return Bench(lambda: F.dropout(x, 0.1, training=True), leaves)
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if packet is not None and operands:
        for args in (operands, [*operands, 0.5]):
            try:
                with torch.no_grad():
                    out = packet(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args])
            except Exception:  # noqa: BLE001 - not callable from shapes alone: use the stand-in
                continue
            out0 = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(out0, torch.Tensor) and tuple(out0.shape) == tuple(out_shape):
                def fn(args=args):
                    r = packet(*args)
                    return r[0] if isinstance(r, (tuple, list)) else r
                return Bench(fn, leaves)
    return _stand_in(operands, leaves, out_shape)


def _stand_in(operands: list[torch.Tensor], leaves: list[torch.Tensor], out_shape: tuple[int, ...]) -> Bench:
    floats = [t for t in operands if t.is_floating_point()]
    numel = max(math.prod(out_shape), 1)

    def fn():
        acc = None
        for t in floats:  # read each operand once, reduce it to the output size
            flat = t.reshape(-1)
            part = flat[:numel] if flat.numel() >= numel else flat.repeat(math.ceil(numel / max(flat.numel(), 1)))[:numel]
            acc = part * 0.5 if acc is None else acc + part
        if acc is None:
            return torch.zeros(out_shape)
        return acc.reshape(out_shape)

    return Bench(fn, leaves, proxy=True)


# ---- timing --------------------------------------------------------------------------------------
@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run with `n` intra-op threads (the worker's setting per rank), then restore."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


class _Clock:
    """Seconds of the forward and the backward of one iteration: perf_counter on CPU (ops
    there are synchronous), CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def mark(self, i: int) -> float:
        if self.cuda:
            self.ev[i].record()
            return 0.0
        return time.perf_counter()

    def elapsed(self, marks: list[float]) -> tuple[float, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return self.ev[0].elapsed_time(self.ev[1]) / 1e3, self.ev[1].elapsed_time(self.ev[2]) / 1e3
        return marks[1] - marks[0], marks[2] - marks[1]


def time_bench(bench: Bench, device: torch.device | str = "cpu", repeats: int = 10, min_repeats: int = 3,
               budget_s: float = 0.2) -> tuple[list[float], list[float]]:
    """Forward and backward seconds per repeat after warm-up. The number of repeats adapts to
    the op: as many as fit `budget_s` (from the warm-up's duration), between `min_repeats` and
    `repeats`."""
    dev = torch.device(device)
    clock = _Clock(dev)
    grad_out: list[torch.Tensor | None] = [None]

    def once() -> tuple[float, float]:
        for t in bench.leaves:
            t.grad = None
        m0 = clock.mark(0)
        out = bench.fn()
        m1 = clock.mark(1)
        if out.requires_grad:
            if grad_out[0] is None:
                grad_out[0] = torch.randn_like(out) if out.dim() else torch.ones_like(out)
            torch.autograd.backward(out, grad_out[0])
        m2 = clock.mark(2)
        return clock.elapsed([m0, m1, m2])

    t0 = time.perf_counter()
    once()  # warm-up: kernels selected, caches filled, grad buffers shaped
    first = time.perf_counter() - t0
    if first < budget_s / 4:
        t0 = time.perf_counter()
        once()
        first = time.perf_counter() - t0
    n = int(min(max(min_repeats, budget_s // max(first, 1e-9)), max(repeats, min_repeats)))
    fwd, bwd = [], []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(n):
            f, b = once()
            fwd.append(f)
            bwd.append(b)
    finally:
        if gc_was:
            gc.enable()
    return fwd, bwd


def _stat(xs: list[float]) -> Stat:
    s = sorted(xs)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return Stat(median=max(med, 0.0), lo=max(s[0], 0.0), hi=max(s[-1], 0.0))


def time_signature(inst: OpInstance, precision: str, device: torch.device | str = "cpu", repeats: int = 10,
                   budget_s: float = 0.2) -> OpEntry:
    bench = build(inst, precision, device)
    fwd, bwd = time_bench(bench, device, repeats=repeats, budget_s=budget_s)
    return OpEntry(kind=inst.op.kind, fwd=_stat(fwd), bwd=_stat(bwd), samples=len(fwd), proxy=bench.proxy)


@dataclass
class OpsResult:
    entries: dict[str, OpEntry]  # the newly timed signatures
    total: int                   # distinct signatures asked for
    timed: int
    reused: int                  # already in the base profile
    failed: dict[str, str]       # signature -> why it could not be timed (left to the roofline)
    seconds: float


def profile_ops(sigs: SignatureSet, precision: str, base: dict[str, OpEntry] | None = None,
                device: torch.device | str = "cpu", repeats: int = 10, threads: int | None = None,
                budget_s: float = 0.2, progress: bool = True) -> OpsResult:
    """Time every signature of `sigs` that `base` does not already hold."""
    base = base or {}
    todo = [inst for sig, inst in sigs.items.items() if sig not in base]
    entries: dict[str, OpEntry] = {}
    failed: dict[str, str] = {}
    start = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="op signatures", unit="sig", leave=False)
    with torch_threads(threads):
        for inst in todo:
            try:
                entries[inst.signature] = time_signature(inst, precision, device, repeats, budget_s)
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                failed[inst.signature] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return OpsResult(entries=entries, total=len(sigs.items), timed=len(entries), reused=len(sigs.items) - len(todo),
                     failed=failed, seconds=time.perf_counter() - start)


# ---- the optimizer step --------------------------------------------------------------------------
def time_optimizer(precision: str, device: torch.device | str = "cpu", sizes: tuple[int, ...] = (1 << 14, 1 << 18, 1 << 21),
                   repeats: int = 5, threads: int | None = None) -> LinearFit:
    """One AdamW step over n parameter elements in one tensor (fp32 master weights; under
    bf16/fp16 also the copy back to the low-precision weights), fitted over n; foreach=False, as
    the executor steps. The cost per tensor is profiler.overheads'."""
    from profiler.fit import linear_fit

    dev = torch.device(device)
    low = TORCH_DTYPES[precision]
    times = []
    with torch_threads(threads):
        for n in sizes:
            p = torch.zeros(n, device=dev, requires_grad=True)
            p.grad = torch.randn(n, device=dev) * 1e-3
            model = torch.zeros(n, device=dev, dtype=low) if low != torch.float32 else None
            opt = torch.optim.AdamW([p], lr=1e-3, foreach=False)  # as worker.parallelize builds it
            samples = []
            for i in range(repeats + 1):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                opt.step()
                if model is not None:
                    model.copy_(p.detach())
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if i:
                    samples.append(time.perf_counter() - t0)
            times.append(sorted(samples)[len(samples) // 2])
    return linear_fit(list(sizes), times)
