"""Pipeline stages of HuggingFace models: encoder-decoders (T5, BART) and Llama-style decoders.

A stage holds the model's own modules under their own dotted paths (``model.encoder.block.3``,
``model.model.embed_tokens``), so parameter FQNs, the Plan's module names, the tensor-parallel
styles and the recompute list mean the same inside a stage as in the whole model (as
worker/stages.py does for the zoo's classes). Its forward restates the forward of the
transformers classes it holds, for the layers it holds: masks, positions and rotary tables are
recomputed on every stage from the hidden states' shape, as the model's own forward computes them
from its inputs (the training step passes no attention mask: no padding), so nothing but
activations crosses a cut.

Units are the layers of the model's stacks in order (an encoder-decoder's: the encoder's, then the
decoder's, as search/algorithm/stacks.py cuts them). The modules outside the layers sit where the
search puts them: the embedding with the first unit, the encoder's final norm with the last
encoder layer, the decoder's embedding with the first decoder layer, the decoder's final norm and
the LM head with the last unit.

What crosses a cut is a tuple of tensors (torch.distributed.pipelining passes several): inside the
encoder, its hidden states (and T5's position bias, which encoder layer 0 computes and every layer
reads) and the decoder's input ids (the targets shifted right: torch's schedule feeds the first
stage only, so they travel with the activations; integers, no gradient); after the encoder, its
output (every decoder layer's cross-attention reads it) and the decoder's hidden states (and T5's
decoder position bias).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search.models.pipelines import DECODER_PIPELINES, decoder_refusal, seq2seq_refusal
from search.models.seq2seq import Seq2SeqLM, shift_right


class NoPipeline(ValueError):
    """The model has no pipeline stages the executor can build; the message says why."""


# ---- holding a model's modules under their own paths ------------------------------------------
def _container(root: nn.Module, path: str) -> nn.Module:
    """The module at `path` in `root`, made of empty containers where missing."""
    at = root
    for part in [p for p in path.split(".") if p]:
        nxt = at._modules.get(part)
        if nxt is None:
            nxt = nn.Module()
            at.add_module(part, nxt)
        at = nxt
    return at


def hold(root: nn.Module, model: nn.Module, path: str) -> None:
    """Register `model`'s submodule at `path` under the same path in `root`."""
    parent, _, leaf = path.rpartition(".")
    _container(root, parent).add_module(leaf, model.get_submodule(path))


def hold_layers(root: nn.Module, model: nn.Module, path: str, first: int, end: int) -> None:
    """Layers [first, end) of the ModuleList at `path`, keyed by their index (FQNs such as
    'model.encoder.block.3.layer.0.SelfAttention.q.weight' as in the whole model)."""
    stack = model.get_submodule(path)
    assert isinstance(stack, nn.ModuleList)  # find_stacks / find_blocks_attr pick ModuleLists only
    parent, _, leaf = path.rpartition(".")
    _container(root, parent).add_module(leaf, nn.ModuleDict({str(i): stack[i] for i in range(first, end)}))


def hold_buffer(root: nn.Module, model: nn.Module, path: str) -> None:
    parent, _, leaf = path.rpartition(".")
    _container(root, parent).register_buffer(leaf, model.get_buffer(path))


def _pass(t: torch.Tensor) -> torch.Tensor:
    """A tensor a stage sends on as it received it: an alias, so that the stage's backward
    treats it as an output computed from its input (not the received leaf itself)."""
    return t.view_as(t)


