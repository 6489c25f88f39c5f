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
from collections.abc import Iterator
from contextlib import contextmanager
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


def is_experts(module: nn.Module) -> bool:
    """An experts container in the layout transformers 5 and the zoo share (see the module docstring)."""
    params = dict(module.named_parameters(recurse=False))
    gu, down = params.get("gate_up_proj"), params.get("down_proj")
    return (set(params) == {"gate_up_proj", "down_proj"} and gu is not None and down is not None
            and gu.dim() == 3 and down.dim() == 3 and gu.shape[0] == down.shape[0]
            and gu.shape[1] == 2 * down.shape[2] and gu.shape[2] == down.shape[1] and callable(getattr(module, "act_fn", None)))


def _balanced_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor, *, multiple: int) -> torch.Tensor:
    gate_up, down, act = self.gate_up_proj, self.down_proj, self.act_fn
    assert isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and callable(act)  # is_experts checked
    x = torch.ops.paretoplan.moe_dispatch(hidden_states, top_k_index, gate_up.shape[0], multiple)
    gate, up = torch.bmm(x, gate_up.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(act(gate) * up, down.transpose(1, 2))
    return torch.ops.paretoplan.moe_combine(y, top_k_weights.to(y.dtype), top_k_index)


@contextmanager
def balanced_experts(model: nn.Module, multiple: int = 1) -> Iterator[list[tuple[str, int]]]:
    """Within the block, every experts container of `model` computes at a balanced load's shapes
    (for capture), its buffers rounded up to a multiple of `multiple` tokens (the global batch);
    yields (module path, number of experts) of each."""
    found = [(name, m) for name, m in model.named_modules() if is_experts(m)]
    for _, m in found:
        m.forward = MethodType(partial(_balanced_forward, multiple=multiple), m)
    try:
        yield [(name, int(m.gate_up_proj.shape[0])) for name, m in found]
    finally:
        for _, m in found:
            del m.forward


def expert_flops(tokens: int, top_k: int, hidden: int, intermediate: int, num_experts: int,
                 multiple: int = 1) -> float:
    """Forward FLOPs of one MoE layer's routed experts at a balanced load: the router's GEMM and,
    for each of the tokens x top_k copies (as the buffers round them), a SwiGLU expert (gate_up
    H -> 2I, down I -> H)."""
    copies = num_experts * capacity(tokens, top_k, num_experts, multiple)
    return 2.0 * tokens * hidden * num_experts + 2.0 * copies * hidden * 2 * intermediate + 2.0 * copies * intermediate * hidden
