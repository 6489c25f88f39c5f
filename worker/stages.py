"""Pipeline stages built from the model's own submodules.

A stage holds the zoo model's own modules under their own names (``tok_emb``, ``blocks.3``, ...),
so parameter FQNs, the Plan's module names and the recompute list mean the same inside a stage
as in the whole model. The tracer front end (``torch.distributed.pipelining.pipeline``) is not
used: it silently drops activation checkpointing (docs/cli.md, Running a plan).

What runs before and after the block stack is model-specific, so each zoo family that can be
pipelined says it here; the block stack itself is the model's ``blocks_attr`` list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from search.models import zoo


@dataclass(frozen=True)
class Split:
    """The parts of a model around its block stack: attribute names and how they run."""

    pre: tuple[str, ...]
    post: tuple[str, ...]
    run_pre: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    run_post: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # returns logits
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# The stage holds the family's modules and parameters under their zoo names; they are read with
# get_submodule and _tensor, which say what they return (a Module attribute may be either).
def _tensor(m: nn.Module, name: str) -> torch.Tensor:
    t = getattr(m, name)  # not get_parameter: a wrapper (FSDP, DTensor) may hold a plain tensor here
    assert isinstance(t, torch.Tensor), f"{name} is a {type(t).__name__}"
    return t


def _gpt_pre(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1], device=ids.device)
    return m.get_submodule("tok_emb")(ids) + m.get_submodule("pos_emb")(pos)


def _llama_pre(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return m.get_submodule("tok_emb")(ids)


def _bert_pre(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1], device=ids.device)
    h = m.get_submodule("tok_emb")(ids) + m.get_submodule("pos_emb")(pos) + m.get_submodule("type_emb")(torch.zeros_like(ids))
    return m.get_submodule("emb_norm")(h)


def _vit_pre(m: nn.Module, images: torch.Tensor) -> torch.Tensor:
    x = m.get_submodule("patch_emb")(images).flatten(2).transpose(1, 2)
    cls = _tensor(m, "cls_token").expand(x.shape[0], -1, -1)
    return torch.cat((cls, x), dim=1) + _tensor(m, "pos_emb")


def _lm_post(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.get_submodule("lm_head")(m.get_submodule("norm")(h))


def _bert_post(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.get_submodule("lm_head")(m.get_submodule("head_norm")(F.gelu(m.get_submodule("head_dense")(h))))


def _vit_post(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return m.get_submodule("head")(m.get_submodule("norm")(h)[:, 0])


def _vision_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


# Each entry mirrors the forward of the zoo class it names (search/models/zoo.py); the faithfulness
# tests compare a pipelined run against that forward, so a drift between the two shows there.
SPLITS: dict[type, Split] = {
    zoo.GPT: Split(("tok_emb", "pos_emb"), ("norm", "lm_head"), _gpt_pre, _lm_post, zoo._lm_loss),
    zoo.Llama: Split(("tok_emb",), ("norm", "lm_head"), _llama_pre, _lm_post, zoo._lm_loss),
    zoo.Bert: Split(("tok_emb", "pos_emb", "type_emb", "emb_norm"), ("head_dense", "head_norm", "lm_head"),
                    _bert_pre, _bert_post, zoo._lm_loss),
    zoo.ViT: Split(("patch_emb", "cls_token", "pos_emb"), ("norm", "head"), _vit_pre, _vit_post, _vision_loss),
}


def split_of(model: nn.Module) -> Split | None:
    return SPLITS.get(type(model))


class StageModule(nn.Module):
    """One pipeline stage: the model's modules for layers [first, end) of the block stack, plus
    the modules before the stack on the first stage and after it on the last."""

    def __init__(self, model: nn.Module, blocks_attr: str, first: int, end: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        split = split_of(model)
        if split is None:
            raise ValueError(f"{type(model).__name__} has no pipeline split")
        self._split = split
        self.is_first, self.is_last = is_first, is_last
        for name in (split.pre if is_first else ()) + (split.post if is_last else ()):
            setattr(self, name, getattr(model, name))
        stack = model.get_submodule(blocks_attr)
        assert isinstance(stack, nn.ModuleList)  # a zoo model's blocks_attr names its ModuleList of layers
        # a ModuleDict keyed by the layer's index keeps FQNs such as 'blocks.3.attn.q'
        self.blocks_attr = blocks_attr
        self.add_module(blocks_attr, nn.ModuleDict({str(i): stack[i] for i in range(first, end)}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self._split.run_pre(self, x)
        blocks = self.get_submodule(self.blocks_attr)
        assert isinstance(blocks, nn.ModuleDict)  # made so in __init__
        for block in blocks.values():
            x = block(x)
        if self.is_last:
            x = self._split.run_post(self, x)
        return x


@dataclass(frozen=True)
class Pipe:
    """How a model is cut into pipeline stages: `units` layers in model order (one block stack, or
    an encoder-decoder's two), a stage over units [first, end), the loss of the last stage's
    output, what the first stage is fed from (inputs, targets), and the tensors crossing the cut
    after unit b (each: whether a gradient comes back for it)."""

    units: int
    stage: Callable[[int, int, bool, bool], nn.Module]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    first_args: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
    crossing: Callable[[int], tuple[bool, ...]]


def _inputs_only(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (inputs,)


def _inputs_and_targets(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (inputs, targets)


def _one_activation(b: int) -> tuple[bool, ...]:
    return (True,)


def pipe_of(model: nn.Module, spec: zoo.ModelSpec) -> Pipe:
    """The model's pipeline cut; hfstages.NoPipeline (a ValueError) says why there is none."""
    from worker import hfstages

    split = split_of(model)
    if split is not None and spec.blocks_attr is not None:
        blocks = spec.blocks_attr
        stack = model.get_submodule(blocks)
        assert isinstance(stack, nn.ModuleList)  # a zoo model's blocks_attr names its ModuleList of layers
        return Pipe(len(stack), lambda a, b, first, last: StageModule(model, blocks, a, b, first, last), split.loss,
                    _inputs_only, _one_activation)
    if spec.kind == "seq2seq" and len(spec.stacks) == 2:
        family = hfstages.seq2seq_family(model)
        stacks = (spec.stacks[0], spec.stacks[1])
        lists = [model.get_submodule(s) for s in stacks]
        assert all(isinstance(m, nn.ModuleList) for m in lists)  # find_stacks picks ModuleLists only
        n = sum(len(m) for m in lists if isinstance(m, nn.ModuleList))
        probe = hfstages.Seq2SeqStage(model, family, stacks, 0, n, True, True)

        def crossing(b: int) -> tuple[bool, ...]:  # every float tensor has a gradient, the decoder ids none
            return tuple(name != "dec_ids" for name in probe.names(b))

        return Pipe(n, lambda a, b, first, last: hfstages.Seq2SeqStage(model, family, stacks, a, b, first, last),
                    hfstages.seq2seq_loss, _inputs_and_targets, crossing)
    if spec.family == "hf" and spec.blocks_attr is not None:
        layout = hfstages.model_layout(model, spec.blocks_attr, spec.kind)
        return Pipe(layout.n, lambda a, b, first, last: hfstages.ModelStage(model, layout, a, b, first, last),
                    _vision_loss if spec.kind == "vision" else zoo._lm_loss, _inputs_only, _one_activation)
    raise hfstages.NoPipeline(f"model {spec.name!r} has no pipeline split (block stack and the modules around it)")


def pipe_p2p(pipe: Pipe, stage_layers: list[list[int]], stages: int, micro_batches: int) -> tuple[list[int], list[int]]:
    """Per pp rank, the point-to-point sends and receives of one step: per micro-batch, every
    tensor crossing a chunk boundary forward, and the gradient of each that has one back."""
    sends, recvs = [0] * stages, [0] * stages
    for c in range(len(stage_layers) - 1):
        crossing = pipe.crossing(stage_layers[c][1])
        here, there = c % stages, (c + 1) % stages
        fwd, bwd = micro_batches * len(crossing), micro_batches * sum(crossing)
        sends[here] += fwd
        recvs[there] += fwd
        sends[there] += bwd
        recvs[here] += bwd
    return sends, recvs
