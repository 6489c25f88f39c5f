"""Interleaved 1F1B (Megatron-LM's virtual pipeline stages): which layers each device holds, what
its chunks send, and how a stage search's answer maps onto the model's layers.

With p stages and v virtual stages the block stack is cut into p x v chunks in model order and
chunk c runs on pp rank c % p, so a micro-batch's forward visits every device v times (Narayanan
et al., SC21; torch's ScheduleInterleaved1F1B). Layers of a stack are identical and cost alike
wherever they sit, so a device is priced by the layers it holds: a plan's split is a layer count
per device, each a multiple of v, and each device's layers form v equal chunks - what the
schedule's price assumes (evaluate.py `stage_weights`: every chunk 1/v of its stage). With v = 1
this is the plain pipeline: one chunk per device, consecutive layers.

The stage search (pipeline.py) cuts the layers into consecutive runs per device ("slots"); a
device's slots are its layers in model order (`to_model_order`), which changes no price: the
slot layers and the model layers of a device carry the same configurations and the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from search.algorithm.chain import Chain, recompute_var

MAX_VIRTUAL_STAGES = 4  # the search offers v = 2 .. 4: each v multiplies the stage-to-stage transfers


def chunk_layers(split: Sequence[int], v: int = 1) -> list[tuple[int, int]]:
    """[first, end) of every chunk in model order: device s's split[s] layers as v chunks of
    split[s] / v layers, chunk c on device c % p."""
    p = len(split)
    if any(k % v or k < v for k in split):
        raise ValueError(f"layers per device {tuple(split)} do not cut into {v} chunks of one layer or more each")
    out, first = [], 0
    for c in range(p * v):
        k = split[c % p] // v
        out.append((first, first + k))
        first += k
    return out


def device_layers(split: Sequence[int], v: int = 1) -> list[list[int]]:
    """Per device, the indices of the layers it holds, in model order."""
    p = len(split)
    out: list[list[int]] = [[] for _ in range(p)]
    for c, (first, end) in enumerate(chunk_layers(split, v)):
        out[c % p].extend(range(first, end))
    return out


def sends(stage: int, stages: int, v: int = 1) -> int:
    """The chunk boundaries stage `stage` sends one micro-batch's activation across (and takes
    its gradient back over): one per chunk it holds, but the model's last chunk ends the model."""
    return v if stage < stages - 1 else v - 1


def rank_p2p(stages: int, v: int, micro_batches: int) -> list[int]:
    """Per pp rank, the point-to-point sends of one step (as many receives): each micro-batch's
    activation over its own chunks' boundaries forward, and the gradient back over the
    boundaries into its chunks (those the previous rank sends across)."""
    return [micro_batches * (sends(s, stages, v) + sends((s - 1) % stages, stages, v)) for s in range(stages)]


def fits(k: int, v: int) -> bool:
    """Whether a device may hold k layers under v virtual stages."""
    return k >= v and k % v == 0


def to_model_order(assigns: dict[str, np.ndarray], chain: Chain, splits: Sequence[Sequence[int]], v: int
                   ) -> dict[str, np.ndarray]:
    """Per-layer choices read back in slot order (device s holding the consecutive layers after
    the previous devices') moved to the layers each device holds (`device_layers`); row i of
    every array follows split i. Layer 0 stays first on device 0 and the last layer last on the
    last device, so the ops around the stack keep their neighbours."""
    if v == 1:
        return assigns
    out = {k: a.copy() for k, a in assigns.items()}
    layers = chain.layers
    for row, split in enumerate(splits):
        slots = [i for s in range(len(split)) for i in range(sum(split[:s]), sum(split[:s + 1]))]
        model = [i for held in device_layers(split, v) for i in held]
        for slot, layer in zip(slots, model, strict=True):
            if slot == layer:
                continue
            for a, b in zip(layers[slot], layers[layer], strict=True):
                out[b][row] = assigns[a][row]
            if recompute_var(slot) in assigns:
                out[recompute_var(layer)][row] = assigns[recompute_var(slot)][row]
    return out
