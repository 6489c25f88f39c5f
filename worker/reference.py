"""The single-process reference run a distributed run must reproduce (the faithfulness check).

Same model initialisation (worker.executor.reference_model), same synthetic global batch per step
(worker.data), same optimizer, whole batch in one process, fp32.
"""

from __future__ import annotations

import torch

from worker.analyze import model_spec
from worker.data import global_batch
from worker.executor import reference_model


def reference_losses(model: str, steps: int, global_batch_size: int, seq_len: int | None, *, seed: int = 0,
                     lr: float = 1e-3, shards: int = 1) -> list[float]:
    """Per-step losses of the single-process run. `shards` > 1 runs the batch as that many
    equal chunks and averages (gradient accumulation): the semantics of data parallelism for a
    model whose BatchNorm normalises each shard by its own statistics."""
    spec = model_spec(model)
    m = reference_model(model, seed)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, foreach=False)
    out = []
    for s in range(steps):
        inputs, targets = global_batch(spec, s, global_batch_size, seq_len, seed)
        total = 0.0
        for x, y in zip(inputs.chunk(shards), targets.chunk(shards), strict=True):
            loss = m(x, y) / shards
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total)
    return out
