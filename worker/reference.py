"""The single-process reference run a distributed run must reproduce (the faithfulness check).

Same model initialisation (worker.executor.reference_model), same synthetic global batch per step
(worker.data), same optimizer, whole batch in one process, fp32.
"""

from __future__ import annotations

import torch

from search.models.source import ModelSource
from worker.analyze import model_spec
from worker.data import global_batch
from worker.executor import reference_model


def reference_losses(model: str, steps: int, global_batch_size: int, seq_len: int | None, *, seed: int = 0,
                     lr: float = 1e-3, shards: int = 1, stale: bool = False,
                     source: ModelSource | None = None) -> list[float]:
    """Per-step losses of the single-process run. `shards` > 1 runs the batch as that many
    equal chunks and averages (gradient accumulation): the semantics of data parallelism for a
    model whose BatchNorm normalises each shard by its own statistics. `stale`: PipeDream-2BW's
    update rule, W(t + 1) = W(t) - lr * grad f(W(t - 1)): the model holds the newest weights
    W(t) and the optimizer updates them, but each step's forward and backward run on the
    weights of the step before (W(-1) = W(0)). `source`: how to rebuild a model the zoo lacks (the
    plan's)."""
    spec = model_spec(model, source)
    m = reference_model(model, seed)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, foreach=False)
    before = _weights(m)  # W(t - 1)
    out = []
    for s in range(steps):
        inputs, targets = global_batch(spec, s, global_batch_size, seq_len, seed)
        now = _weights(m)  # W(t)
        if stale:
            _load(m, before)
        total = 0.0
        for x, y in zip(inputs.chunk(shards), targets.chunk(shards), strict=True):
            loss = m(x, y) / shards
            loss.backward()
            total += float(loss.detach())
        if stale:
            _load(m, now)  # the gradients stay: they update W(t)
        opt.step()
        opt.zero_grad(set_to_none=True)
        before = now
        out.append(total)
    return out


def _weights(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


@torch.no_grad()
def _load(m: torch.nn.Module, weights: list[torch.Tensor]) -> None:
    for p, w in zip(m.parameters(), weights, strict=True):
        p.copy_(w)
