"""Routed experts (Mixture of Experts) as capture sees them.

transformers (Mixtral, Qwen2-MoE, Qwen3-MoE, ...) and the zoo's MoE hold a layer's experts as one
module with two 3-D parameters, ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, called as
``experts(tokens [T, H], top_k_index [T, k], top_k_weights [T, k])``. Exported as written, the
routing's data-dependent shapes (which tokens go where) become a sort, a histogram and an opaque
grouped GEMM whose FLOPs capture could only guess from its element count (~8,000x too low for
Mixtral). So for capture the experts' forward is swapped for the same computation at the shapes of
a balanced load, each step an op the search can price and shard:

- ``paretoplan::moe_dispatch``: tokens [T, H] -> per-expert buffers [E, C, H], C = T k / E
  (every expert receives the same share of the T k routed tokens: the load-balance assumption,
  capacity factor 1, stated in the graph's meta and every plan's summary), rounded up to a
  multiple of the global batch so that the buffers split over every data-parallel size the
  batch splits over (Qwen1.5-MoE's 60 experts leave a fraction otherwise; at most one token per
  sequence more per expert);
- two batched GEMMs against the stacked weights (``bmm``), with the activation between them:
  2 T k H (2I) + 2 T k I H FLOPs forward, what the experts really compute for T k token copies;
- ``paretoplan::moe_combine``: [E, C, H] and the routing weights [T, k] -> [T, H], each token's
  k expert outputs scaled and summed.

Under expert parallelism (a mesh axis with role ``expert``) the buffers' expert dimension is
split: the dispatch's output leaves each rank split by its own tokens and the GEMMs need it split
by expert, which is the all-to-all the cost model prices, forward and backward, and the same on
the way back to the combine. The custom ops exist for capture on the meta device only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import MethodType

import torch
from torch import nn

EXPERT_LABEL = "expert"  # the dimension label of the experts (every MoE layer's)
LOAD_ASSUMPTION = "balanced (each expert gets tokens x top_k / experts, capacity factor 1)"


@torch.library.custom_op("paretoplan::moe_dispatch", mutates_args=())
def moe_dispatch(tokens: torch.Tensor, top_k_index: torch.Tensor, num_experts: int, multiple: int) -> torch.Tensor:
    raise RuntimeError("paretoplan::moe_dispatch stands for the routing during capture on the meta device only")


@moe_dispatch.register_fake
def _dispatch_shape(tokens: torch.Tensor, top_k_index: torch.Tensor, num_experts: int, multiple: int) -> torch.Tensor:
    return tokens.new_empty((num_experts, capacity(tokens.shape[0], top_k_index.shape[-1], num_experts, multiple),
                             tokens.shape[-1]))


@torch.library.custom_op("paretoplan::moe_combine", mutates_args=())
def moe_combine(expert_out: torch.Tensor, top_k_weights: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("paretoplan::moe_combine stands for the routing during capture on the meta device only")


@moe_combine.register_fake
def _combine_shape(expert_out: torch.Tensor, top_k_weights: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    return expert_out.new_empty((top_k_weights.shape[0], expert_out.shape[-1]))


def capacity(tokens: int, top_k: int, num_experts: int, multiple: int = 1) -> int:
    """Tokens per expert under a balanced load, rounded up to a multiple of `multiple`."""
    return math.ceil(tokens * top_k / num_experts / multiple) * multiple


@dataclass(frozen=True)
class ExpertsLayout:
    """How an experts container holds its stacked weights, as transformers' experts decorator
    describes it: ``up`` names the first projection (``gate_up_proj`` [E, 2I, H] when gated, else
    ``up_proj`` [E, I, H]); ``transposed`` stores each expert's matrices input-major ([E, H, 2I],
    gpt-oss); ``bias`` adds ``<name>_bias`` [E, out] to each projection."""

    up: str
    gated: bool
    transposed: bool
    bias: bool

    def names(self) -> tuple[str, ...]:
        return (self.up, "down_proj") + ((f"{self.up}_bias", "down_proj_bias") if self.bias else ())


def experts_layout(module: nn.Module) -> ExpertsLayout | None:
    """The layout of an experts container in the form transformers 5 and the zoo share (see the
    module docstring), with or without biases, gated or not, stored transposed or not; None for
    any other module."""
    params = dict(module.named_parameters(recurse=False))
    gated = "gate_up_proj" in params
    transposed = bool(getattr(module, "is_transposed", False))
    bias = bool(getattr(module, "has_bias", False)) or "down_proj_bias" in params
    layout = ExpertsLayout("gate_up_proj" if gated else "up_proj", gated, transposed, bias)
    if set(params) != set(layout.names()):
        return None
    up, down = params[layout.up], params["down_proj"]
    if up.dim() != 3 or down.dim() != 3 or up.shape[0] != down.shape[0]:
        return None
    # [E, out, in] as nn.Linear stores it, or [E, in, out] transposed
    up_in, up_out = (up.shape[1], up.shape[2]) if transposed else (up.shape[2], up.shape[1])
    down_in, down_out = (down.shape[1], down.shape[2]) if transposed else (down.shape[2], down.shape[1])
    if up_in != down_out or up_out != (2 if gated else 1) * down_in:
        return None
    gate_fns = (getattr(module, "_apply_gate", None), getattr(module, "act_fn", None)) if gated else (
        getattr(module, "act_fn", None),)
    return layout if any(callable(f) for f in gate_fns) else None


def is_experts(module: nn.Module) -> bool:
    """An experts container in a layout capture and expert parallelism both understand."""
    return experts_layout(module) is not None


def expert_ffn(module: nn.Module, layout: ExpertsLayout, x: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
               up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' MLP on tokens ``x``: [E, C, H] against the stacked weights, or [C, H] against
    one expert's; the gate as the module computes it (gpt-oss's clamped, interleaved SwiGLU is its
    own ``_apply_gate``; the zoo's and transformers' default split the halves)."""
    h = torch.matmul(x, up if layout.transposed else up.transpose(-1, -2))
    if up_bias is not None:
        h = h + (up_bias.unsqueeze(-2) if h.dim() == 3 else up_bias)
    if layout.gated:
        gate_fn = getattr(module, "_apply_gate", None)
        if callable(gate_fn):
            h = gate_fn(h)
        else:
            gate, lin = h.chunk(2, dim=-1)
            h = _act(module)(gate) * lin
    else:
        h = _act(module)(h)
    y = torch.matmul(h, down if layout.transposed else down.transpose(-1, -2))
    if down_bias is not None:
        y = y + (down_bias.unsqueeze(-2) if y.dim() == 3 else down_bias)
    return y


