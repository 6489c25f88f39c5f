"""Capture an OpGraph from a real torch.nn.Module with torch.export on the meta device.

Nothing is allocated: the module is built under ``torch.device("meta")`` and exported with meta
example inputs, so a 175B-parameter model is captured in about a second. Layout-only aten ops
(view, reshape, transpose, permute, expand, split, slice, ...) become no ops at all: they are
folded into the edges, carrying dimension labels through (graph.py explains labels). Every other
aten op that touches an activation or a parameter becomes one IR op with its FLOPs.

Repeated blocks: when a model names its stack of identical layers (``blocks_attr``), only the
first two layers are exported; the second is checked to be a faithful copy of the first (same
ops, shapes and wiring, one input from the previous layer) and is then replicated for the rest.
That keeps capture time independent of depth and tells the search which layers to solve once.
A periodic stack (Jamba's Mamba and attention layers, repeating every 8) is exported as two
periods, the second checked against the first and replicated period by period.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from pydantic import ValidationError

from search.errors import InputError, invalid
from search.models.graph import BlockInfo, Op, OpGraph, ParamRef, SaveKind, TensorRef, label_size, own_modules
from search.models.moe import EXPERT_LABEL, LOAD_ASSUMPTION, balanced_experts, unflattened_dense_experts
from search.models.scan import (
    captured_kind,
    chunk_scan_flops,
    chunk_scan_workspace,
    gated_delta_flops,
    gated_delta_workspace,
    lightning_flops,
    lightning_workspace,
    scans_as_ops,
    selective_scan_flops,
    selective_scan_workspace,
)
from search.models.seq2seq import annotate_stacks

if TYPE_CHECKING:
    from search.models.zoo import ModelSpec

aten = torch.ops.aten


# ---- dimension labels: a union-find whose roots keep the oldest (most readable) name ---------
class _Labels:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.names: list[str] = []
        # (root of a reshape's merged label, its size) -> the (size, label) of the dims it merged
        self.merged: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}

    def new(self, name: str) -> int:
        self.parent.append(len(self.parent))
        self.names.append(name)
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            lo, hi = min(ra, rb), max(ra, rb)  # the older label names the merged one
            self.parent[hi] = lo
        return self.find(a)

    def name(self, a: int) -> str:
        return self.names[self.find(a)]


@dataclass
class _Act:
    """An activation: the IR op that made it (None for a graph input) and its current view."""

    source: str | None
    shape: tuple[int, ...]
    labels: list[int]
    dtype: str


@dataclass
class _Param:
    """A parameter as an op reads it (`shape`/`labels` of the view, e.g. after .t() or .expand())
    and as it is stored (`stored_shape`/`stored_labels`), which is what memory is priced on."""

    name: str
    shape: tuple[int, ...]
    labels: list[int]
    dtype: str
    stored_shape: tuple[int, ...] = ()
    stored_labels: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.stored_shape and not self.stored_labels:
            self.stored_shape, self.stored_labels = self.shape, self.labels

    def viewed(self, shape: tuple[int, ...], labels: list[int]) -> _Param:
        return _Param(self.name, shape, labels, self.dtype, self.stored_shape, self.stored_labels)


@dataclass
class _Const:
    shape: tuple[int, ...]


@dataclass
class _Sub:
    """A get_attr node: the name of a subgraph module (or constant) on the exported program."""

    name: str


@dataclass
class _Multi:
    items: list[object]


# What an op builder returns for a node: one tensor, or a tuple of them that getitem unpacks.
_Result = _Act | _Param | _Const | _Multi


@dataclass(frozen=True)
class _RawTensor:
    """A tensor as an emitted op records it: dims are label ids, which later unions may still
    merge, so they are named only when the graph is finished. `source` is the producing op of an
    input (None for a graph input or an output) or the name of a parameter."""

    source: str | None
    shape: tuple[int, ...]
    labels: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class _RawOp:
    name: str
    kind: str
    target: str
    module: str
    inputs: tuple[_RawTensor, ...]
    output: _RawTensor
    params: tuple[_RawTensor, ...]
    splittable: tuple[int, ...]
    flops: float
    saves: SaveKind
    workspace: float = 0.0


@dataclass
class _Builder:
    labels: _Labels = field(default_factory=_Labels)
    ops: list[_RawOp] = field(default_factory=list)
    names: dict[str, int] = field(default_factory=dict)

    def op_name(self, module: str, short: str) -> str:
        base = f"{module}:{short}" if module else short
        k = self.names.get(base, 0)
        self.names[base] = k + 1
        return base if k == 0 else f"{base}#{k}"


_VIEW_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
    aten.unflatten.int, aten.permute.default, aten.transpose.int, aten.t.default,
    aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.contiguous.default, aten.clone.default, aten.alias.default,
    aten.detach.default, aten.slice.Tensor, aten.select.int, aten.lift_fresh_copy.default,
    aten.repeat_interleave.self_int, aten.expand_as.default, aten.view_as.default,
    aten.view_as_complex.default, aten.view_as_real.default,  # pairs of floats as complex numbers, and back
    aten.numpy_T.default,  # `x @ self.weight.T` (Falcon's linear): the weight, transposed, is still the parameter
}
# casts: one that changes nothing (`x.to(torch.float32)` of an fp32 tensor, RMSNorm's upcast in an
# fp32 run) returns its input itself, so export hands the next readers of that tensor (the residual
# add after the norm) the cast's node: captured as an op, it would put them inside the norm's module
_CAST_OPS = {aten.to.dtype, aten._to_copy.default, aten.to.dtype_layout}
_SPLIT_OPS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int}
_LINEAR_OPS = {aten.linear.default, aten.addmm.default, aten.mm.default, aten.matmul.default, aten.bmm.default}
_NORM_OPS = {aten.layer_norm.default, aten.native_layer_norm.default, aten.rms_norm.default,
             aten.group_norm.default}
_BATCHNORM_OPS = {aten.batch_norm.default, aten._native_batch_norm_legit_functional.default,
                  aten._native_batch_norm_legit_no_training.default, aten._native_batch_norm_legit.default,
                  aten.native_batch_norm.default, aten.cudnn_batch_norm.default}
_CONV_OPS = {aten.convolution.default, aten.conv2d.default, aten.conv1d.default}
_POOL_OPS = {aten.max_pool2d.default, aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
             aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default}
_SOFTMAX_OPS = {aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten.log_softmax.int}
_REDUCE_OPS = {aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.mean.default, aten.sum.default}
_LOSS_OPS = {aten.cross_entropy_loss.default, aten.nll_loss.default, aten.nll_loss_forward.default,
             aten.mse_loss.default}
_ATTENTION_OPS = {aten.scaled_dot_product_attention.default}
_COMPUTE_KINDS = {"linear", "matmul", "attention", "embedding", "conv", "pool"}
# The modules torch's parallel styles shard, by the op kind they run (ColwiseParallel and
# RowwiseParallel for Linear and Embedding, SequenceParallel for norms): the executor
# (worker/analyze.py) splits an op's parameters on a tensor axis only through one of these.
STYLE_MODULES: dict[str, tuple[type[nn.Module], ...]] = {
    "linear": (nn.Linear,), "embedding": (nn.Embedding,), "norm": (nn.LayerNorm, nn.RMSNorm)}
_SAVES_OUTPUT = {"exp", "rsqrt", "sigmoid", "tanh", "sqrt", "reciprocal"}
_SAVES_NOTHING = {"add", "sub", "neg", "_to_copy", "to", "where", "masked_fill", "clamp", "fill"}
_DROPOUT = {"dropout", "native_dropout", "feature_dropout"}


def _short(target: object) -> str:
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


# a complex tensor (Llama-4's and DeepSeek-V2's rotary embeddings multiply in complex64) is priced
# as the real dtype of its size: complex64 holds 8 bytes per element, as float64 does
_COMPLEX_AS = {torch.complex64: "float64", torch.complex32: "float32"}


def _dtype(t: torch.Tensor) -> str:
    return _COMPLEX_AS.get(t.dtype) or str(t.dtype).removeprefix("torch.")


def _first_tensor(val: object) -> torch.Tensor:
    """The tensor an op's fake value holds (the first of a tuple-returning op's outputs)."""
    out0 = val[0] if isinstance(val, (tuple, list)) else val
    assert isinstance(out0, torch.Tensor), f"expected a tensor value, got {type(out0).__name__}"
    return out0


def _changes_nothing(node: torch.fx.Node, out_val: object) -> bool:
    """A cast whose output has its input's dtype, device and shape: the input itself."""
    src = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None
    return (isinstance(src, torch.Tensor) and isinstance(out_val, torch.Tensor) and src.dtype == out_val.dtype
            and src.device == out_val.device and tuple(src.shape) == tuple(out_val.shape))


def _int_arg(node: torch.fx.Node, i: int, default: int | None = None) -> int:
    """Positional argument `i` of an aten call that its schema types as int (a dim, a group
    count); `default` when the call leaves it out. A static export always gives a Python int."""
    if len(node.args) <= i and default is not None:
        return default
    a = node.args[i]
    assert isinstance(a, int), f"{node.name}: argument {i} is {type(a).__name__}, not int"
    return a


