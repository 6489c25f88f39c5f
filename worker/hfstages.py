"""Pipeline stages of HuggingFace models: encoder-decoders (T5, BART, mBART) and one-stack models.

A stage holds the model's own modules under their own dotted paths (``model.encoder.block.3``,
``model.model.embed_tokens``), so parameter FQNs, the Plan's module names, the tensor-parallel
styles and the recompute list mean the same inside a stage as in the whole model (as
worker/stages.py does for the zoo's classes). An encoder-decoder's stage restates the forward of
the transformers classes it holds, for the layers it holds; a one-stack model's (causal LM,
masked LM, image classifier: ModelStage) runs the model's own forward with its layer list standing
for the stage's layers. Either way masks, positions and rotary tables are recomputed on every
stage from the hidden states' shape, as the model's own forward computes them from its inputs
(the training step passes no attention mask: no padding), so nothing but activations crosses a
cut.

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
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search.models.pipelines import decoder_refusal, seq2seq_refusal
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

    def held_calls(self, fqn: str) -> list[int] | None:
        """Which calls of module `fqn`, counted in the whole model's forward, this stage makes (in
        order); None: all of them. A module called once per tensor whose calls the plan converts
        differently takes each call's layouts by its index (worker/parallelize.py PrepareFirstInput):
        a stage holding one of its calls must not read that as the first."""
        return None

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
    """A stage of a T5, BART or mBART ``...ForConditionalGeneration`` inside a Seq2SeqLM (seq2seq.py),
    its forward that of T5Stack / BartEncoder / BartDecoder (MBart's: a layer norm more at each
    stack's end) and the LM head, layer by layer."""

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
        self.enc_dropout = float(getattr(enc, "dropout", 0.0)) if family != "t5" else 0.0
        self.dec_dropout = float(getattr(dec, "dropout", 0.0)) if family != "t5" else 0.0
        assert isinstance(model, Seq2SeqLM)  # pipe_of builds these stages for a seq2seq spec only
        top: Any = model.get_submodule("model").config  # the ...ForConditionalGeneration's config
        self.start_token = model.start_token
        self.vocab: int = top.vocab_size
        self.scale = float(top.d_model) ** -0.5 if family == "t5" and getattr(top, "scale_decoder_outputs", False) else None
        n = self.n_enc + self.n_dec
        e0, e1 = min(first, self.n_enc), min(end, self.n_enc)
        d0, d1 = max(first, self.n_enc) - self.n_enc, max(end, self.n_enc) - self.n_enc
        bart_pre = ("embed_tokens", "embed_positions", "layernorm_embedding")
        pre = {"t5": ("embed_tokens", "dropout"), "bart": bart_pre, "mbart": bart_pre}
        # mBART's stacks are BART's with a layer norm at each one's end
        post = {"t5": ("final_layer_norm", "dropout"), "bart": (), "mbart": ("layer_norm",)}
        self.post = post[family]
        # T5's stack dropout is one module called twice per stack (after the embedding, after the
        # final norm); a stage holding one end of a stack makes only that call
        self._calls: dict[str, list[int]] = {}
        if family == "t5":
            self._calls[f"{self.enc_path}.dropout"] = [c for c, held in enumerate((first == 0, first < self.n_enc <= end))
                                                       if held]
            self._calls[f"{self.dec_path}.dropout"] = [c for c, held in enumerate((first <= self.n_enc < end, end == n))
                                                       if held]
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
            if family != "t5":
                hold_buffer(self, model, f"{self.head}.final_logits_bias")

    def names(self, b: int) -> tuple[str, ...]:
        t5 = self.family == "t5"
        if b < self.n_enc:
            return ("enc_h",) + (("enc_bias",) if t5 else ()) + ("dec_ids",)
        if b == self.n_enc:
            return ("enc_out", "dec_ids")
        return ("enc_out", "dec_h") + (("dec_bias",) if t5 else ())

    def held_calls(self, fqn: str) -> list[int] | None:
        return self._calls.get(fqn)

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
            elif self.family == "mbart":
                h = self._m(f"{e}.layer_norm")(h)
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
            if self.family == "mbart":
                h = self._m(f"{d}.layer_norm")(h)
            logits = self._m(f"{self.head}.lm_head")(h)
            bias = self._m(self.head).get_buffer("final_logits_bias")
            st["logits"] = logits + bias.to(logits.device)


def seq2seq_family(model: nn.Module) -> str:
    """'t5', 'bart' or 'mbart' for a Seq2SeqLM the stages restate; NoPipeline otherwise."""
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


# ---- any one-stack HF model: its own forward, over the stage's layers ---------------------------
class _Reached(Exception):  # noqa: N818 - a signal, not an error: the stage's layers are done
    """Raised at the layer after a stage's last: carries the hidden states that layer would read."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The hidden states a layer is called with (HF layers take them first, or by name)."""
    return args[0] if args else kwargs["hidden_states"]


class _Stand(nn.Module):
    """In place of a module the stage does not run: attribute reads (a layer's attention_type, an
    embedding's padding_idx) go to the module it stands for, held as a plain attribute (not
    registered: its parameters are another stage's, maybe on meta). A tensor read so (Llama 4 moves
    the ids to its embedding's weight.device) is one of its shape and dtype on the stage's device,
    taking no memory (a stride-0 expansion of one element)."""

    def __init__(self, module: nn.Module, device: torch.device | None = None) -> None:
        super().__init__()
        self.__dict__["_for"] = module
        self.__dict__["_device"] = device

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            value = getattr(self.__dict__["_for"], name)
            device = self.__dict__["_device"]
            if isinstance(value, torch.Tensor) and device is not None and value.device != device:
                return torch.empty((), dtype=value.dtype, device=device).expand(value.shape)
            return value


class _Skip(_Stand):
    """A layer before the stage's: it returns the hidden states it got as the 1-tuple that layers
    returning tuples give (whatever the loop makes of it, the stage's first layer reads the
    received hidden states instead)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (_hidden(args, kwargs),)


class _Stop(_Stand):
    """The layer after the stage's last: the hidden states it is called with are the stage's output."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise _Reached(_hidden(args, kwargs))


class _Enter(_Stand):
    """The stage's first layer on a stage after the first: called with the received hidden states
    in place of those the forward computed from the placeholder inputs."""

    def __init__(self, module: nn.Module, stage: nn.Module, path: str) -> None:
        super().__init__(module)
        self.__dict__["_stage"], self.__dict__["_path"] = stage, path
        self.received: torch.Tensor | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        layer = self.__dict__["_stage"].get_submodule(self.__dict__["_path"])  # as wrapped (recompute, FSDP)
        if args:
            return layer(self.received, *args[1:], **kwargs)
        return layer(*args, **{**kwargs, "hidden_states": self.received})


class _Absent(_Stand):
    """A module with parameters that another stage holds, met on the way to this stage's layers
    (the embedding, on a later stage): zeros of its output's shape and dtype, found by running it
    on the meta device. Only the received hidden states reach the stage's first layer, so these
    zeros are never read but to make the placeholders' shapes."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.func import functional_call
        from torch.utils._pytree import tree_map

        module: nn.Module = self.__dict__["_for"]
        device: torch.device = self.__dict__["_device"]
        state = {n: torch.empty_like(t, device="meta") for n, t in
                 [*module.named_parameters(), *module.named_buffers()]}

        def meta(t: Any) -> Any:
            return t.to("meta") if isinstance(t, torch.Tensor) else t

        def zeros(t: Any) -> Any:
            return torch.zeros(t.shape, dtype=t.dtype, device=device) if isinstance(t, torch.Tensor) else t

        with torch.no_grad():
            out = functional_call(module, state, tree_map(meta, args), tree_map(meta, kwargs))
        return tree_map(zeros, out)


class _Seen(_Absent):
    """An _Absent that notes its path when it is called (finding which modules run before the layers)."""

    def __init__(self, module: nn.Module, path: str, called: list[str]) -> None:
        super().__init__(module, torch.device("cpu"))
        self.__dict__["_seen"] = (path, called)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        path, called = self.__dict__["_seen"]
        called.append(path)
        return super().forward(*args, **kwargs)


@dataclass(frozen=True)
class Layout:
    """Where a one-stack HF model's modules sit around its layers, as its own forward runs them.
    `chain`: the modules from the HF model down to the one holding the layer list (their forwards
    are run, with their children resolved per stage); `pre` and `post`: the other children of those
    with parameters, run before the first layer (held by the first stage) or after the last (the
    last stage); `free`: those without parameters (rotary tables, dropout; every stage holds them);
    `buffers`: the chain's own buffers (Gemma's embedding scale; every stage)."""

    kind: str
    layers: str
    n: int
    chain: tuple[str, ...]
    pre: tuple[str, ...]
    post: tuple[str, ...]
    free: tuple[str, ...]
    buffers: tuple[str, ...]


def _proxy(model: nn.Module, path: str, layout: Layout, resolve: Callable[[str, nn.Module], nn.Module | None],
           layers: nn.ModuleList, buffers: Callable[[str], torch.Tensor]) -> nn.Module:
    """The module at `path` of the chain as an object of its own class sharing its attributes (the
    config, hooks), its children resolved per stage: the next of the chain as its proxy, the layer
    list as `layers`, every other child by `resolve(path, module)`."""
    orig = model.get_submodule(path)
    p = object.__new__(type(orig))
    p.__dict__.update(orig.__dict__)
    children: dict[str, nn.Module | None] = {}
    for name, child in orig._modules.items():
        at = f"{path}.{name}"
        if at == layout.layers:
            children[name] = layers
        elif at in layout.chain:
            children[name] = _proxy(model, at, layout, resolve, layers, buffers)
        else:
            children[name] = None if child is None else resolve(at, child)
    p.__dict__["_modules"] = children
    p.__dict__["_buffers"] = {n: buffers(f"{path}.{n}") for n in orig._buffers if f"{path}.{n}" in layout.buffers}
    return p


def _placeholder(layout: Layout, model: nn.Module, like: torch.Tensor) -> torch.Tensor:
    """The HF model's inputs for a stage after the first, of the shape the first stage's have
    (the embedding it stands in for makes the placeholders the forward needs from them)."""
    if layout.kind == "vision":
        config: Any = model.get_submodule(layout.chain[0]).config
        size = int(config.image_size)
        return torch.zeros(like.shape[0], int(config.num_channels), size, size, device=like.device)
    return torch.zeros(like.shape[:2], dtype=torch.long, device=like.device)


def _call(layout: Layout, top: nn.Module, inputs: torch.Tensor) -> Any:
    """The HF model's forward as HFLossAdapter calls it (search/models/zoo.py)."""
    if layout.kind == "vision":
        return top(pixel_values=inputs)
    if layout.kind == "lm":
        return top(input_ids=inputs, use_cache=False)
    return top(input_ids=inputs)


