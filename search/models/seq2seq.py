"""Encoder-decoder models (T5, BART): how they are built, fed and captured.

An encoder-decoder transformer has two block stacks, two *block families*: the encoder's layers
(self-attention, MLP) and the decoder's (causal self-attention, cross-attention, MLP). The
encoder's output is a *side input* of the decoder stack: every decoder layer's cross-attention
projects it to keys and values, so the graph has an edge from the encoder's last op into every
decoder layer (a cross-attention edge). Capture records the two stacks as two `BlockInfo`s,
encoder first (`OpGraph.blocks`); the search reads `blocks[0]` as the stack it reuses and
recomputes layer by layer, and prices the decoder layers op by op, each of them reading the
encoder output's layout (search/algorithm/stacks.py).

T5 computes its relative position bias once per stack, in layer 0, and every layer reads it:
those ops of layer 0 have no counterpart in the other layers, so they are left out of the stack
(they are ops of their own before it), and the bias is a second side input of each layer.

The training step is teacher forcing: the decoder reads the targets shifted right by one (the
decoder start token first) and the loss is the token cross entropy against the targets, so a
model takes `(input_ids, targets)` as the zoo's language models do.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search.models.graph import BlockInfo, OpGraph

SEQ2SEQ_KIND = "seq2seq"

class Seq2SeqLM(nn.Module):
    """A HuggingFace ``...ForConditionalGeneration`` trained by teacher forcing:
    ``forward(input_ids, targets)`` returns the mean token cross entropy."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        start = getattr(config, "decoder_start_token_id", None)
        pad = getattr(config, "pad_token_id", None)
        self.start_token = int(start if start is not None else pad if pad is not None else 0)

    def init_weights(self) -> None:
        """Re-run HF's own initialisation (after ``to_empty``)."""
        init = getattr(self.model, "init_weights", None)
        if callable(init):
            init()

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        decoder_ids = shift_right(targets, self.start_token)
        logits = self.model(input_ids=input_ids, decoder_input_ids=decoder_ids, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def shift_right(targets: torch.Tensor, start: int) -> torch.Tensor:
    """The decoder's inputs under teacher forcing: the start token, then the targets but the last."""
    first = torch.full_like(targets[:, :1], start)
    return torch.cat([first, targets[:, :-1]], dim=1)


def build_hf_seq2seq(config: object) -> Seq2SeqLM:
    """The HF encoder-decoder for `config`, with random weights, on the current default device."""
    from transformers import AutoModelForSeq2SeqLM

    try:
        model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="sdpa")
    except ValueError:  # architecture without an SDPA attention path (see zoo._hf_build)
        model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager")
    return Seq2SeqLM(model)


def find_stacks(model: nn.Module) -> tuple[str, str] | None:
    """Dotted paths of the encoder's and the decoder's layer lists: per side, the largest
    ``nn.ModuleList`` of one class under a module path that names it (``encoder`` / ``decoder``)."""
    best: dict[str, tuple[tuple[int, int], str]] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0 or len({type(c) for c in mod}) != 1:
            continue
        parts = name.split(".")
        side = "decoder" if "decoder" in parts else "encoder" if "encoder" in parts else None
        if side is None:
            continue
        key = (len(mod), sum(p.numel() for p in mod.parameters()))
        if side not in best or key > best[side][0]:
            best[side] = (key, name)
    if "encoder" not in best or "decoder" not in best:
        return None
    return best["encoder"][1], best["decoder"][1]


def _layer_of(op_module: str, op_name: str, prefix: str) -> int | None:
    m = re.match(re.escape(prefix) + r"\.(\d+)(?:[.:#]|$)", op_module or op_name)
    return int(m.group(1)) if m else None


def stack_info(graph: OpGraph, prefix: str, n: int) -> BlockInfo | None:
    """The stack of `n` layers under `prefix`, layer 0's ops without a counterpart in layer 1
    (T5's relative position bias, computed once and read by every layer) left out; None when the
    layers differ otherwise (then the graph is searched without this stack)."""
    layers: list[list[str]] = [[] for _ in range(n)]
    for op in graph.ops:
        i = _layer_of(op.module, op.name, prefix)
        if i is not None and i < n:
            layers[i].append(op.name)
    if n >= 2:
        pat = re.compile(r"(^|(?<=[/:]))" + re.escape(f"{prefix}.0") + r"(?=[.:/#]|$)")
        second = set(layers[1])
        own = [name for name in layers[0] if pat.sub(f"{prefix}.1", name) in second]
        if len(own) == len(layers[1]):
            layers[0] = own
    if any(not layer or len(layer) != len(layers[0]) for layer in layers):
        return None
    return BlockInfo(prefix=prefix, layers=tuple(tuple(layer) for layer in layers))


def annotate_stacks(graph: OpGraph, stacks: tuple[str, ...], sizes: tuple[int, ...]) -> OpGraph:
    """`graph` with its block families, in the order given (the encoder's first)."""
    blocks = []
    for prefix, n in zip(stacks, sizes, strict=True):
        info = stack_info(graph, prefix, n)
        if info is not None:
            blocks.append(info)
    return OpGraph(name=graph.name, ops=graph.ops, blocks=tuple(blocks), batch_label=graph.batch_label,
                   meta=graph.meta)


def is_encoder_decoder(graph: OpGraph) -> bool:
    """Two block families, the second reading the first's output: an encoder-decoder graph."""
    return len(graph.blocks) >= 2