# ops whose output at a position along one dimension reads other positions along it (a running
# sum, a lookup at indices, an order): that dimension cannot split, each shard would compute on
# its own positions alone (RoBERTa's position ids are a cumsum over the sequence), by the
# position of the dim argument (an int, or int[] for flip), and the default where it has one
_ALONG_DIM = {aten.cumsum.default: (1, None), aten.cumprod.default: (1, None), aten.logcumsumexp.default: (1, None),
              aten.cummax.default: (1, None), aten.cummin.default: (1, None), aten.gather.default: (1, None),
              aten.index_select.default: (1, None), aten.sort.default: (1, -1), aten.argsort.default: (1, -1),
              aten.topk.default: (2, -1), aten.flip.default: (1, None)}


def _along_dims(node: torch.fx.Node, rank: int) -> set[int]:
    """The dimensions an op reads along (_ALONG_DIM), counted from 0."""
    if node.target not in _ALONG_DIM or not rank:
        return set()
    i, default = _ALONG_DIM[node.target]
    a = node.args[i] if len(node.args) > i else node.kwargs.get("dims" if node.target is aten.flip.default else "dim",
                                                                  default)
    dims = a if isinstance(a, (list, tuple)) else [a]
    return {d % rank for d in dims if isinstance(d, int)}


def _ints_arg(node: torch.fx.Node, i: int) -> list[int]:
    """Positional argument `i` of an aten call that its schema types as int[] (permute's dims)."""
    a = node.args[i]
    assert isinstance(a, (list, tuple)), f"{node.name}: argument {i} is {type(a).__name__}, not int[]"
    out: list[int] = []
    for x in a:
        assert isinstance(x, int), f"{node.name}: argument {i} holds {type(x).__name__}, not int"
        out.append(x)
    return out


def _has_symbolic_shape(val: object) -> bool:
    """True if a fake value's shape holds a size that depends on the data (a SymInt)."""
    if isinstance(val, torch.Tensor):
        return not all(isinstance(d, int) for d in val.shape)
    if isinstance(val, (list, tuple)):
        return any(_has_symbolic_shape(v) for v in val)
    return False


def _describe(value: object) -> str:
    if isinstance(value, _Param):
        return f"the parameter {value.name}"
    if isinstance(value, _Act):
        return "an activation"
    if isinstance(value, _Const):
        return "a buffer or constant"
    return f"a {type(value).__name__}"


def _view_labels(L: _Labels, in_shape: Sequence[int], in_labels: list[int], out_shape: Sequence[int], tag: str) -> list[int]:
    """Labels of a reshape's output: within each group of dims whose products match, the
    outermost non-unit output dim keeps the outermost non-unit input dim's label (sharding
    the outer dim of a contiguous block is the same data either way); the rest are new."""
    out: list[int] = [-1] * len(out_shape)
    i = j = 0
    n_in, n_out = len(in_shape), len(out_shape)
    while i < n_in or j < n_out:
        gi: list[int] = []
        gj: list[int] = []
        pi = pj = 1
        if i < n_in:
            gi.append(i)
            pi *= in_shape[i]
            i += 1
        if j < n_out:
            gj.append(j)
            pj *= out_shape[j]
            j += 1
        while pi != pj:
            if pi < pj and i < n_in:
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            elif j < n_out:
                gj.append(j)
                pj *= out_shape[j]
                j += 1
            else:
                break
        # absorb trailing unit dims into this group
        outer_in = next((d for d in gi if in_shape[d] != 1), None)
        parts_in = [(in_shape[d], in_labels[d]) for d in gi if in_shape[d] != 1]
        parts_out = [d for d in gj if out_shape[d] != 1]
        if len(parts_in) == 1 and len(parts_out) > 1:
            # unflattening dims an earlier reshape flattened ([b*s, n] back to [b, s, n], as OPT's
            # MLP and GPT-2's Conv1D do): they get their labels back, so every layer of a stack
            # is labelled as the first (whose `seq` would otherwise be a fresh label in the next)
            size, lab = parts_in[0]
            was = L.merged.get((L.find(lab), size))
            if was is not None and [sz for sz, _ in was] == [out_shape[d] for d in parts_out]:
                restored = {d: old for d, (_, old) in zip(parts_out, was, strict=True)}
                for d in gj:
                    out[d] = restored[d] if d in restored else L.new(f"{tag}/v{d}")
                continue
        first = True
        for d in gj:
            if out_shape[d] != 1 and first and outer_in is not None:
                out[d] = in_labels[outer_in]
                first = False
            else:
                out[d] = L.new(f"{tag}/v{d}")
        if len(parts_in) > 1 and len(parts_out) == 1:
            L.merged[(L.find(out[parts_out[0]]), out_shape[parts_out[0]])] = tuple(parts_in)
    return out


