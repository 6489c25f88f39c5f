"""Synthetic training data: the same global batch on every rank, split the way the plan splits it.

Step s draws the whole global batch from a generator seeded by (seed, s), on the CPU, so a
single-process reference and every rank of any plan see the same samples; a rank keeps the
slice of its data-parallel coordinate (DTensor's Shard(0) order: contiguous chunks).
"""

from __future__ import annotations

import torch

from search.models.zoo import ModelSpec


def global_batch(spec: ModelSpec, step: int, batch: int, seq_len: int | None, seed: int) -> tuple[torch.Tensor, ...]:
    return spec.example_inputs(batch, seq_len, device="cpu", seed=seed * 1_000_003 + step)


def local_batch(tensors: tuple[torch.Tensor, ...], index: int, count: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """The `index`-th of `count` equal chunks along the batch dimension."""
    return tuple(t.chunk(count, dim=0)[index].to(device) for t in tensors)
