"""Activation checkpointing of a periodic stack by period.

The search prices a periodic stack (Jamba's 8 layers, Qwen3-Next's and Llama-4's 4; see
search/models/capture.py) one period as one block layer, and a recomputed one as holding its
input alone. Checkpointing each of the period's module layers would hold p layer inputs; so a
recomputed period is one non-reentrant checkpoint over its p layers instead. The model's own loop
calls the layers one by one (with per-layer arguments: Jamba's Mamba and attention masks), so the
checkpoint cannot wrap one callable: hooks open it before the first layer's forward and close it
after the last's (as torch's composable `checkpoint` does for one module), and the backward replays
the p layers from the period's input, each with the arguments the model gave it, the previous
layer's output replaced by the replay's.
"""

from __future__ import annotations

from collections.abc import Generator
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator, noop_context_fn


class _Prev:
    """Where a layer's argument is leaf `index` of the previous layer's output."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


# per layer after the first: its (args, kwargs) as leaves, the previous layer's outputs marked
_Call = tuple[list[Any], Any]


def _marked(args: tuple[Any, ...], kwargs: dict[str, Any], prev: Any, where: str) -> _Call:
    """The layer's arguments with every tensor that is one of the previous layer's outputs marked
    (not held: holding it is what a period's checkpoint saves)."""
    out_leaves, _ = tree_flatten(prev)
    index = {id(t): i for i, t in enumerate(out_leaves) if isinstance(t, torch.Tensor)}
    leaves, spec = tree_flatten((args, kwargs))
    marked = [_Prev(index[id(x)]) if isinstance(x, torch.Tensor) and id(x) in index else x for x in leaves]
    if not any(isinstance(x, _Prev) for x in marked):
        raise RuntimeError(f"{where}: the layer's input is not the previous layer's output (the model transforms "
                           f"it between layers), so its period cannot be replayed from the period's input")
    return marked, spec


def _filled(call: _Call, prev: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    marked, spec = call
    out_leaves, _ = tree_flatten(prev)
    args, kwargs = tree_unflatten([out_leaves[x.index] if isinstance(x, _Prev) else x for x in marked], spec)
    return args, kwargs


class PeriodCheckpoint:
    """One recomputed period of p consecutive module layers, checkpointed as one unit."""

    def __init__(self, layers: list[nn.Module], name: str) -> None:
        self.layers = layers
        self.name = name
        self._replaying = False
        self._gen: Generator[None, None, None] | None = None
        self._calls: list[_Call] = []
        self._prev: Any = None  # the last layer's output, until the next layer has read it
        last = len(layers) - 1
        for j, layer in enumerate(layers):
            # not prepended: data parallelism's pre-hooks, registered later with prepend, run before
            # this one, and its post-hooks after (outside the checkpoint, as for a wrapped block)
            layer.register_forward_pre_hook(partial(self._pre, j), with_kwargs=True)
            layer.register_forward_hook(partial(self._post, j, j == last), prepend=True, always_call=True)

    def _pre(self, j: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._replaying or not torch.is_grad_enabled():
            return
        if j == 0:
            calls: list[_Call] = []
            self._calls = calls
            self._gen = _checkpoint_without_reentrant_generator(partial(self._replay, calls), True, noop_context_fn,
                                                                "default", False, True, *args, **kwargs)
            next(self._gen)
        elif self._gen is not None:
            self._calls.append(_marked(args, kwargs, self._prev, f"{self.name}, layer {j}"))
        self._prev = None

    def _post(self, j: int, last: bool, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._replaying or self._gen is None:
            return
        if not last:
            self._prev = output
            return
        gen, self._gen, self._calls, self._prev = self._gen, None, [], None
        try:
            next(gen)
        except StopIteration:
            return
        raise RuntimeError(f"{self.name}: the checkpoint of the period did not close after its last layer")

    def _replay(self, calls: list[_Call], *args: Any, **kwargs: Any) -> Any:
        """The period's forward again, inside the backward: its layers one after the other."""
        self._replaying = True
        try:
            out = self.layers[0](*args, **kwargs)
            for layer, call in zip(self.layers[1:], calls, strict=True):
                a, k = _filled(call, out)
                out = layer(*a, **k)
            return out
        finally:
            self._replaying = False