class _Capture:
    def __init__(self, ep: torch.export.ExportedProgram, user_labels: list[list[str]], name: str) -> None:
        self.ep = ep
        self.b = _Builder()
        self.env: dict[str, object] = {}
        # casts to the dtype their input has, with that input's value and the cast's module
        self.noop_casts: dict[torch.fx.Node, tuple[object, str]] = {}
        self.user_labels = user_labels
        self.global_labels: dict[str, int] = {}
        self.name = name

    # -- helpers --------------------------------------------------------------------------
    def glabel(self, name: str) -> int:
        if name not in self.global_labels:
            self.global_labels[name] = self.b.labels.new(name)
        return self.global_labels[name]

    def val(self, a: object) -> object:
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return [self.val(x) for x in a]
        return a

    def module_of(self, node: torch.fx.Node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return ""
        path = list(stack.values())[-1][0]
        return str(path)

    # -- what the translation does not support in a user's model: an InputError, said where ---
    def unsupported(self, node: torch.fx.Node, why: str) -> InputError:
        module = self.module_of(node)
        where = f"module {module}" if module else "the top-level module"
        return InputError(f"cannot capture {self.name}: unsupported graph pattern: {_short(node.target)} in {where}: {why}")

    def activation(self, node: torch.fx.Node, value: object, role: str) -> _Act:
        if not isinstance(value, _Act):
            raise self.unsupported(node, f"its {role} is {_describe(value)}, not an activation")
        return value

    def parameter(self, node: torch.fx.Node, value: object, role: str) -> _Param:
        if not isinstance(value, _Param):
            raise self.unsupported(node, f"its {role} is {_describe(value)}, not a parameter")
        return value

    def operand(self, node: torch.fx.Node, value: object, role: str) -> _Act | _Param:
        if not isinstance(value, (_Act, _Param)):
            raise self.unsupported(node, f"its {role} is {_describe(value)}, not a parameter or an activation")
        return value

    def first_act(self, node: torch.fx.Node, acts: list[_Act]) -> _Act:
        if not acts:
            raise self.unsupported(node, "it reads parameters only, no activation")
        return acts[0]

    # -- the walk -------------------------------------------------------------------------
    def run(self) -> None:
        sig = self.ep.graph_signature
        params = dict(sig.inputs_to_parameters)
        user_inputs = list(sig.user_inputs)
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                v = node.meta.get("val")
                if node.name in params:
                    fqn = params[node.name]
                    shape = tuple(v.shape)
                    labels = [self.b.labels.new(f"{fqn}/d{d}") for d in range(len(shape))]
                    self.env[node.name] = _Param(fqn, shape, labels, _dtype(v))
                elif node.name in user_inputs:
                    k = user_inputs.index(node.name)
                    names = self.user_labels[k] if k < len(self.user_labels) else []
                    labels = [self.glabel(names[d]) if d < len(names) else self.b.labels.new(f"{node.name}/d{d}")
                              for d in range(v.dim())]
                    self.env[node.name] = _Act(None, tuple(v.shape), labels, _dtype(v))
                else:  # buffers and constants: no gradient, no sharding decision
                    self.env[node.name] = _Const(tuple(getattr(v, "shape", ())))
            elif node.op == "call_function":
                self.env[node.name] = self.call(node)
            elif node.op == "get_attr":  # a subgraph of a higher-order op, or a constant
                self.env[node.name] = _Sub(str(node.target))

    def inline(self, node: torch.fx.Node, args: list[object]) -> object:
        """A higher-order op (wrap_with_set_grad_enabled, wrap_with_autocast, ...) runs a
        subgraph on the arguments after it: walk that subgraph in place."""
        k = next(i for i, a in enumerate(args) if isinstance(a, _Sub))
        ref = args[k]
        assert isinstance(ref, _Sub)
        sub = getattr(self.ep.graph_module, ref.name)
        inputs = iter(args[k + 1:])
        outer, self.env = self.env, {}
        try:
            result: object = _Const(())
            for n in sub.graph.nodes:
                if n.op == "placeholder":
                    self.env[n.name] = next(inputs, _Const(()))
                elif n.op == "call_function":
                    self.env[n.name] = self.call(n)
                elif n.op == "get_attr":
                    self.env[n.name] = _Sub(str(n.target))
                elif n.op == "output":
                    outs = n.args[0]
                    result = _Multi([self.val(o) for o in outs]) if isinstance(outs, (list, tuple)) else self.val(outs)
            return result
        finally:
            self.env = outer

    def arg(self, a: object, reader: str) -> object:
        """The value an op in module `reader` reads for argument `a`. `x.to(torch.float32)` of an
        fp32 tensor returns x itself in eager mode, and export hands every later reader of x the
        cast's node: a reader outside the cast's module (the residual add after an RMSNorm's
        upcast, Falcon-H1) reads x itself, as it does when the model runs; readers inside it, and
        the cast op, stay (under bf16 autocast the same cast of a bf16 tensor is real)."""
        if isinstance(a, torch.fx.Node) and a in self.noop_casts:
            src, module = self.noop_casts[a]
            if module and reader != module and not reader.startswith(module + "."):
                return src
        if isinstance(a, (list, tuple)):
            return [self.arg(x, reader) for x in a]
        return self.val(a)

    def call(self, node: torch.fx.Node) -> object:
        reader = self.module_of(node)
        args = [self.arg(a, reader) for a in node.args]
        out_val = node.meta.get("val")
        if node.target is _getitem:
            container, idx = args[0], node.args[1]
            if isinstance(container, _Multi):
                assert isinstance(idx, int)
                return container.items[idx]
            return _Const(())
        if any(isinstance(a, _Sub) for a in args):
            return self.inline(node, args)
        acts = [a for a in _flat(args) if isinstance(a, _Act)]
        prms = [a for a in _flat(args) if isinstance(a, _Param)]
        if not acts and not prms:
            return _Const(tuple(out_val.shape) if isinstance(out_val, torch.Tensor) else ())
        if _has_symbolic_shape(out_val):
            raise self.unsupported(node, "its output's shape depends on the data (boolean-mask indexing, "
                                         "nonzero, ...); the search needs static shapes")
        result = self.dispatch(node, args, acts, prms, out_val)
        if node.target in _CAST_OPS and _changes_nothing(node, out_val) and isinstance(node.args[0], torch.fx.Node):
            self.noop_casts[node] = (args[0], reader)
        return result

    def dispatch(self, node: torch.fx.Node, args: list[object], acts: list[_Act], prms: list[_Param],
                 out_val: object) -> _Result:
        """The op builder for an aten op that reads an activation or a parameter."""
        t = node.target
        if t in _VIEW_OPS:
            return self.view(node, args[0], _first_tensor(out_val))
        if t in _SPLIT_OPS:
            return self.split(node, args[0], out_val)
        if t in _LINEAR_OPS:
            return self.matmul(node, args)
        if t in _ATTENTION_OPS:
            return self.attention(node, args)
        if t is aten.embedding.default:
            return self.embedding(node, args)
        if t in _NORM_OPS:
            return self.norm(node, args, self.first_act(node, acts), prms)
        if t in _BATCHNORM_OPS:
            return self.batchnorm(node, self.first_act(node, acts), prms)
        if t in _CONV_OPS:
            return self.conv(node, args)
        if t in _POOL_OPS:
            return self.pool(node, self.first_act(node, acts), out_val)
        if t in _SOFTMAX_OPS:
            return self.softmax(node, self.first_act(node, acts), _first_tensor(out_val))
        if t in _REDUCE_OPS:
            return self.reduce(node, self.first_act(node, acts), args, _first_tensor(out_val))
        if t in _LOSS_OPS:
            return self.loss(node, self.first_act(node, acts), acts[1:], _first_tensor(out_val))
        if t is aten.cat.default:
            return self.cat(node, args, _first_tensor(out_val))
        if t is aten.stack.default:
            return self.stack(node, args, _first_tensor(out_val))
        if t is torch.ops.paretoplan.moe_dispatch.default:
            return self.moe_dispatch(node, args, _first_tensor(out_val))
        if t is torch.ops.paretoplan.moe_combine.default:
            return self.moe_combine(node, args, _first_tensor(out_val))
        if t in _SCAN_TARGETS:
            return self.scan(node, args, _first_tensor(out_val))
        return self.elementwise(node, acts, prms, out_val)

    # -- op builders ----------------------------------------------------------------------
    def emit(self, node: torch.fx.Node, kind: str, inputs: list[_Act], out_shape: tuple[int, ...],
             out_labels: list[int], out_dtype: str, params: list[_Param], splittable: list[int],
             flops: float, saves: SaveKind, workspace: float = 0.0) -> _Act:
        name = self.b.op_name(self.module_of(node), _short(node.target))
        seen_split: list[int] = []
        for s in splittable:
            r = self.b.labels.find(s)
            if r not in seen_split:
                seen_split.append(r)
        self.b.ops.append(_RawOp(
            name=name, kind=kind, target=str(node.target), module=self.module_of(node),
            inputs=tuple(_RawTensor(a.source, a.shape, tuple(a.labels), a.dtype) for a in inputs),
            output=_RawTensor(None, out_shape, tuple(out_labels), out_dtype),
            params=tuple(_RawTensor(p.name, p.stored_shape, tuple(p.stored_labels), p.dtype) for p in params),
            splittable=tuple(seen_split), flops=float(flops), saves=saves, workspace=float(workspace),
        ))
        return _Act(name, out_shape, out_labels, out_dtype)

    def view(self, node: torch.fx.Node, src: object, out_val: torch.Tensor) -> _Result:
        L = self.b.labels
        out_shape = tuple(out_val.shape)
        if isinstance(src, _Const):
            return _Const(out_shape)
        assert isinstance(src, (_Act, _Param))  # a view op's first argument is a tensor
        t = node.target
        tag = f"{node.name}"
        rank = len(src.shape)
        if t in (aten.permute.default,):
            perm = [d % rank for d in _ints_arg(node, 1)]
            labels = [src.labels[d] for d in perm]
        elif t is aten.transpose.int:
            d0, d1 = _int_arg(node, 1) % rank, _int_arg(node, 2) % rank
            labels = list(src.labels)
            labels[d0], labels[d1] = labels[d1], labels[d0]
        elif t in (aten.t.default, aten.numpy_T.default):
            labels = list(reversed(src.labels))
        elif t in (aten.slice.Tensor,):
            labels = list(src.labels)
            d = _int_arg(node, 1, 0) % rank
            if out_shape[d] != src.shape[d]:
                labels[d] = L.new(f"{tag}/slice")
        elif t is aten.select.int:
            d = _int_arg(node, 1) % rank
            labels = [lab for k, lab in enumerate(src.labels) if k != d]
        elif t in (aten.expand.default, aten.expand_as.default):
            pad = len(out_shape) - rank
            labels = [L.new(f"{tag}/x{k}") for k in range(pad)]
            for k, lab in enumerate(src.labels):
                same = src.shape[k] == out_shape[pad + k]
                labels.append(lab if same else L.new(f"{tag}/x{pad + k}"))
        elif t is aten.view_as_complex.default:  # (..., n, 2) floats as (..., n) complex numbers
            labels = [*src.labels[:-2], L.new(f"{tag}/c")]
        elif t is aten.view_as_real.default:  # and back, as new dimensions: n complex numbers are not
            labels = [*src.labels[:-1], L.new(f"{tag}/r"), L.new(f"{tag}/p")]  # the n floats they came from
        elif t is aten.repeat_interleave.self_int:
            # repeats within each shard of the outer dim keep it sharded: GQA's key/value heads
            # repeated to the query heads stay split over the tensor axis as Megatron splits them
            labels = list(src.labels)
            last = len(out_shape) - 1
            if 0 <= last < rank and out_shape[last] != src.shape[last]:
                # repeated along the last dimension (an interleaved rotary table): its pairs are
                # another dimension of another size, which must not carry the input's label
                labels[last] = L.new(f"{tag}/r{last}")
        elif t in (aten.contiguous.default, aten.clone.default, aten.alias.default, aten.detach.default,
                   aten.lift_fresh_copy.default):
            labels = list(src.labels)
        else:
            labels = _view_labels(L, src.shape, src.labels, out_shape, tag)
        if isinstance(src, _Param):
            return src.viewed(out_shape, labels)
        return _Act(src.source, out_shape, labels, src.dtype)

    def split(self, node: torch.fx.Node, src: object, out_val: object) -> _Multi:
        assert isinstance(out_val, (list, tuple))  # a split op returns a list of tensors
        outs = [_first_tensor(o) for o in out_val]
        if isinstance(src, _Const):
            return _Multi([_Const(tuple(o.shape)) for o in outs])
        assert isinstance(src, (_Act, _Param))  # a split op's first argument is a tensor

        def part(shape: tuple[int, ...], labels: list[int]) -> _Act | _Param:
            if isinstance(src, _Act):
                return _Act(src.source, shape, labels, src.dtype)
            return src.viewed(shape, labels)

        items: list[object] = []
        if node.target is aten.unbind.int:
            d = _int_arg(node, 1, 0) % len(src.shape)
            for o in outs:
                items.append(part(tuple(o.shape), [lab for k, lab in enumerate(src.labels) if k != d]))
            return _Multi(items)
        d = _int_arg(node, 2, 0) % len(src.shape)
        for k, o in enumerate(outs):
            labels = list(src.labels)
            labels[d] = self.b.labels.new(f"{node.name}/part{k}")
            items.append(part(tuple(o.shape), labels))
        return _Multi(items)

    def matmul(self, node: torch.fx.Node, args: list[object]) -> _Result:
        L = self.b.labels
        a, w, bias, b_shape, b_labels = self.matmul_operands(node, args)
        out_val = _first_tensor(node.meta["val"])
        if not isinstance(a, _Act):
            if isinstance(w, _Act):  # param @ activation (Mamba's dt_proj.weight @ dt): opaque, its GEMM's FLOPs
                res = self.elementwise(node, [w], [p for p in (a,) if isinstance(p, _Param)], out_val)
                if isinstance(a, _Param) and self.b.ops and self.b.ops[-1].inputs:
                    self.b.ops[-1] = replace(self.b.ops[-1], flops=2.0 * math.prod(out_val.shape) * a.shape[-1])
                return res
            return _Const(tuple(out_val.shape))
        k_label = L.union(a.labels[-1], b_labels[-2] if len(b_shape) >= 2 else b_labels[-1])
        n_label = b_labels[-1] if len(b_shape) >= 2 else None
        out_shape = tuple(out_val.shape)
        lead = list(a.labels[:-1])
        # broadcast batch dims of a batched matmul between activations
        if isinstance(w, _Act) and len(b_shape) > 2:
            nb = len(b_shape) - 2
            for k in range(nb):
                ai = len(a.shape) - 2 - nb + k
                if ai >= 0 and a.shape[ai] == b_shape[k]:
                    L.union(a.labels[ai], b_labels[k])
        out_labels = lead + ([n_label] if n_label is not None else [])
        out_labels = out_labels[-len(out_shape):] if out_shape else []
        flops = 2.0 * math.prod(out_shape) * a.shape[-1]
        params: list[_Param] = []
        inputs = [a]
        if isinstance(w, _Param):
            params.append(w)
        else:
            inputs.append(w)
        if isinstance(bias, _Param):
            if n_label is not None and bias.shape and bias.shape[-1] == out_shape[-1]:
                L.union(bias.labels[-1], n_label)  # labels are shared ids: the stored dims follow
            params.append(bias)
        kind = "linear" if isinstance(w, _Param) else "matmul"
        # splittable: the outermost (batch) dim, the output features (column) and the reduction (row)
        split = [a.labels[0]] if len(a.shape) >= 2 else []
        if kind == "matmul" and len(a.shape) >= 3:
            split += [a.labels[1]]  # heads of a batched attention matmul
        if kind == "linear" and len(b_shape) == 3 and len(a.shape) == 3 and a.shape[0] == b_shape[0]:
            # routed experts' GEMM (search/models/moe.py): buffers [E, C, k] against stacked
            # weights [E, k, n]; the expert dim is one dimension of both, and the tokens are the batch
            L.union(a.labels[0], b_labels[0])
            split += [a.labels[1]]
        if n_label is not None:
            split.append(n_label)
        split.append(k_label)
        return self.emit(node, kind, inputs, out_shape, out_labels, _dtype(out_val), params, split, flops,
                         "inputs")

    def matmul_operands(self, node: torch.fx.Node, args: list[object]
                        ) -> tuple[object, _Act | _Param, object, tuple[int, ...], list[int]]:
        """(left operand, right operand, bias, the right operand's shape and labels as the product
        reads it): linear(x, W) = x @ W^T, addmm(bias, x, W) = bias + x @ W."""
        t = node.target
        if t is aten.linear.default:
            a, w = args[0], self.operand(node, args[1], "weight")
            bias = args[2] if len(args) > 2 else None
            return a, w, bias, tuple(reversed(w.shape)), list(reversed(w.labels))
        if t is aten.addmm.default:
            bias, a, w = args[0], args[1], self.operand(node, args[2], "right operand")
            return a, w, bias, w.shape, list(w.labels)
        a, w = args[0], self.operand(node, args[1], "right operand")
        return a, w, None, w.shape, list(w.labels)

    def attention(self, node: torch.fx.Node, args: list[object]) -> _Act:
        L = self.b.labels
        q = self.activation(node, args[0], "query")
        k = self.activation(node, args[1], "key")
        v = self.activation(node, args[2], "value")
        out_val = _first_tensor(node.meta["val"])
        L.union(q.labels[0], k.labels[0])
        L.union(q.labels[0], v.labels[0])
        if q.shape[1] == k.shape[1]:
            L.union(q.labels[1], k.labels[1])
        if k.shape[1] == v.shape[1]:
            L.union(k.labels[1], v.labels[1])
        L.union(q.labels[-1], k.labels[-1])
        L.union(k.labels[-2], v.labels[-2])
        is_causal = bool(node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False))
        b, h, s, d = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
        sk, dv = k.shape[-2], v.shape[-1]
        flops = 2.0 * b * h * s * sk * (d + dv) * (0.5 if is_causal else 1.0)
        out_labels = list(q.labels[:-1]) + [v.labels[-1]]
        inputs = [q, k, v]
        # a mask with a value per head (T5's position bias, added to each head's scores) is read with
        # the heads: split where they are split, and gathered whole where the attention replicates
        # them (the edge that prices it). A mask broadcast over the heads has nothing the heads split.
        raw = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        mask = self.arg(raw, self.module_of(node)) if isinstance(raw, torch.fx.Node) else None
        if isinstance(mask, _Act) and len(mask.shape) == len(q.shape) == 4 and mask.shape[1] == h > 1:
            L.union(q.labels[1], mask.labels[1])
            if mask.shape[0] == b:
                # made per sample (T5's bias plus the padding mask, broadcast over the batch): split
                # with the batch, as each data rank makes its own samples' mask
                L.union(q.labels[0], mask.labels[0])
            inputs.append(mask)
        return self.emit(node, "attention", inputs, tuple(out_val.shape), out_labels, _dtype(out_val), [],
                         [q.labels[0], q.labels[1]], flops, "attention")

    def embedding(self, node: torch.fx.Node, args: list[object]) -> _Act:
        w, ids = self.parameter(node, args[0], "weight table"), args[1]
        out_val = _first_tensor(node.meta["val"])
        if isinstance(ids, _Act):
            out_labels = list(ids.labels) + [w.labels[1]]
            inputs = [ids]
            split = [ids.labels[0], w.labels[1], w.labels[0]]
        else:  # positions from arange (or a buffer of token types): a lookup of constant rows
            out_labels = [self.b.labels.new(f"{node.name}/d{d}") for d in range(out_val.dim() - 1)] + [w.labels[1]]
            inputs = []
            split = [w.labels[1]]
            if out_val.dim() >= 3 and out_val.shape[0] > 1:
                # ids broadcast over the batch (OPT's positions, BERT's token types, BART's learned
                # positions expanded over the batch first): the leading
                # dimension joins the batch later, so it splits as the batch does (every rank has
                # the ids at hand); it must not stop data parallelism
                split.insert(0, out_labels[0])
        return self.emit(node, "embedding", inputs, tuple(out_val.shape), out_labels, _dtype(out_val), [w],
                         split, 0.0, "none")

    def norm(self, node: torch.fx.Node, args: list[object], x: _Act, prms: list[_Param]) -> _Result:
        L = self.b.labels
        out_val = _first_tensor(node.meta["val"])
        t = node.target
        if t is aten.group_norm.default:
            nd = len(x.shape) - 1
        else:
            nd = len(args[1]) if isinstance(args[1], (list, tuple)) else 1
        for p in prms:
            for k in range(len(p.shape)):
                L.union(p.labels[-1 - k], x.labels[-1 - k])
        split = x.labels[: len(x.shape) - nd]
        res = self.emit(node, "norm", [x], tuple(out_val.shape), list(x.labels), _dtype(out_val), prms, split,
                        8.0 * math.prod(x.shape), "inputs")
        if t is aten.native_layer_norm.default:
            return _Multi([res, _Const(()), _Const(())])
        return res

    def batchnorm(self, node: torch.fx.Node, x: _Act, prms: list[_Param]) -> _Result:
        L = self.b.labels
        out_val = node.meta["val"]
        out0 = _first_tensor(out_val)
        for p in prms:
            L.union(p.labels[0], x.labels[1])
        res = self.emit(node, "norm", [x], tuple(out0.shape), list(x.labels), _dtype(out0), prms,
                        [x.labels[0], x.labels[1]], 8.0 * math.prod(x.shape), "inputs")
        if isinstance(out_val, (tuple, list)):
            return _Multi([res] + [_Const(()) for _ in out_val[1:]])
        return res

    def conv(self, node: torch.fx.Node, args: list[object]) -> _Act:
        L = self.b.labels
        x = self.activation(node, args[0], "input")
        w = self.parameter(node, args[1], "weight")
        bias = args[2] if len(args) > 2 else None
        out_val = _first_tensor(node.meta["val"])
        groups = _int_arg(node, 8 if node.target is aten.convolution.default else 6, 1)
        if groups == 1:
            L.union(x.labels[1], w.labels[1])
        elif groups == x.shape[1] == w.shape[0]:  # depthwise (Mamba's conv1d): channel c reads channel c
            L.union(x.labels[1], w.labels[0])
        out_shape = tuple(out_val.shape)
        out_labels = [x.labels[0], w.labels[0]] + [L.new(f"{node.name}/sp{d}") for d in range(len(out_shape) - 2)]
        params = [w]
        if isinstance(bias, _Param):
            L.union(bias.labels[0], w.labels[0])
            params.append(bias)
        flops = 2.0 * math.prod(out_shape) * math.prod(w.shape[1:])
        split = [x.labels[0], w.labels[0]] + ([x.labels[1]] if groups == 1 else [])
        return self.emit(node, "conv", [x], out_shape, out_labels, _dtype(out_val), params, split, flops, "inputs")

    def pool(self, node: torch.fx.Node, x: _Act, out_val: object) -> _Result:
        out0 = _first_tensor(out_val)
        out_shape = tuple(out0.shape)
        labels = list(x.labels[:2]) + [self.b.labels.new(f"{node.name}/sp{d}") for d in range(len(out_shape) - 2)]
        res = self.emit(node, "pool", [x], out_shape, labels, _dtype(out0), [], list(x.labels[:2]),
                        float(math.prod(x.shape)), "inputs")
        if isinstance(out_val, (tuple, list)):
            return _Multi([res, _Const(())])
        return res

    def softmax(self, node: torch.fx.Node, x: _Act, out_val: torch.Tensor) -> _Act:
        d = _int_arg(node, 1) % len(x.shape)
        split = [lab for k, lab in enumerate(x.labels) if k != d and x.shape[k] > 1]
        return self.emit(node, "softmax", [x], tuple(out_val.shape), list(x.labels), _dtype(out_val), [], split,
                         5.0 * math.prod(x.shape), "output")

    def reduce(self, node: torch.fx.Node, x: _Act, args: list[object], out_val: torch.Tensor) -> _Act:
        out_shape = tuple(out_val.shape)
        rank = len(x.shape)
        reduced: set[int] = set()
        if rank:
            given = len(args) > 1 and isinstance(args[1], (list, tuple))  # else every dim is reduced
            reduced = {d % rank for d in _ints_arg(node, 1)} if given else set(range(rank))
        keep = len(out_shape) == rank
        labels = []
        for k, lab in enumerate(x.labels):
            if k in reduced:
                if keep:
                    labels.append(self.b.labels.new(f"{node.name}/r{k}"))
            else:
                labels.append(lab)
        split = [lab for k, lab in enumerate(x.labels) if x.shape[k] > 1]
        return self.emit(node, "reduce", [x], out_shape, labels, _dtype(out_val), [], split,
                         float(math.prod(x.shape)), "none")

    def loss(self, node: torch.fx.Node, x: _Act, others: list[_Act], out_val: torch.Tensor) -> _Act:
        for other in others:
            if other.shape and x.shape and other.shape[0] == x.shape[0]:
                self.b.labels.union(other.labels[0], x.labels[0])
        return self.emit(node, "loss", [x, *others], tuple(out_val.shape), [], _dtype(out_val), [], [x.labels[0]],
                         6.0 * math.prod(x.shape), "output")

    def moe_dispatch(self, node: torch.fx.Node, args: list[object], out_val: torch.Tensor) -> _Act:
        """Routed tokens [T, H] into per-expert buffers [E, C, H] (search/models/moe.py). The
        buffers' token dim keeps the tokens' label: a rank's buffers hold its own tokens until the
        experts need them split by expert (the all-to-all an expert axis pays on the edge)."""
        x = self.activation(node, args[0], "tokens")
        labels = [self.glabel(EXPERT_LABEL), x.labels[0], x.labels[-1]]
        return self.emit(node, "dispatch", [x], tuple(out_val.shape), labels, _dtype(out_val), [],
                         [x.labels[0], x.labels[-1]], 0.0, "none")

    def moe_combine(self, node: torch.fx.Node, args: list[object], out_val: torch.Tensor) -> _Act:
        """Each token's top-k expert outputs [E, C, H], scaled by its routing weights [T, k] and
        summed into [T, H]: a multiply and an add per routed copy."""
        y = self.activation(node, args[0], "expert outputs")
        w = self.activation(node, args[1], "routing weights")
        tokens = self.b.labels.union(w.labels[0], y.labels[1])
        flops = 2.0 * w.shape[0] * w.shape[-1] * y.shape[-1]
        return self.emit(node, "combine", [y, w], tuple(out_val.shape), [tokens, y.labels[-1]], _dtype(out_val), [],
                         [tokens, y.labels[-1]], flops, "inputs")

    def scan(self, node: torch.fx.Node, args: list[object], out_val: torch.Tensor) -> _Act:
        """One state-space or linear-recurrence scan (search/models/scan.py): its operands' labels
        joined (batch, sequence, channels or heads, state), FLOPs and saved states from the torch
        reference's arithmetic. Splittable: the batch and the channels/heads (each has its own
        state); the search keeps tensor axes off it (search/prices/mesh.py says why)."""
        L = self.b.labels
        ops = torch.ops.paretoplan
        t = node.target
        tensors = [a if isinstance(a, (_Act, _Param)) else None for a in args]

        def join(a: _Act | _Param | None, i: int, b: _Act | _Param | None, j: int) -> None:
            if a is not None and b is not None:
                L.union(a.labels[i], b.labels[j])

        x = self.activation(node, args[0], "input")
        if t is ops.selective_scan.default:  # u, dt, A, B, C, D, z, dt_bias
            _, dt, A, B, C, D, z, bias = tensors
            for o in (dt, z):
                for d in range(3):
                    join(x, d, o, d)
            join(x, 1, A, 0)
            join(x, 1, D, 0)
            join(x, 1, bias, 0)
            for o in (B, C):
                join(x, 0, o, 0)
                join(x, 2, o, 2)
                join(A, 1, o, 1)
            b, ch, seq = x.shape
            n = B.shape[1] if B is not None else 1
            flops, work = selective_scan_flops(b, ch, seq, n), selective_scan_workspace(n)
            split = [x.labels[0], x.labels[1]]
        elif t is ops.chunk_scan.default:  # x [b, L, h, p], dt [b, L, h], A [h], B, C [b, L, g, n], D, dt_bias [h]
            _, dt, A, B, C, D, bias = tensors[:7]
            for d in range(3):
                join(x, d, dt, d)
            join(x, 2, A, 0)
            join(x, 2, D, 0)
            join(x, 2, bias, 0)
            for o in (B, C):
                join(x, 0, o, 0)
                join(x, 1, o, 1)
            join(B, 2, C, 2)
            join(B, 3, C, 3)
            b, seq, h, p = x.shape
            n, chunk = (B.shape[-1] if B is not None else 1), _int_arg(node, 7)
            flops, work = chunk_scan_flops(b, seq, h, p, n, chunk), chunk_scan_workspace(p, n, chunk)
            split = [x.labels[0], x.labels[2]]
        elif t is ops.gated_delta.default:  # q, k [b, L, hk, dk], v [b, L, hv, dv], g, beta [b, L, hv]
            q, k, v, g, beta = tensors[:5]
            x = self.activation(node, v, "values")
            for o in (q, k, g, beta):
                join(x, 0, o, 0)
                join(x, 1, o, 1)
            join(q, 2, k, 2)
            join(q, 3, k, 3)
            join(x, 2, g, 2)
            join(x, 2, beta, 2)
            b, seq, h, dv = x.shape
            dk, chunk = (q.shape[-1] if q is not None else dv), _int_arg(node, 5)
            flops, work = gated_delta_flops(b, seq, h, dk, dv, chunk), gated_delta_workspace(dk, dv, chunk)
            split = [x.labels[0], x.labels[2]]
        else:  # lightning attention: q, k, v [b, h, L, d]
            q, k, v = tensors[:3]
            for o in (k, v):
                for d in range(3):
                    join(q, d, o, d)
            join(q, 3, k, 3)
            b, h, seq, d = x.shape
            block = _int_arg(node, 3)
            flops, work = lightning_flops(b, h, seq, d, block), lightning_workspace(d, block, seq)
            split = [x.labels[0], x.labels[1]]
        inputs = [a for a in tensors if isinstance(a, _Act)]
        params = [a for a in tensors if isinstance(a, _Param)]
        out_labels = list(x.labels)
        return self.emit(node, "scan", inputs, tuple(out_val.shape), out_labels, _dtype(out_val), params, split,
                         flops, "inputs", work)

    def cat(self, node: torch.fx.Node, args: list[object], out_val: torch.Tensor) -> _Act | _Param:
        L = self.b.labels
        tensors = args[0]
        assert isinstance(tensors, list)  # cat's first argument is a list of tensors
        d = _int_arg(node, 1, 0) % out_val.dim()
        out_shape = tuple(out_val.shape)
        # an empty part adds nothing (Phi-3 concatenates the rotated half of each head with the
        # rest, empty when the rotary embedding spans the whole head): it is no input of the op,
        # and a concatenation of one tensor with empties is that tensor
        parts = [p for p in tensors if isinstance(p, (_Act, _Param)) and math.prod(p.shape) > 0]
        if len(parts) == 1 and parts[0].shape == out_shape:
            return parts[0]
        labels = [L.new(f"{node.name}/d{k}") for k in range(len(out_shape))]
        for p in parts:
            for k in range(len(out_shape)):
                if k != d and p.shape[k] == out_shape[k]:
                    labels[k] = L.union(labels[k], p.labels[k])
        if len({L.find(p.labels[d]) for p in parts}) < len(parts):
            # parts reaching the concatenation under one label in different sizes (Qwen3-Next's
            # query, key and value, each flattened from the heads of one packed projection): the
            # concatenated dimension is not split anyway, and one label names one size in an op
            parts = [_Act(p.source, p.shape, [*p.labels[:d], L.new(f"{node.name}/in{i}"), *p.labels[d + 1:]], p.dtype)
                     if isinstance(p, _Act) else p for i, p in enumerate(parts)]
        acts = [p for p in parts if isinstance(p, _Act)]
        prms = [p for p in parts if isinstance(p, _Param)]
        split = [lab for k, lab in enumerate(labels) if k != d and out_shape[k] > 1]
        return self.emit(node, "elementwise", acts, out_shape, labels, _dtype(out_val), prms, split,
                         0.0, "none")

    def stack(self, node: torch.fx.Node, args: list[object], out_val: torch.Tensor) -> _Act:
        """Stacking inserts a new dimension at `dim`: each input dimension keeps its place around
        it (right-aligned broadcasting would pair them wrongly, Cohere's interleaved rotary
        stacking on the last dimension, say, would merge the heads with the batch)."""
        L = self.b.labels
        tensors = args[0]
        assert isinstance(tensors, list)  # stack's first argument is a list of tensors
        parts = [p for p in tensors if isinstance(p, (_Act, _Param))]
        d = _int_arg(node, 1, 0) % out_val.dim()
        out_shape = tuple(out_val.shape)
        labels = [L.new(f"{node.name}/d{k}") for k in range(len(out_shape))]
        # stacked as the last dimension, pairs are interleaved (rotate_half of an interleaved
        # rotary embedding) and flattened next: the dimension before it becomes one twice its
        # size, which must not carry the inputs' label (a label names one size)
        interleaved = d == len(out_shape) - 1
        for p in parts:
            for k in range(len(out_shape)):
                j = k if k < d else k - 1
                if k != d and p.shape[j] == out_shape[k] and not (interleaved and k == d - 1):
                    labels[k] = L.union(labels[k], p.labels[j])
        acts = [p for p in parts if isinstance(p, _Act)]
        prms = [p for p in parts if isinstance(p, _Param)]
        split = [lab for k, lab in enumerate(labels) if k != d and out_shape[k] > 1]
        return self.emit(node, "elementwise", acts, out_shape, labels, _dtype(out_val), prms, split,
                         0.0, "none")

    def elementwise(self, node: torch.fx.Node, acts: list[_Act], prms: list[_Param], out_val: object) -> _Result:
        L = self.b.labels
        out0 = out_val[0] if isinstance(out_val, (tuple, list)) else out_val
        if not isinstance(out0, torch.Tensor):
            return _Const(())
        out_shape = tuple(out0.shape)
        nd = len(out_shape)
        labels: list[int | None] = [None] * nd
        operands: list[_Act | _Param] = [*acts, *prms]
        broadcast_ok = all(len(a.shape) <= nd for a in operands)
        if broadcast_ok:
            for a in operands:
                pad = nd - len(a.shape)
                for k, size in enumerate(a.shape):
                    if size == out_shape[pad + k] and size != 1:
                        cur = labels[pad + k]
                        labels[pad + k] = a.labels[k] if cur is None else L.union(cur, a.labels[k])
        final = [lab if lab is not None else L.new(f"{node.name}/d{k}") for k, lab in enumerate(labels)]
        along = _along_dims(node, nd)
        if broadcast_ok and acts:
            kind = "elementwise"
            split = [lab for k, lab in enumerate(final) if out_shape[k] > 1 and k not in along]
        else:
            kind = "opaque"
            split = ([acts[0].labels[0]] if acts and acts[0].shape and final and acts[0].shape[0] == out_shape[0]
                     and 0 not in along else [])
            if split:
                L.union(split[0], final[0])
            elif not acts and broadcast_ok and nd >= 3 and out_shape[0] > 1 and labels[0] is None:
                # a table read at ids broadcast over the batch (Whisper's decoder positions:
                # weight[position_ids], the ids one row expanded over the batch): no operand
                # carries the leading dimension, which joins the batch later; every rank has the
                # table and the ids, so it splits as the batch does, as embedding's broadcast ids
                split = [final[0]]
        res = self.emit(node, kind, acts, out_shape, final, _dtype(out0), prms, split,
                        float(math.prod(out_shape)), _elementwise_saves(_short(node.target), bool(acts)))
        if isinstance(out_val, (tuple, list)):
            return _Multi([res] + [_Const(()) for _ in out_val[1:]])
        return res

    # -- finishing ------------------------------------------------------------------------
    def graph(self, name: str, meta: dict[str, str | int | float], model: nn.Module) -> OpGraph:
        self.name_hidden()
        if EXPERT_LABEL in self.global_labels:  # the experts' weights, older, would name it otherwise
            L = self.b.labels
            L.names[L.find(self.global_labels[EXPERT_LABEL])] = EXPERT_LABEL
        owned: set[str] = set()
        ops = [self.finished_op(raw, owned) for raw in self.b.ops]
        # Pointwise ops may shard only dimensions that the graph's inputs or some compute op
        # (matmul, attention, embedding, conv, pool) shard: splitting a head_dim half or a
        # broadcast helper dim that nothing else splits only adds gathers, and it would multiply
        # the configuration space of every rotary-embedding op.
        meaningful = set(self.global_labels_named())
        for op in ops:
            if op.kind in _COMPUTE_KINDS:
                meaningful.update(op.splittable)
        ops = [op if op.kind in _COMPUTE_KINDS
               else op.model_copy(update={"splittable": tuple(s for s in op.splittable if s in meaningful)})
               for op in ops]
        return OpGraph(name=name, ops=_mark_styles(ops, model), meta=meta)

    def name_hidden(self) -> None:
        """Readability: the model width (the last dim of the first embedding lookup) is "hidden"."""
        L = self.b.labels
        for o in self.b.ops:
            if o.kind == "embedding" and "hidden" not in L.names:
                L.names[L.find(o.output.labels[-1])] = "hidden"
                break

    def finished_op(self, raw: _RawOp, owned: set[str]) -> Op:
        """An emitted op with its labels named; a parameter an earlier op read is not owned again."""
        L = self.b.labels

        def dims(labels: tuple[int, ...]) -> tuple[str, ...]:
            return tuple(L.name(x) for x in labels)

        params = []
        for p in raw.params:
            assert p.source is not None  # a parameter's name
            params.append(ParamRef(name=p.source, shape=p.shape, dims=dims(p.labels), dtype=p.dtype,
                                   owner=p.source not in owned))
            owned.add(p.source)
        inputs = tuple(TensorRef(source=t.source, shape=t.shape, dims=dims(t.labels), dtype=t.dtype) for t in raw.inputs)
        output = TensorRef(source=None, shape=raw.output.shape, dims=dims(raw.output.labels), dtype=raw.output.dtype)
        split: list[str] = []
        for s in raw.splittable:
            nm = L.name(s)
            if nm not in split:
                split.append(nm)
        refs: list[TensorRef | ParamRef] = [*inputs, output, *params]
        # a label on two dims of one tensor (attention scores [.., seq, seq]; a square weight whose
        # two sides a tie made one label, BERT's head transform) names no single shard: splitting
        # it would price a block-diagonal product that is not the op, and no placement runs it
        twice = {d for r in refs for d in r.dims if r.dims.count(d) > 1}
        return Op(name=raw.name, kind=raw.kind, target=raw.target, module=raw.module, inputs=inputs, output=output,
                  params=tuple(params), flops=raw.flops, saves=raw.saves, workspace=raw.workspace,
                  splittable=tuple(s for s in split if s not in twice and label_size(refs, s) > 1))

    def global_labels_named(self) -> list[str]:
        return [self.b.labels.name(x) for x in self.global_labels.values()]


