"""PipeDream-2BW's double-buffered weights (Narayanan et al., ICML 2021, "Memory-Efficient
Pipeline-Parallel DNN Training"): each stage keeps two versions of its weights, and the forward
and backward of every micro-batch of iteration t use the version from one update ago, W(t - 1).
The gradients of the m micro-batches are accumulated and applied once, to the newest version:

    W(t + 1) = W(t) - lr * grad f(W(t - 1))      (with AdamW: the optimizer applied to W(t))

The module's own parameters are the version the passes read; `newest` holds W(t) and is what
the optimizer updates. After an iteration's passes: the gradients move to `newest` (no copy),
the module's parameters take W(t) for the next iteration, and the optimizer makes W(t + 1). Two
versions per stage, as the plan prices them (search/prices/schedule.py `weight_copies`).
"""

from __future__ import annotations

import torch
from torch import nn


class TwoVersions:
    def __init__(self, params: list[nn.Parameter]) -> None:
        self.used = [p for p in params if p.requires_grad]  # W(t - 1): what the forward reads
        self.newest = [nn.Parameter(p.detach().clone()) for p in self.used]  # W(t); W(0) = W(-1) at the start

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates."""
        return self.newest

    def step(self, opt: torch.optim.Optimizer) -> None:
        """Apply this iteration's gradients (computed at W(t - 1)) to W(t); the passes of the next
        iteration read W(t)."""
        with torch.no_grad():
            for used, newest in zip(self.used, self.newest, strict=True):
                newest.grad, used.grad = used.grad, None
                used.copy_(newest)
        opt.step()