def _act(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    act = getattr(module, "act_fn", None)
    assert callable(act)  # experts_layout checked it
    return act


def _balanced_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor, *, multiple: int, layout: ExpertsLayout) -> torch.Tensor:
    w = [getattr(self, n) for n in layout.names()]
    assert all(isinstance(t, torch.Tensor) for t in w)  # experts_layout checked them
    x = torch.ops.paretoplan.moe_dispatch(hidden_states, top_k_index, w[0].shape[0], multiple)
    y = expert_ffn(self, layout, x, *w)
    return torch.ops.paretoplan.moe_combine(y, top_k_weights.to(y.dtype), top_k_index)


@contextmanager
def balanced_experts(model: nn.Module, multiple: int = 1) -> Iterator[list[tuple[str, int]]]:
    """Within the block, every experts container of `model` computes at a balanced load's shapes
    (for capture), its buffers rounded up to a multiple of `multiple` tokens (the global batch);
    yields (module path, number of experts) of each."""
    found = [(name, m, layout) for name, m in model.named_modules() if (layout := experts_layout(m)) is not None]
    for _, m, layout in found:
        m.forward = MethodType(partial(_balanced_forward, multiple=multiple, layout=layout), m)
    try:
        yield [(name, int(m.get_parameter(layout.up).shape[0])) for name, m, layout in found]
    finally:
        for _, m, _ in found:
            del m.forward


def expert_flops(tokens: int, top_k: int, hidden: int, intermediate: int, num_experts: int,
                 multiple: int = 1) -> float:
    """Forward FLOPs of one MoE layer's routed experts at a balanced load: the router's GEMM and,
    for each of the tokens x top_k copies (as the buffers round them), a SwiGLU expert (gate_up
    H -> 2I, down I -> H)."""
    copies = num_experts * capacity(tokens, top_k, num_experts, multiple)
    return 2.0 * tokens * hidden * num_experts + 2.0 * copies * hidden * 2 * intermediate + 2.0 * copies * intermediate * hidden


def _dense_experts(module: nn.Module) -> bool:
    """A MoE block whose experts run every token (Llama-4's: `experts(tokens.repeat(E, 1) * scores)`,
    one bmm per projection over [E, T, H], the unrouted copies scaled by zero): its router, shared
    expert and experts, the experts stacked [E, H, 2I] and [E, I, H] and called on one tensor."""
    experts = getattr(module, "experts", None)
    if not (isinstance(experts, nn.Module) and isinstance(getattr(module, "router", None), nn.Module)
            and isinstance(getattr(module, "shared_expert", None), nn.Module)) or experts_layout(experts) is not None:
        return False
    params = dict(experts.named_parameters(recurse=False))
    up, down = params.get("gate_up_proj"), params.get("down_proj")
    return (set(params) == {"gate_up_proj", "down_proj"} and up is not None and down is not None and up.dim() == 3
            and down.dim() == 3 and up.shape[0] == down.shape[0] and up.shape[2] == 2 * down.shape[1]
            and up.shape[1] == down.shape[2] and callable(getattr(experts, "act_fn", None)))


def _dense_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama4TextMoe.forward as it computes, with the experts' tokens kept [E, T, H] instead of
    flattened to [E T, H] (`repeat(E, 1)`): the tokens stay a dimension of their own, which splits
    by batch as the tokens do; the same products, the same FLOPs."""
    experts = self.experts
    assert isinstance(experts, nn.Module)  # _dense_experts checked it
    tokens = hidden_states.reshape(-1, hidden_states.shape[-1])
    router, shared = self.get_submodule("router"), self.get_submodule("shared_expert")
    scores, logits = router(tokens)  # [T, E], zero for the experts a token is not routed to
    x = tokens.unsqueeze(0) * scores.transpose(0, 1).unsqueeze(-1)
    gate, up = torch.bmm(x, experts.get_parameter("gate_up_proj")).chunk(2, dim=-1)
    y = torch.bmm(up * _act(experts)(gate), experts.get_parameter("down_proj"))
    return shared(tokens) + y.sum(dim=0), logits


@contextmanager
def unflattened_dense_experts(model: nn.Module) -> Iterator[int]:
    """Within the block, every dense MoE block of `model` (see `_dense_experts`) computes with its
    experts' tokens unflattened, for capture; yields how many were found."""
    found = [m for m in model.modules() if _dense_experts(m)]
    for m in found:
        m.forward = MethodType(_dense_forward, m)
    try:
        yield len(found)
    finally:
        for m in found:
            del m.forward