def _elementwise_saves(short: str, reads_activation: bool) -> SaveKind:
    """What autograd keeps of a pointwise op for backward (graph.py lists the kinds)."""
    if short in _DROPOUT:
        return "mask"
    if short in _SAVES_OUTPUT:
        return "output"
    if short in _SAVES_NOTHING or not reads_activation:
        return "none"
    return "inputs"


def _flat(args: list[object]) -> list[object]:
    out: list[object] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat(list(a)))
        else:
            out.append(a)
    return out


_getitem = operator.getitem
_SCAN_TARGETS = {torch.ops.paretoplan.selective_scan.default, torch.ops.paretoplan.chunk_scan.default,
                 torch.ops.paretoplan.gated_delta.default, torch.ops.paretoplan.lightning_attention.default}


# ---- public entry points -----------------------------------------------------------------------
GraphMeta = dict[str, str | int | float]


def capture_module(module: nn.Module, example_args: tuple[torch.Tensor, ...], name: str = "model",
                   input_labels: list[list[str]] | None = None, meta: GraphMeta | None = None) -> OpGraph:
    """Export `module` (on meta) and translate it. `input_labels` names the dims of each input,
    e.g. [["batch", "seq"], ["batch", "seq"]] for token ids and targets.

    InputError when torch.export cannot trace the model or the model uses a pattern the
    translation does not support (the walk raises those itself, naming the op); any other
    exception from the translation is a bug in it and propagates as one.

    Routed experts are exported at a balanced load's shapes (search/models/moe.py), their buffers
    rounded to a multiple of the batch (the size of the inputs' dimension labelled "batch")."""
    batch = next((int(a.shape[d]) for a, labels in zip(example_args, input_labels or [], strict=False)
                  for d, lab in enumerate(labels) if lab == "batch" and d < a.dim()), 1)
    try:
        with balanced_experts(module, multiple=batch), unflattened_dense_experts(module), scans_as_ops(module):
            ep = torch.export.export(module, example_args, strict=False)
    except Exception as e:  # noqa: BLE001 - export runs the user's forward: its errors are many and varied
        raise InputError(f"cannot capture {name}: torch.export failed: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    cap = _Capture(ep, input_labels or [], name)
    cap.run()
    _refuse_unrolled_loops(cap.b.ops, name)
    try:
        return moe_meta(cap.graph(name, meta or {}, module))
    except ValidationError as e:  # the model computes what the search cannot price (complex numbers)
        raise invalid(e, f"cannot capture {name}: invalid graph") from None


def _mark_styles(ops: list[Op], model: nn.Module) -> tuple[Op, ...]:
    """Mark the ops with parameters that no parallel style can split (Op.styled): a style shards
    a module of its own class (STYLE_MODULES) without submodules whose boundary is the op's own,
    and an Embedding only through the indices its forward is called with: GPT-2's Conv1D (an
    addmm), Gemma's embedding scaled inside its forward, OPT's and BART's learned positions
    (indices made inside the forward) all run whole on every rank of a tensor axis."""
    modules = dict(model.named_modules())
    own = own_modules(ops)

    def styled(op: Op) -> bool:
        mod = modules.get(op.module)
        if op.kind not in STYLE_MODULES or mod is None or op.module not in own:
            return False
        if not isinstance(mod, STYLE_MODULES[op.kind]) or any(True for _ in mod.children()):
            return False
        return not (op.kind == "embedding" and not op.inputs and type(mod).forward is not nn.Embedding.forward)

    return tuple(op if not op.params or styled(op) else op.model_copy(update={"styled": False}) for op in ops)


# More ops than this in one module is a Python loop that torch.export unrolled (a recurrence over
# the sequence: Mamba's selective scan runs one step per token): the search would price thousands
# of tiny ops per layer and take minutes to hours, so the model is refused, naming the module.
MAX_OPS_PER_MODULE = 1000


def _refuse_unrolled_loops(ops: Sequence[_RawOp], name: str) -> None:
    from collections import Counter

    counts = Counter(op.module for op in ops)
    if not counts:
        return
    module, n = counts.most_common(1)[0]
    if n > MAX_OPS_PER_MODULE:
        raise InputError(f"cannot capture {name}: module {module or 'the top-level module'} runs {n} ops per "
                         f"iteration (a loop over the sequence, unrolled by torch.export: a recurrent or state-space "
                         f"scan), which is not captured as one op; such layers are not planned")


# transformers' state-space and linear-recurrence mixers, which run one step per token in Python off
# CUDA: exporting them unrolls the whole sequence (minutes at 2,048 tokens) only to be refused by
# the check above. Those whose scan capture swaps for one op (search/models/scan.py) are captured;
# the others are refused before the export
_SCAN_MODULES = ("MambaMixer", "Mamba2Mixer", "FalconMambaMixer", "JambaMambaMixer", "BambaMixer",
                 "FalconH1Mixer", "GatedDeltaNet", "MiniMaxLightningAttention", "Lfm2ShortConv")


def _refuse_known_scans(module: nn.Module, name: str) -> None:
    for path, m in module.named_modules():
        kind = type(m).__name__
        if any(kind.endswith(s) for s in _SCAN_MODULES) and not captured_kind(m):
            raise InputError(f"cannot capture {name}: module {path} ({kind}) is a recurrent or state-space layer "
                             f"whose scan over the sequence runs as Python loops (torch.export would unroll them), not "
                             f"captured as one op; such layers are not planned")


def _get_attr(root: nn.Module, dotted: str) -> nn.Module:
    mod = root
    for part in dotted.split("."):
        mod = getattr(mod, part)
    return mod


def _stack(root: nn.Module, dotted: str) -> nn.ModuleList:
    stack = _get_attr(root, dotted)
    if not isinstance(stack, nn.ModuleList):
        raise TypeError(f"stack {dotted!r} is a {type(stack).__name__}, not an nn.ModuleList")
    return stack


def _set_attr(root: nn.Module, dotted: str, value: nn.Module) -> None:
    parent, _, last = dotted.rpartition(".")
    setattr(_get_attr(root, parent) if parent else root, last, value)


def capture_with_blocks(module: nn.Module, example_args: tuple[torch.Tensor, ...], blocks_attr: str | None,
                        name: str = "model", input_labels: list[list[str]] | None = None,
                        meta: GraphMeta | None = None) -> OpGraph:
    """Capture a model whose `blocks_attr` ModuleList holds identical layers: export two layers,
    verify the second is a copy of the first, replicate it; or, with layers repeating every p
    (`_period`), two periods, the second replicated. Falls back to a full export when the layers
    are neither or are wired in a way the replication cannot express."""
    if not blocks_attr:
        return capture_module(module, example_args, name, input_labels, meta)
    blocks = _get_attr(module, blocks_attr)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"{name}: blocks_attr {blocks_attr!r} is a {type(blocks).__name__}, not an nn.ModuleList")
    n = len(blocks)
    # the layers from `first` on are identical (DeepSeek-V3's first 3 of 61 are dense, the rest
    # MoE): the layers before them and two of them are exported, the rest replicated
    first, period = _uniform_from(blocks), 1
    if n - first < 3:
        if n < 2:
            return capture_module(module, example_args, name, input_labels, meta)
        period = _period(blocks)
        if period == 1:
            return _annotate_blocks(capture_module(module, example_args, name, input_labels, meta), blocks_attr, n)
        # a periodic stack (Jamba's Mamba/attention and dense/MoE layers repeat every 8): one
        # block-stack layer per period, so the search reuses, recomputes and pipelines by period;
        # two periods are exported and the second replicated, as one layer is below
        first = 0
    _set_attr(module, blocks_attr, nn.ModuleList(list(blocks)[:first + 2 * period]))
    try:
        g2 = capture_module(module, example_args, name, input_labels, meta)
    finally:
        _set_attr(module, blocks_attr, blocks)
    full = _replicate(g2, blocks_attr, n, first, period)
    if full is None:
        g = capture_module(module, example_args, name, input_labels, meta)
        return _annotate_blocks(g, blocks_attr, n, period)
    # tied/shared params are counted from the real module, not from the two-layer export; the
    # MoE layers from the replicated graph
    return moe_meta(full)