def layout_of(model: nn.Module, layers: str, kind: str) -> Layout:
    """The Layout of an HFLossAdapter's model, found by running its forward up to the first layer
    on CPU placeholders, every child standing in (_Absent: the model may be on meta): the children
    with parameters it calls on the way are `pre`, the others `post`. NoPipeline where the chain
    holds parameters itself."""
    stack = model.get_submodule(layers)
    assert isinstance(stack, nn.ModuleList)  # find_blocks_attr picks ModuleLists only
    parts = layers.split(".")
    chain = tuple(".".join(parts[:i]) for i in range(1, len(parts)))  # "model", "model.model", ...
    own = [f"{c}.{n}" for c in chain for n, _ in model.get_submodule(c).named_parameters(recurse=False)]
    model_type = str(getattr(model.get_submodule(chain[0]).config, "model_type", "?"))
    if own:
        raise NoPipeline(f"a pipeline of HF model type {model_type!r} is priced but not launched: its forward reads "
                         f"parameters of its own ({', '.join(own)}) that no stage's modules hold")
    sides = {f"{c}.{n}": m for c in chain for n, m in model.get_submodule(c).named_children()
             if f"{c}.{n}" not in chain and f"{c}.{n}" != layers}
    free = tuple(p for p, m in sides.items() if next(m.parameters(), None) is None)
    bufs = tuple(f"{c}.{n}" for c in chain for n, _ in model.get_submodule(c).named_buffers(recurse=False))
    probe = Layout(kind, layers, len(stack), chain, (), (), free, bufs)
    called: list[str] = []

    def seen(path: str, module: nn.Module) -> nn.Module:
        return _Seen(module, path, called)

    stops = nn.ModuleList([_Stop(layer) for layer in stack])
    cpu = torch.device("cpu")  # the model may be on meta, where masks and positions are not made (.item())
    try:
        top = _proxy(model, chain[0], probe, seen, stops, lambda b: torch.zeros_like(model.get_buffer(b), device=cpu))
        _call(probe, top, _placeholder(probe, model, torch.zeros(1, 2, 1)))
    except _Reached:
        pass
    except Exception as e:  # noqa: BLE001 - any failure of the model's own forward: the reason shown
        raise NoPipeline(f"a pipeline of HF model type {model_type!r} is priced but not launched: its forward up to "
                         f"its first layer does not run on placeholders ({type(e).__name__}: {e})") from None
    else:
        raise NoPipeline(f"a pipeline of HF model type {model_type!r} is priced but not launched: its forward does "
                         f"not run the layers of {layers}")
    weighted = [p for p in sides if p not in free]
    pre = tuple(p for p in weighted if p in called)
    return Layout(kind, layers, len(stack), chain, pre, tuple(p for p in weighted if p not in pre), free, bufs)


