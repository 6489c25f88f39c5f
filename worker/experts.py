"""Expert parallelism: each rank of the expert mesh dimension holds experts / ep of every MoE
layer's experts and trades tokens with the others by all-to-all, as torchtitan does.

Per layer and step, forward: the routing's per-expert token counts go out by one all-to-all (every
rank learns how many tokens it receives from each other rank), the tokens by a second (dispatch),
each rank runs its experts on what it received, and a third all-to-all returns the results
(combine), which are scaled by the routing weights and summed per token where the tokens live.
Backward, autograd runs the two token all-to-alls in reverse. The plan prices the same three
forward and two backward all-to-alls per layer (search/prices/costmodel.py); the routing itself is
the model's, unbalanced as it comes, where the plan's prices assume a balanced load.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
from torch import nn

from search.models.moe import expert_ffn, experts_layout, is_experts


class ExpertParallelExperts(nn.Module):
    """A layer's experts `first` .. `first + local - 1` of `total`, under the original module's
    parameter names (gate_up_proj, down_proj, their biases where it has them) so that state dicts
    keep their keys; each expert's MLP is computed as the original computes it (its gate included)."""

    def __init__(self, original: nn.Module, group: dist.ProcessGroup, rank: int, size: int) -> None:
        super().__init__()
        layout = experts_layout(original)
        assert layout is not None  # shard_experts picked experts containers only
        self.layout = layout
        up = original.get_parameter(layout.up)
        self.total = up.shape[0]
        self.local = self.total // size
        self.first = rank * self.local
        self.group, self.size = group, size
        for name in layout.names():
            p = original.get_parameter(name)
            self.register_parameter(name, nn.Parameter(torch.empty(self.local, *p.shape[1:], dtype=p.dtype,
                                                                   device=p.device)))
        act = getattr(original, "act_fn", None)
        if callable(act):
            self.act_fn = act
        # the original's own gate (gpt-oss's clamped SwiGLU reads its alpha and limit), bound to
        # a plain copy of its settings: the parameters stay this module's share only
        gate = getattr(type(original), "_apply_gate", None)
        if callable(gate):
            settings = SimpleNamespace(**{k: v for k, v in vars(original).items() if not k.startswith("_")})
            settings.act_fn = act
            self._apply_gate = partial(gate, settings)

    def forward(self, tokens: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # routed copies grouped by expert, so by owning rank
        rows = order // k
        counts = torch.bincount(flat, minlength=self.total)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)  # [source rank, local expert]
        send = counts.view(self.size, self.local).sum(1).tolist()
        recv_counts = got.view(self.size, self.local)
        recv = recv_counts.sum(1).tolist()
        x = tokens[rows]
        received = dfn.all_to_all_single(x.new_empty(sum(recv), x.shape[-1]), x, recv, send, group=self.group)
        expert = torch.arange(self.local, device=tokens.device).repeat(self.size).repeat_interleave(recv_counts.reshape(-1))
        out = torch.zeros_like(received)
        weights = [self.get_parameter(name) for name in self.layout.names()]
        for e in range(self.local):
            at = torch.where(expert == e)[0]
            y = expert_ffn(self, self.layout, received[at], *(w[e] for w in weights))
            out = out.index_copy(0, at, y)
        back = dfn.all_to_all_single(out.new_empty(x.shape), out, send, recv, group=self.group)
        scale = top_k_weights.reshape(-1)[order]
        return torch.zeros_like(tokens).index_add(0, rows, back * scale[:, None])


def shard_experts(model: nn.Module, group: dist.ProcessGroup, rank: int, size: int) -> list[str]:
    """Replace every experts container of `model` by this rank's share; the FQNs replaced."""
    found = [name for name, m in model.named_modules() if is_experts(m)]
    for name in found:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        original = owner.get_submodule(attr)
        layout = experts_layout(original)
        assert layout is not None  # found above
        experts = original.get_parameter(layout.up).shape[0]
        if experts % size:
            raise ValueError(f"{name}: {experts} experts do not split over {size} ranks")
        owner.register_module(attr, ExpertParallelExperts(original, group, rank, size))
    return found


def expert_rows(module: nn.Module) -> dict[str, tuple[int, int]]:
    """Per expert parameter FQN of `module`, the rows of the full stacked tensor this rank holds."""
    out: dict[str, tuple[int, int]] = {}
    for name, m in module.named_modules():
        if isinstance(m, ExpertParallelExperts):
            for p in m.layout.names():
                out[f"{name}.{p}" if name else p] = (m.first, m.first + m.local)
    return out