def _layer_signature(m: nn.Module) -> tuple:
    return (type(m).__name__, tuple((k, tuple(p.shape)) for k, p in m.named_parameters()),
            tuple(type(c).__name__ for c in m.modules()))


def _uniform_from(blocks: nn.ModuleList) -> int:
    """The first index from which every layer of the stack is identical to the last."""
    last = _layer_signature(blocks[-1])
    k = len(blocks) - 1
    while k > 0 and _layer_signature(blocks[k - 1]) == last:
        k -= 1
    return k


MAX_PERIOD = 8  # the longest period of layers searched as one block-stack layer


def _period(blocks: nn.ModuleList) -> int:
    """The smallest p <= MAX_PERIOD such that layer i is identical to layer i + p throughout and the
    stack is at least 3 whole periods (block reuse needs 3 layers); 1 if there is none."""
    sigs = [_layer_signature(m) for m in blocks]
    n = len(sigs)
    for p in range(2, MAX_PERIOD + 1):
        if n % p == 0 and n // p >= 3 and all(sigs[i] == sigs[i + p] for i in range(n - p)):
            return p
    return 1


def _layer_of(opname: str, module: str, prefix: str) -> int | None:
    m = re.match(re.escape(prefix) + r"\.(\d+)(?:[.:#]|$)", module or opname)
    return int(m.group(1)) if m else None


