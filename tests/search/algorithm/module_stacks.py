"""A small model whose block stack is a sequence of module layers of given kinds (a letter
each), captured as the HF families are (`capture_with_blocks`): the periodic and two-run stacks
of test_periodic_exact.py and the repeated sub-layers of test_segments_exact.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from search.models.capture import capture_with_blocks
from search.models.graph import OpGraph

DIM, BATCH = 16, 8


class _Stack(nn.Module):
    def __init__(self, kinds: str, layers: Mapping[str, Callable[[], nn.Module]]) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM, bias=False)
        self.layers = nn.ModuleList([layers[k]() for k in kinds])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return (h * h).mean()


def stack_graph(kinds: str, layers: Mapping[str, Callable[[], nn.Module]]) -> OpGraph:
    """The captured graph of an input Linear, then one module layer per letter of `kinds`
    (`layers[letter]()`), then a mean-square loss; batch BATCH, width DIM."""
    with torch.device("meta"):
        m = _Stack(kinds, layers)
        x = torch.empty(BATCH, DIM)
    return capture_with_blocks(m, (x,), "layers", name=kinds, input_labels=[["batch", "h"]])