class _HFStage(nn.Module):
    """One stage over units [first, end). `names(b)`: the tensors crossing the cut after unit b."""

    def __init__(self, first: int, end: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.first, self.end = first, end
        self.is_first, self.is_last = is_first, is_last

    def names(self, b: int) -> tuple[str, ...]:
        raise NotImplementedError

    def start(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def unit(self, u: int, st: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def forward(self, *xs: torch.Tensor) -> Any:
        if self.is_first:
            st = self.start(*xs)
        else:
            names = self.names(self.first)
            assert len(xs) == len(names), f"stage over units {self.first}-{self.end} got {len(xs)} tensors"
            st = dict(zip(names, xs, strict=True))
        received = {id(t) for t in st.values()}
        for u in range(self.first, self.end):
            self.unit(u, st)
        if self.is_last:
            return st["logits"]
        # contiguous: the receiver allocates its buffer with the sent tensor's strides, and gloo
        # receives into contiguous buffers only (T5's position bias is a permuted view)
        return tuple(_pass(st[k]) if id(st[k]) in received else st[k].contiguous() for k in self.names(self.end))


# ---- encoder-decoders ---------------------------------------------------------------------------
def _masks() -> Any:
    from transformers import masking_utils

    return masking_utils


class Seq2SeqStage(_HFStage):
    """A stage of a T5 or BART ``...ForConditionalGeneration`` inside a Seq2SeqLM (seq2seq.py),
    its forward that of T5Stack / BartEncoder / BartDecoder and the LM head, layer by layer."""

    def __init__(self, model: nn.Module, family: str, stacks: tuple[str, str], first: int, end: int,
                 is_first: bool, is_last: bool) -> None:
        super().__init__(first, end, is_first, is_last)
        self.family = family
        self.stacks = stacks
        enc_stack, dec_stack = (model.get_submodule(s) for s in stacks)
        assert isinstance(enc_stack, nn.ModuleList) and isinstance(dec_stack, nn.ModuleList)
        self.n_enc, self.n_dec = len(enc_stack), len(dec_stack)
        self.enc_path, self.dec_path = (s.rpartition(".")[0] for s in stacks)  # the stack modules
        enc, dec = model.get_submodule(self.enc_path), model.get_submodule(self.dec_path)
        # plain attributes (not modules): what the stacks' forwards read besides their submodules
        self.enc_config: Any = enc.config
        self.dec_config: Any = dec.config
        self.enc_dropout = float(getattr(enc, "dropout", 0.0)) if family == "bart" else 0.0
        self.dec_dropout = float(getattr(dec, "dropout", 0.0)) if family == "bart" else 0.0
        assert isinstance(model, Seq2SeqLM)  # pipe_of builds these stages for a seq2seq spec only
        top: Any = model.get_submodule("model").config  # the ...ForConditionalGeneration's config
        self.start_token = model.start_token
        self.vocab: int = top.vocab_size
        self.scale = float(top.d_model) ** -0.5 if family == "t5" and getattr(top, "scale_decoder_outputs", False) else None
        n = self.n_enc + self.n_dec
        e0, e1 = min(first, self.n_enc), min(end, self.n_enc)
        d0, d1 = max(first, self.n_enc) - self.n_enc, max(end, self.n_enc) - self.n_enc
        pre = {"t5": ("embed_tokens", "dropout"), "bart": ("embed_tokens", "embed_positions", "layernorm_embedding")}
        post = {"t5": ("final_layer_norm", "dropout"), "bart": ()}
        if first == 0:
            for m in pre[family]:
                hold(self, model, f"{self.enc_path}.{m}")
        if e1 > e0:
            hold_layers(self, model, stacks[0], e0, e1)
        if first < self.n_enc <= end:
            for m in post[family]:
                hold(self, model, f"{self.enc_path}.{m}")
        if first <= self.n_enc < end:
            for m in pre[family]:
                hold(self, model, f"{self.dec_path}.{m}")
        if d1 > d0:
            hold_layers(self, model, stacks[1], d0, d1)
        self.head = "model"  # the Seq2SeqLM's ...ForConditionalGeneration, which holds the LM head
        if end == n:
            for m in post[family]:
                hold(self, model, f"{self.dec_path}.{m}")
            hold(self, model, f"{self.head}.lm_head")
            if family == "bart":
                hold_buffer(self, model, f"{self.head}.final_logits_bias")

    def names(self, b: int) -> tuple[str, ...]:
        t5 = self.family == "t5"
        if b < self.n_enc:
            return ("enc_h",) + (("enc_bias",) if t5 else ()) + ("dec_ids",)
        if b == self.n_enc:
            return ("enc_out", "dec_ids")
        return ("enc_out", "dec_h") + (("dec_bias",) if t5 else ())

    def start(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"ids": inputs, "dec_ids": shift_right(targets, self.start_token)}

    def _m(self, path: str) -> nn.Module:
        return self.get_submodule(path)

    def unit(self, u: int, st: dict[str, torch.Tensor]) -> None:
        if u < self.n_enc:
            self._encoder_layer(u, st)
        else:
            self._decoder_layer(u - self.n_enc, st)
        if u == self.n_enc + self.n_dec - 1:
            self._head(st)

    # T5Stack.forward (encoder) and BartEncoder.forward, one layer
    def _encoder_layer(self, i: int, st: dict[str, torch.Tensor]) -> None:
        e = self.enc_path
        if i == 0:
            emb = self._m(f"{e}.embed_tokens")(st.pop("ids"))
            if self.family == "t5":
                st["enc_h"] = self._m(f"{e}.dropout")(emb)
            else:
                h = emb + self._m(f"{e}.embed_positions")(emb[:, :, -1])
                h = self._m(f"{e}.layernorm_embedding")(h)
                st["enc_h"] = F.dropout(h, p=self.enc_dropout, training=self.training)
        h = st["enc_h"]
        mask = _masks().create_bidirectional_mask(config=self.enc_config, inputs_embeds=h, attention_mask=None)
        layer = self._m(f"{self.stacks[0]}.{i}")
        if self.family == "t5":
            h, bias, _ = layer(h, mask, st.get("enc_bias"), None, None, None, cache=None)
            st["enc_bias"] = bias
        else:
            h = layer(h, mask)
        st["enc_h"] = h
        if i == self.n_enc - 1:
            h = st.pop("enc_h")
            st.pop("enc_bias", None)
            if self.family == "t5":
                h = self._m(f"{e}.dropout")(self._m(f"{e}.final_layer_norm")(h))
            st["enc_out"] = h

    # T5Stack.forward (decoder) and BartDecoder.forward, one layer
    def _decoder_layer(self, i: int, st: dict[str, torch.Tensor]) -> None:
        d = self.dec_path
        if i == 0:
            ids = st.pop("dec_ids")
            if not self.is_first:
                # received: torch's runtime shape inference runs each stage once on uninitialised
                # tensors of the received shapes (torch.empty), where ids index nothing; the
                # targets' ids always lie in the vocabulary, which this leaves as they are
                ids = ids.clamp(0, self.vocab - 1)
            emb = self._m(f"{d}.embed_tokens")(ids)
            if self.family == "t5":
                st["dec_h"] = self._m(f"{d}.dropout")(emb)
            else:
                pos = torch.arange(ids.shape[1], device=emb.device)
                h = emb + self._m(f"{d}.embed_positions")(ids, 0, position_ids=pos).to(emb.device)
                h = self._m(f"{d}.layernorm_embedding")(h)
                st["dec_h"] = F.dropout(h, p=self.dec_dropout, training=self.training)
        h, enc = st["dec_h"], st["enc_out"]
        masks = _masks()
        if self.family == "t5":
            mask = masks.create_causal_mask(config=self.dec_config, inputs_embeds=h, attention_mask=None, cache=None)
        else:  # BartDecoder makes an all-ones padding mask first
            ones = torch.ones(h.shape[0], h.shape[1], device=h.device)
            mask = masks.create_causal_mask(config=self.dec_config, inputs_embeds=h, attention_mask=ones, cache=None)
        cross = masks.create_bidirectional_mask(config=self.dec_config, inputs_embeds=h, attention_mask=None,
                                                encoder_hidden_states=enc)
        layer = self._m(f"{self.stacks[1]}.{i}")
        if self.family == "t5":
            # the cross-attention's position bias is zeros (no relative bias there): each layer
            # that gets None computes the same zeros, so it does not cross a cut
            h, bias, _ = layer(h, mask, st.get("dec_bias"), enc, cross, None, cache=None)
            st["dec_bias"] = bias
        else:
            h = layer(h, mask, enc, encoder_attention_mask=cross, cache=None, use_cache=False)
        st["dec_h"] = h

    # T5ForConditionalGeneration / BartForConditionalGeneration after the decoder
    def _head(self, st: dict[str, torch.Tensor]) -> None:
        h = st.pop("dec_h")
        d = self.dec_path
        if self.family == "t5":
            h = self._m(f"{d}.dropout")(self._m(f"{d}.final_layer_norm")(h))
            if self.scale is not None:
                h = h * self.scale
            st["logits"] = self._m(f"{self.head}.lm_head")(h)
        else:
            logits = self._m(f"{self.head}.lm_head")(h)
            bias = self._m(self.head).get_buffer("final_logits_bias")
            st["logits"] = logits + bias.to(logits.device)


def seq2seq_family(model: nn.Module) -> str:
    """'t5' or 'bart' for a Seq2SeqLM the stages restate; NoPipeline otherwise."""
    inner = getattr(model, "model", None)
    config: Any = getattr(inner, "config", None)
    model_type = str(getattr(config, "model_type", type(inner).__name__))
    refusal = seq2seq_refusal(model_type)
    if refusal is not None:
        raise NoPipeline(refusal)
    drop = [k for k in ("encoder_layerdrop", "decoder_layerdrop") if float(getattr(config, k, 0.0) or 0.0) > 0]
    if drop:
        raise NoPipeline(f"{model_type} with {' and '.join(drop)} > 0 skips random layers each step, which the "
                         f"stages of a pipeline do not draw alike; set them to 0 to launch its pipelines")
    return model_type


def seq2seq_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Seq2SeqLM's loss: the mean token cross entropy against the targets."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


# ---- Llama-style decoders -----------------------------------------------------------------------
class DecoderStage(_HFStage):
    """A stage of an HFLossAdapter over a Llama-style ``...ForCausalLM``: its base model's forward
    (embed_tokens, layers, norm) and the LM head, for layers [first, end)."""

    def __init__(self, model: nn.Module, model_type: str, first: int, end: int, is_first: bool, is_last: bool
                 ) -> None:
        super().__init__(first, end, is_first, is_last)
        self.base = "model.model"
        base = model.get_submodule(self.base)
        self.config: Any = base.config
        self.mask_rule = DECODER_PIPELINES[model_type]
        if is_first:
            hold(self, model, f"{self.base}.embed_tokens")
        hold_layers(self, model, f"{self.base}.layers", first, end)
        hold(self, model, f"{self.base}.rotary_emb")  # no parameters: every stage makes its own tables
        if is_last:
            hold(self, model, f"{self.base}.norm")
            hold(self, model, "model.lm_head")

    def names(self, b: int) -> tuple[str, ...]:
        return ("h",)

    def start(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"h": self.get_submodule(f"{self.base}.embed_tokens")(inputs)}

    def forward(self, *xs: torch.Tensor) -> Any:
        if self.is_first:
            st = self.start(xs[0])
        else:
            st = {"h": xs[0]}
        h = st["h"]
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        masks = self._masks(h, pos)
        pe = self.get_submodule(f"{self.base}.rotary_emb")(h, position_ids=pos)
        for i in range(self.first, self.end):
            layer = self.get_submodule(f"{self.base}.layers.{i}")
            h = layer(h, attention_mask=masks(i), position_embeddings=pe, position_ids=pos, cache=None,
                      use_cache=False)
        if not self.is_last:
            return h
        return self.get_submodule("model.lm_head")(self.get_submodule(f"{self.base}.norm")(h))

    def _masks(self, h: torch.Tensor, pos: torch.Tensor) -> Callable[[int], Any]:
        m = _masks()
        kw = dict(config=self.config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=pos)
        if self.mask_rule == "causal":
            one = m.create_causal_mask(**kw)
            return lambda i: one
        if self.mask_rule == "window":
            make = m.create_causal_mask if self.config.sliding_window is None else m.create_sliding_window_causal_mask
            one = make(**kw)
            return lambda i: one
        types = self.config.layer_types
        by_type = {"full_attention": m.create_causal_mask(**kw)}
        if "sliding_attention" in types:
            by_type["sliding_attention"] = m.create_sliding_window_causal_mask(**kw)
        return lambda i: by_type[types[i]]


def decoder_type(model: nn.Module) -> str:
    """The model type of an HFLossAdapter over a Llama-style causal LM; NoPipeline otherwise."""
    inner = getattr(model, "model", None)
    config = getattr(inner, "config", None)
    model_type = str(getattr(config, "model_type", "?"))
    refusal = decoder_refusal(model_type)
    if refusal is not None:
        raise NoPipeline(refusal)
    if getattr(model, "kind", None) != "lm":
        raise NoPipeline(f"a pipeline of HF model type {model_type!r} as a {getattr(model, 'kind', '?')} model is "
                         f"priced but not launched: the executor's stages restate causal LMs")
    base = getattr(inner, "model", None)
    if not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise NoPipeline(f"HF model type {model_type!r} lacks the Llama layout (embed_tokens, layers, norm, rotary_emb) "
                         f"the executor's stages run")
    return model_type