def _annotate_blocks(g: OpGraph, prefix: str, n: int, period: int = 1) -> OpGraph:
    """The graph's block stack: layer k of it holds the ops of the module layers k * period ..
    (k + 1) * period - 1, in graph order (a period's layers run one after the other)."""
    layers: list[list[str]] = [[] for _ in range(n // period)]
    for op in g.ops:
        i = _layer_of(op.name, op.module, prefix)
        if i is not None and i < n:
            layers[i // period].append(op.name)
    if any(len(layer) != len(layers[0]) or not layer for layer in layers):
        return g
    return g.model_copy(update={"blocks": (BlockInfo(prefix=prefix, layers=tuple(tuple(x) for x in layers)),)})


def _renamer(prefix: str, moves: dict[int, int]) -> Callable[[str], str]:
    """Names with module layer i of the stack (a key of `moves`) renamed to layer moves[i]."""
    pat = re.compile(r"(^|(?<=[/:]))" + re.escape(prefix) + r"\.(\d+)(?=[.:/#]|$)")

    def one(m: re.Match[str]) -> str:
        i = int(m.group(2))
        return f"{prefix}.{moves[i]}" if i in moves else m.group(0)

    return lambda s: pat.sub(one, s)


def _replicate(g2: OpGraph, prefix: str, n: int, first: int = 0, period: int = 1) -> OpGraph | None:
    """g2 exported module layers 0 .. first + 2 * period - 1 of an n-layer stack whose layers
    from `first` on repeat every `period` (1: identical): the second period (layers first +
    period ..) is copied for the rest, each block-stack layer one period. With differing layers
    before `first`, the block stack is layers first .. n - 1."""
    if (n - first) % period:
        return None
    ops = list(g2.ops)
    # the period each op belongs to (-1 before `first`, None outside the stack)
    idx = [None if (i := _layer_of(op.name, op.module, prefix)) is None else -1 if i < first else (i - first) // period
           for op in ops]
    l0 = [op for op, i in zip(ops, idx, strict=True) if i == 0]
    l1 = [op for op, i in zip(ops, idx, strict=True) if i == 1]
    if not l0 or len(l0) != len(l1):
        return None
    first1 = min(k for k, i in enumerate(idx) if i == 1)
    last1 = max(k for k, i in enumerate(idx) if i == 1)
    if any(i != 1 for i in idx[first1:last1 + 1]):
        return None
    l0_names = {op.name for op in l0}
    l1_names = {op.name for op in l1}
    earlier = {op.name for op, i in zip(ops, idx, strict=True) if i == -1}
    out0 = l0[-1].name
    # the copied period may read only its own ops, the period before's last op, graph inputs and
    # non-layer ops before the stack
    for op in l1:
        for t in op.inputs:
            if (t.source in l0_names and t.source != out0) or t.source in earlier:
                return None

    def moves(src: int, dst: int) -> dict[int, int]:
        """Module layers of period src -> those of period dst."""
        return {first + src * period + j: first + dst * period + j for j in range(period)}

    ren = _renamer(prefix, moves(0, 1))
    for a, b in zip(l0, l1, strict=True):  # structural identity of the two exported periods
        if (a.kind, a.flops, a.output.shape, tuple(p.shape for p in a.params),
                tuple(t.shape for t in a.inputs)) != (b.kind, b.flops, b.output.shape,
                                                      tuple(p.shape for p in b.params), tuple(t.shape for t in b.inputs)):
            return None
        if ren(a.name) != b.name:
            return None
    post = ops[last1 + 1:]
    pre = ops[:first1]
    out1 = l1[-1].name
    for op in post:
        for t in op.inputs:
            if t.source in l1_names and t.source != out1:
                return None
            if t.source in l0_names or t.source in earlier:
                return None
    new_ops: list[Op] = [op for op in pre]
    layers: list[tuple[str, ...]] = [tuple(op.name for op in l0), tuple(op.name for op in l1)]
    new_ops += l1
    prev_out = out1
    prev_dims = l1[-1].output.dims
    periods = (n - first) // period
    for i in range(2, periods):
        r = _renamer(prefix, moves(1, i))
        # the template read period 0's output, whose labels may be its own (a stack without a
        # residual stream names each layer's output after its last weight): period i reads
        # period i - 1's output under that period's labels
        labels = {a: b for a, b in zip(l0[-1].output.dims, prev_dims, strict=True) if a != b}
        layer_ops = []
        for op in l1:
            layer_ops.append(_rename_op(op, r, {out0: prev_out}, labels))
        new_ops += layer_ops
        prev_dims = layer_ops[-1].output.dims
        layers.append(tuple(op.name for op in layer_ops))
        prev_out = layer_ops[-1].name
    rl = _renamer(prefix, moves(1, periods - 1))
    for op in post:
        new_ops.append(_rename_op(op, rl, {}))
    meta = dict(g2.meta)
    # layers before `first` differ from the run after it (DeepSeek-V3's 3 dense layers before 58
    # MoE ones): the block stack is the run alone, the layers before it are ops like the
    # embedding's (priced with the rest of the graph, on the first pipeline stage, not recomputed)
    return OpGraph(name=g2.name, ops=tuple(new_ops), meta=meta,
                   blocks=(BlockInfo(prefix=prefix, layers=tuple(layers)),))


def _rename_op(op: Op, r: Callable[[str], str], source_map: dict[str, str],
               labels: dict[str, str] | None = None) -> Op:
    """`op` renamed by `r`, its inputs from `source_map`'s ops and its dimension labels (once
    renamed) through `labels`."""
    lab = labels or {}

    def dim(d: str) -> str:
        d = r(d)
        return lab.get(d, d)

    def tref(t: TensorRef) -> TensorRef:
        src = source_map.get(t.source, r(t.source)) if t.source is not None else None
        return TensorRef(source=src, shape=t.shape, dims=tuple(dim(d) for d in t.dims), dtype=t.dtype)

    return Op(name=r(op.name), kind=op.kind, target=op.target, module=r(op.module),
              inputs=tuple(tref(t) for t in op.inputs), output=tref(op.output),
              params=tuple(ParamRef(name=r(p.name), shape=p.shape, dims=tuple(dim(d) for d in p.dims), dtype=p.dtype,
                                    owner=p.owner) for p in op.params),
              splittable=tuple(dim(s) for s in op.splittable), flops=op.flops, saves=op.saves,
              workspace=op.workspace)


_INPUT_LABELS = {
    "lm": [["batch", "seq"], ["batch", "seq"]],
    "mlm": [["batch", "seq"], ["batch", "seq"]],
    "seq2seq": [["batch", "seq"], ["batch", "seq"]],
    "vision": [["batch", "channels", "height", "width"], ["batch"]],
}


def capture_model(spec: ModelSpec, batch: int, seq_len: int | None = None) -> OpGraph:
    """Build a zoo (or HF-config) model on the meta device and capture its training graph for
    one iteration's global batch."""
    if batch < 1:
        raise InputError(f"global batch must be >= 1, got {batch}")
    seq = seq_len if seq_len is not None else spec.default_seq_len
    with torch.device("meta"):
        module = spec.build()
    _refuse_known_scans(module, spec.name)
    args = spec.example_inputs(batch, seq, device="meta")
    meta: GraphMeta = {"model": spec.name, "global_batch": batch, "params": spec.param_count()}
    if seq is not None and spec.kind != "vision":
        meta["seq_len"] = seq
    if spec.stacks:  # an encoder-decoder: two block families (search/models/seq2seq.py)
        sizes = tuple(len(_stack(module, attr)) for attr in spec.stacks)
        g = capture_module(module, args, spec.name, _INPUT_LABELS.get(spec.kind, []), meta)
        return annotate_stacks(g, spec.stacks, sizes)
    return capture_with_blocks(module, args, spec.blocks_attr, name=spec.name,
                               input_labels=_INPUT_LABELS.get(spec.kind, []), meta=meta)


def moe_meta(g: OpGraph) -> OpGraph:
    """A graph with routed experts says so in its meta: how many experts per layer, how many each
    token visits, how many MoE layers and the load the shapes assume (plans repeat it in their
    summaries)."""
    dispatch = [op for op in g.ops if op.kind == "dispatch"]
    combine = [op for op in g.ops if op.kind == "combine"]
    if not dispatch or not combine:
        return g
    meta = {**g.meta, "moe_experts": max(op.output.shape[0] for op in dispatch),
            "moe_top_k": combine[0].inputs[1].shape[-1], "moe_layers": len(combine), "moe_load": LOAD_ASSUMPTION}
    return g.model_copy(update={"meta": meta})