class ModelStage(_HFStage):
    """A stage of an HFLossAdapter over any one-stack HF model (causal LM, masked LM, image
    classifier): the model's own forward, run on every stage with its layer list standing for the
    stage's layers - those before skipped, the first fed the received hidden states, the one after
    the last stopping the forward with its input, which is the stage's output. Masks, positions,
    rotary tables and ALiBi biases are made by that forward from placeholder inputs of the shape of
    the first stage's, the modules other stages hold standing in with zeros of their outputs'
    shapes (_Absent); the last stage returns the model's logits (final norm, head, soft-cap)."""

    def __init__(self, model: nn.Module, layout: Layout, first: int, end: int, is_first: bool, is_last: bool
                 ) -> None:
        super().__init__(first, end, is_first, is_last)
        self.__dict__["_model"] = model  # a plain attribute: the stage registers only what it holds
        self.layout = layout
        held = list(layout.free) + (list(layout.pre) if is_first else []) + (list(layout.post) if is_last else [])
        for p in held:
            hold(self, model, p)
        for b in layout.buffers:
            hold_buffer(self, model, b)
        hold_layers(self, model, layout.layers, first, end)
        self.held = frozenset(held)
        stack = model.get_submodule(layout.layers)
        assert isinstance(stack, nn.ModuleList)  # layout_of checked
        enter = None if is_first else _Enter(stack[first], self, f"{layout.layers}.{first}")
        self.__dict__["_enter"] = enter  # not registered, as the stand-ins below
        self.__dict__["_layers"] = nn.ModuleList(
            [_Skip(stack[i]) for i in range(first)]
            + [enter or _Stand(stack[first])]
            + [_Stand(stack[i]) for i in range(first + 1, end)]  # resolved per call: see _stack
            + [_Stop(stack[i]) for i in range(end, len(stack))])

    def _stack(self) -> nn.ModuleList:
        """The layer list the forward runs: the stage's own layers as they are now (recompute and
        data parallelism wrap them after the stage is built)."""
        out = nn.ModuleList()
        for i, m in enumerate(self.__dict__["_layers"]):
            held = self.first <= i < self.end and (i > self.first or self.is_first)
            out.append(self.get_submodule(f"{self.layout.layers}.{i}") if held else m)
        return out

    def _resolve(self, path: str, module: nn.Module, device: torch.device) -> nn.Module:
        return self.get_submodule(path) if path in self.held else _Absent(module, device)

    def forward(self, *xs: torch.Tensor) -> Any:
        model, layout = self.__dict__["_model"], self.layout
        enter: _Enter | None = self.__dict__["_enter"]
        if enter is None:
            inputs = xs[0]
        else:
            assert len(xs) == 1, f"stage over layers {self.first}-{self.end} got {len(xs)} tensors"
            enter.received = xs[0]
            inputs = _placeholder(layout, model, xs[0])
        device = xs[0].device
        top = _proxy(model, layout.chain[0], layout, lambda p, m: self._resolve(p, m, device), self._stack(),
                     self.get_buffer)
        try:
            out = _call(layout, top, inputs)
        except _Reached as r:
            return r.hidden
        finally:
            if enter is not None:
                enter.received = None
        assert self.is_last, f"the forward of the stage over layers {self.first}-{self.end} ran past them"
        return out.logits


def model_layout(model: nn.Module, layers: str, kind: str) -> Layout:
    """The Layout of an HFLossAdapter's one-stack model whose pipelines launch; NoPipeline otherwise."""
    config = getattr(getattr(model, "model", None), "config", None)
    refusal = decoder_refusal(str(getattr(config, "model_type", "?")))
    if refusal is not None:
        raise NoPipeline(refusal)
    return layout_of(model, layers, kind)
