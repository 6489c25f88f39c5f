"""Model zoo: real, randomly initialised ``torch.nn.Module`` implementations.

Every model is written the way torchtitan writes its models: plain, explicit submodules,
so that the same module can be (1) built on the meta device and captured with
``torch.export.export(model, spec.example_inputs(...), strict=False)`` and (2) later run
for real with DTensor tensor parallelism (``ColwiseParallel`` on ``q``/``k``/``v``/``fc1``/
``gate``/``up``, ``RowwiseParallel`` on ``o``/``fc2``/``down``), FSDP2 and pipelining over
the repeated blocks.

Conventions shared by all models
--------------------------------
* ``forward(*spec.example_inputs(batch))`` returns a scalar cross-entropy loss, so the
  captured graph contains the loss. Language models take ``(input_ids, targets)`` where
  ``targets`` are already the next-token ids (no shifting inside); masked LMs take the same
  and compute the loss over every position; vision models take ``(images, labels)``.
* The identical repeated blocks live in an ``nn.ModuleList`` (``blocks``, or ``layers`` for
  Llama) named by ``ModelSpec.blocks_attr``, and ``forward`` iterates over it.
* Attention uses separate ``q``/``k``/``v``/``o`` ``nn.Linear`` layers (same parameter count
  as a fused ``qkv``, but each shards cleanly column-wise) and reshapes with ``-1`` heads, so
  it still works when tensor parallelism leaves only ``heads / tp`` heads per rank.
* Dropout is omitted everywhere: it has no parameters and would make parallel-vs-serial
  loss comparisons nondeterministic.
* No buffers, no ``.item()``, no control flow on tensor values: rotary tables and position
  ids are computed inside ``forward`` from the input's shape and device.
* Models built on meta can be materialised with ``model.to_empty(device="cpu")`` followed
  by ``model.init_weights()``, which also re-ties the tied LM heads that ``to_empty`` unties
  (for HF models the adapter calls HF's own ``init_weights``, which re-ties and recomputes
  rotary buffers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from search.errors import InputError, read_json

__all__ = [
    "ModelSpec",
    "ZOO",
    "TEST_MODELS",
    "get_model",
    "model_from_hf_config",
    "find_blocks_attr",
    "GPT",
    "Bert",
    "Llama",
    "MoELM",
    "ViT",
    "ResNet",
    "VGG",
    "TinyCNN",
    "LSTMLM",
    "HFLossAdapter",
]


# --------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: how to build a model and what its forward takes.

    ``build`` constructs the module on the current default device; callers wrap it in
    ``with torch.device("meta"):`` to get a model that costs no memory.
    """

    name: str
    family: str
    kind: str  # "lm" | "mlm" | "vision" | "seq2seq"
    build: Callable[[], nn.Module]
    default_seq_len: int | None
    image_size: int | None
    vocab_size: int | None
    description: str
    blocks_attr: str | None
    # Extensions beyond the core fields (all optional):
    num_classes: int | None = None  # vision: size of the label space
    max_seq_len: int | None = None  # learned position tables: longest sequence accepted
    # seq2seq: the encoder's and the decoder's layer lists, the block families (search/models/seq2seq.py)
    stacks: tuple[str, ...] = ()
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def example_inputs(
        self,
        batch: int,
        seq_len: int | None = None,
        device: str | torch.device = "meta",
        *,
        seed: int | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Positional args of ``forward``: ``(input_ids, targets)`` for lm/mlm/seq2seq, ``(images, labels)`` for vision.

        ``seed`` (ignored on meta) makes real inputs reproducible, e.g. identical on every rank.
        """
        if batch < 1:
            raise InputError(f"batch must be >= 1, got {batch}")
        device = torch.device(device)
        gen = None
        gen_device = device
        if seed is not None and device.type != "meta":
            gen_device = torch.device("cpu")
            gen = torch.Generator(device="cpu").manual_seed(seed)

        if self.kind in ("lm", "mlm", "seq2seq"):  # seq2seq: source ids, target ids of one length
            seq = self.default_seq_len if seq_len is None else seq_len
            if seq is None or seq < 1:
                raise InputError(f"model '{self.name}' needs a positive seq_len, got {seq}")
            if self.max_seq_len is not None and seq > self.max_seq_len:
                raise InputError(
                    f"seq_len {seq} exceeds the {self.max_seq_len} positions of model '{self.name}'"
                )
            assert self.vocab_size is not None
            ids = torch.randint(0, self.vocab_size, (batch, seq), device=gen_device, generator=gen)
            tgt = torch.randint(0, self.vocab_size, (batch, seq), device=gen_device, generator=gen)
            return ids.to(device), tgt.to(device)

        if self.kind == "vision":
            assert self.image_size is not None and self.num_classes is not None
            size = self.image_size
            img = torch.randn(batch, 3, size, size, device=gen_device, generator=gen)
            lab = torch.randint(0, self.num_classes, (batch,), device=gen_device, generator=gen)
            return img.to(device), lab.to(device)

        raise InputError(f"model '{self.name}' has unknown kind '{self.kind}'")

    def param_count(self) -> int:
        """Number of distinct parameters (tied weights counted once), from a meta build; cached."""
        if "params" not in self._cache:
            with torch.device("meta"):
                model = self.build()
            self._cache["params"] = sum(p.numel() for p in model.parameters())
        return self._cache["params"]


# --------------------------------------------------------------------------------------
# Shared building blocks
# --------------------------------------------------------------------------------------


class ZooModule(nn.Module):
    """Base class giving every zoo model a GPT/torchtitan-style ``init_weights()``.

    Linear and Embedding weights ~ N(0, 0.02), biases zero; convolutions Kaiming-normal
    (fan_out, as torchvision); norm layers (incl. BatchNorm running stats) reset.
    Called at the end of ``__init__`` (a no-op on meta) and again after ``to_empty``; it
    first re-ties shared weights, because ``to_empty`` replaces each module's parameters
    separately and so unties them.
    """

    def init_weights(self) -> None:
        self._tie_weights()
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, mean=0.0, std=0.02)
                elif isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, (nn.LayerNorm, nn.RMSNorm, nn.BatchNorm2d)):
                    m.reset_parameters()
            self._init_extra()

    def _init_extra(self) -> None:
        """Hook for parameters that are not inside a standard layer (e.g. ViT class token)."""

    def _tie_weights(self) -> None:
        """Hook: make tied parameters the same ``nn.Parameter`` again."""


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy; logits ``[B, T, V]``, targets ``[B, T]``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def _rotary(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[T, head_dim]`` for rotate-half RoPE (Su et al. 2021), computed on the fly."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[B, T, H, D]`` by the position tables ``[T, D]``."""
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Multi-head (optionally grouped-query, optionally rotary) self-attention.

    Submodules ``q``, ``k``, ``v`` (column-parallel) and ``o`` (row-parallel). Heads are
    inferred with ``view(..., -1, head_dim)`` so the module works on a TP shard.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        bias: bool = True,
        causal: bool = False,
        rope_theta: float | None = None,
        eager: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim {dim} not divisible by {n_heads} heads")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"{n_heads} heads not divisible by {n_kv_heads} kv heads")
        self.head_dim = dim // n_heads
        self.causal = causal
        self.rope_theta = rope_theta
        self.eager = eager  # scores, softmax, dropout and the value product as separate kernels
        self.dropout = dropout
        self.q = nn.Linear(dim, n_heads * self.head_dim, bias=bias)
        self.k = nn.Linear(dim, n_kv_heads * self.head_dim, bias=bias)
        self.v = nn.Linear(dim, n_kv_heads * self.head_dim, bias=bias)
        self.o = nn.Linear(n_heads * self.head_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.head_dim)
        k = self.k(x).view(b, t, -1, self.head_dim)
        v = self.v(x).view(b, t, -1, self.head_dim)
        if self.rope_theta is not None:
            cos, sin = _rotary(t, self.head_dim, self.rope_theta, x.device)
            q = _apply_rotary(q, cos, sin)
            k = _apply_rotary(k, cos, sin)
        n_rep = q.shape[2] // k.shape[2]
        if n_rep > 1:  # GQA: kv head j serves query heads j*n_rep .. (j+1)*n_rep-1
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.eager:
            out = _eager_attention(q, k, v, self.causal, self.dropout if self.training else 0.0)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout: float) -> torch.Tensor:
    """Attention as Megatron-LM ran it before fused kernels: the score product, a scaled and masked
    softmax over the full [seq, seq] scores, dropout on the probabilities, then the value product."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))
    if causal:
        t = q.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout)
    return torch.matmul(probs, v)


class MLP(nn.Module):
    """Two-layer GELU feed-forward: ``fc1`` (column-parallel) -> GELU -> ``fc2`` (row-parallel)."""

    def __init__(self, dim: int, hidden: int, *, gelu_approximate: str = "none") -> None:
        super().__init__()
        self.gelu_approximate = gelu_approximate
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.gelu_approximate))


class SwiGLU(nn.Module):
    """Llama feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class PreLNBlock(nn.Module):
    """Pre-LayerNorm transformer block (GPT-2/GPT-3, ViT): ``x + attn(ln1(x))``, ``x + mlp(ln2(x))``."""

    def __init__(
        self, dim: int, n_heads: int, mlp_hidden: int, *, causal: bool, eps: float, gelu_approximate: str,
        eager_attention: bool = False, dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, n_heads, causal=causal, eager=eager_attention, dropout=dropout)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_hidden, gelu_approximate=gelu_approximate)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dropout:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        p = self.dropout if self.training else 0.0
        x = x + F.dropout(self.attn(self.ln1(x)), p=p)
        return x + F.dropout(self.mlp(self.ln2(x)), p=p)


class PostLNBlock(nn.Module):
    """Post-LayerNorm encoder block (BERT): ``ln1(x + attn(x))``, then ``ln2(x + mlp(x))``."""

    def __init__(self, dim: int, n_heads: int, mlp_hidden: int, *, eps: float = 1e-12) -> None:
        super().__init__()
        self.attn = Attention(dim, n_heads, causal=False)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_hidden)
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class LlamaBlock(nn.Module):
    """Llama decoder layer: RMSNorm pre-norm, rotary GQA attention, SwiGLU feed-forward."""

    def __init__(
        self, dim: int, n_heads: int, n_kv_heads: int, ffn_hidden: int, *, eps: float, rope_theta: float
    ) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim, eps=eps)
        self.attn = Attention(
            dim, n_heads, n_kv_heads=n_kv_heads, bias=False, causal=True, rope_theta=rope_theta
        )
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)
        self.ffn = SwiGLU(dim, ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class RoutedExperts(nn.Module):
    """A layer's experts as transformers 5 holds them (search/models/moe.py): SwiGLU experts with
    stacked weights ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``, called on the tokens
    with each token's top-k expert indices and weights. Runs each expert on the tokens routed to
    it, whatever the load; capture prices it at a balanced load."""

    def __init__(self, dim: int, hidden: int, n_experts: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * hidden, dim))
        self.down_proj = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.act_fn = F.silu

    def forward(self, tokens: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(tokens)
        for e in range(self.gate_up_proj.shape[0]):
            tok, slot = torch.where(top_k_index == e)
            gate, up = F.linear(tokens[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[tok, slot, None]
            out = out.index_add(0, tok, y.to(out.dtype))
        return out


class MoEFFN(nn.Module):
    """Mixtral's sparse feed-forward: a linear router, softmax, top-k experts with renormalised
    weights, the experts' outputs summed per token."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = RoutedExperts(dim, hidden, n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(tokens).float(), dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        return self.experts(tokens, index, weights).reshape(x.shape)


class MoEBlock(nn.Module):
    """Mixtral decoder layer: the Llama layer with the SwiGLU feed-forward replaced by MoEFFN."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int, n_experts: int, top_k: int, *,
                 eps: float, rope_theta: float) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim, eps=eps)
        self.attn = Attention(dim, n_heads, n_kv_heads=n_kv_heads, bias=False, causal=True, rope_theta=rope_theta)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)
        self.ffn = MoEFFN(dim, hidden, n_experts, top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


# --------------------------------------------------------------------------------------
# Transformer models
# --------------------------------------------------------------------------------------


class GPT(ZooModule):
    """GPT-2 / GPT-3 decoder (Radford et al. 2019; Brown et al. 2020).

    Learned token + position embeddings, pre-LN blocks with tanh-GELU MLP (4x), final
    LayerNorm, and an ``lm_head`` whose weight is tied to ``tok_emb``. GPT-3's alternating
    locally-banded sparse attention is parameter-free and is modelled as dense causal.
    """

    def __init__(self, vocab_size: int, n_ctx: int, dim: int, n_layers: int, n_heads: int, *,
                 eager_attention: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(n_ctx, dim)
        self.blocks = nn.ModuleList(
            PreLNBlock(dim, n_heads, 4 * dim, causal=True, eps=1e-5, gelu_approximate="tanh",
                       eager_attention=eager_attention, dropout=dropout)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()  # ties lm_head.weight to tok_emb.weight

    def _tie_weights(self) -> None:
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.tok_emb(input_ids) + self.pos_emb(pos)
        for block in self.blocks:
            h = block(h)
        return _lm_loss(self.lm_head(self.norm(h)), targets)


class Bert(ZooModule):
    """BERT encoder with the masked-LM head (Devlin et al. 2019; layout as HF ``BertForMaskedLM``).

    Word + position + token-type embeddings with LayerNorm, post-LN encoder blocks (exact
    GELU), MLM head ``head_dense -> GELU -> head_norm -> lm_head`` where ``lm_head`` is tied
    to the word embedding and has its own bias. No pooler (unused by the MLM loss).
    The loss is cross entropy over all positions (no masking needed for planning).
    """

    def __init__(
        self,
        vocab_size: int = 30522,
        dim: int = 768,
        n_layers: int = 12,
        n_heads: int = 12,
        mlp_hidden: int = 3072,
        max_positions: int = 512,
        type_vocab: int = 2,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = nn.Embedding(max_positions, dim)
        self.type_emb = nn.Embedding(type_vocab, dim)
        self.emb_norm = nn.LayerNorm(dim, eps=1e-12)
        self.blocks = nn.ModuleList(PostLNBlock(dim, n_heads, mlp_hidden) for _ in range(n_layers))
        self.head_dense = nn.Linear(dim, dim)
        self.head_norm = nn.LayerNorm(dim, eps=1e-12)
        self.lm_head = nn.Linear(dim, vocab_size, bias=True)
        self.init_weights()  # ties lm_head.weight to tok_emb.weight; the bias is the head's own

    def _tie_weights(self) -> None:
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        token_type = torch.zeros_like(input_ids)
        h = self.tok_emb(input_ids) + self.pos_emb(pos) + self.type_emb(token_type)
        h = self.emb_norm(h)
        for block in self.blocks:
            h = block(h)
        h = self.head_norm(F.gelu(self.head_dense(h)))
        return _lm_loss(self.lm_head(h), targets)


class Llama(ZooModule):
    """Llama / Llama 2 decoder (Touvron et al. 2023): RMSNorm, rotary GQA, SwiGLU, untied head."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        n_kv_heads: int,
        ffn_hidden: int,
        *,
        eps: float = 1e-5,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            LlamaBlock(dim, n_heads, n_kv_heads, ffn_hidden, eps=eps, rope_theta=rope_theta)
            for _ in range(n_layers)
        )
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(input_ids)
        for layer in self.layers:
            h = layer(h)
        return _lm_loss(self.lm_head(self.norm(h)), targets)


class MoELM(ZooModule):
    """Mixtral-style decoder (Jiang et al. 2024): Llama's layers with routed SwiGLU experts."""

    def __init__(self, vocab_size: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, hidden: int,
                 n_experts: int, top_k: int, *, eps: float = 1e-5, rope_theta: float = 1e6) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            MoEBlock(dim, n_heads, n_kv_heads, hidden, n_experts, top_k, eps=eps, rope_theta=rope_theta)
            for _ in range(n_layers)
        )
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()

    def _init_extra(self) -> None:
        for m in self.modules():
            if isinstance(m, RoutedExperts):
                nn.init.normal_(m.gate_up_proj, mean=0.0, std=0.02)
                nn.init.normal_(m.down_proj, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(input_ids)
        for layer in self.layers:
            h = layer(h)
        return _lm_loss(self.lm_head(self.norm(h)), targets)


class ViT(ZooModule):
    """Vision Transformer (Dosovitskiy et al. 2021, Table 1), layout as timm ``vit_*_patch*_224``.

    Conv2d patch embedding, class token, learned position embedding, pre-LN blocks with
    exact-GELU MLP, final LayerNorm and a linear classifier on the class token.
    """

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        n_layers: int,
        n_heads: int,
        mlp_hidden: int,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} not divisible by patch {patch}")
        n_patches = (image_size // patch) ** 2
        self.patch_emb = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_emb = nn.Parameter(torch.zeros(1, n_patches + 1, dim))
        self.blocks = nn.ModuleList(
            PreLNBlock(dim, n_heads, mlp_hidden, causal=False, eps=1e-6, gelu_approximate="none")
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        self.init_weights()

    def _init_extra(self) -> None:
        nn.init.normal_(self.cls_token, std=1e-6)
        nn.init.trunc_normal_(self.pos_emb, std=0.02)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.patch_emb(images).flatten(2).transpose(1, 2)  # [B, N, D]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_emb
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        return F.cross_entropy(logits.float(), labels)


# --------------------------------------------------------------------------------------
# Convolutional models (written to match torchvision's parameter layout; torchvision is not used)
# --------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv), as torchvision ``Bottleneck``."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int = 1, width_per_group: int = 64) -> None:
        super().__init__()
        width = planes * width_per_group // 64
        out_ch = planes * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(ZooModule):
    """Bottleneck ResNet (He et al. 2016) / Wide ResNet (Zagoruyko & Komodakis 2016) for 224x224 ImageNet.

    ``layers=[3, 4, 6, 3]`` is ResNet-50, ``[3, 8, 36, 3]`` ResNet-152; ``width_per_group=128``
    doubles the bottleneck width (Wide ResNet-50-2). Stages ``layer1..layer4`` are
    ``nn.Sequential`` whose blocks differ in width, so there is no single block list.
    """

    def __init__(self, layers: list[int], width_per_group: int = 64, num_classes: int = 1000,
                 base: int = 64) -> None:
        super().__init__()
        # base: the stem's and first stage's width (64 in every published ResNet; smaller only
        # for test models, where the stages' widths scale with it)
        self.conv1 = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = base
        stages = []
        for i, (n_blocks, planes) in enumerate(zip(layers, (base, 2 * base, 4 * base, 8 * base), strict=True)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n_blocks):
                blocks.append(Bottleneck(in_ch, planes, stride if j == 0 else 1, width_per_group))
                in_ch = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        self.init_weights()

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits = self.fc(torch.flatten(self.avgpool(x), 1))
        return F.cross_entropy(logits.float(), labels)


class VGG(ZooModule):
    """VGG (Simonyan & Zisserman 2015), configuration D = VGG-16, torchvision layout, no dropout."""

    CFG_D: tuple[int | str, ...] = (
        64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"
    )

    def __init__(self, cfg: tuple[int | str, ...] = CFG_D, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, stride=2))
            else:
                assert isinstance(v, int)
                layers += [nn.Conv2d(in_ch, v, 3, padding=1), nn.ReLU()]
                in_ch = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.fc1 = nn.Linear(in_ch * 7 * 7, 4096)
        self.fc2 = nn.Linear(4096, 4096)
        self.fc3 = nn.Linear(4096, num_classes)
        self.init_weights()

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(images)), 1)
        logits = self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))
        return F.cross_entropy(logits.float(), labels)


class TinyCNN(ZooModule):
    """Test model: two conv-BN-ReLU-maxpool stages and a linear classifier for 32x32 images."""

    def __init__(self, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * (image_size // 4) ** 2, num_classes)
        self.init_weights()

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(images))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return F.cross_entropy(self.fc(torch.flatten(x, 1)).float(), labels)


# --------------------------------------------------------------------------------------
# Recurrent models
# --------------------------------------------------------------------------------------


class LSTMLayer(nn.Module):
    """One LSTM layer (Hochreiter & Schmidhuber 1997, the gate equations of ``nn.LSTM``) written
    from primitives so that capture sees its GEMMs and pointwise ops, not one opaque cuDNN kernel.

    The input's contribution to the four gates is one GEMM over every time step at once (``ih``,
    as cuDNN does); the recurrence is one GEMM per step (``hh``). Both produce the gates
    gate-major (``[i | f | g | o]``, each ``dim`` wide, as ``nn.LSTM`` lays out its weights), so
    the gate dimension and the hidden dimension stay two dimensions of their own: the recurrent
    weight's output (4 x hidden) is a different dimension from its input (the hidden state),
    which is what lets a plan split one and not the other. ``h_0 = c_0 = 0``, so step 0 has no
    recurrent GEMM (``0 @ W_hh`` is zero work in any implementation that skips it, and cuDNN
    does not).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ih = nn.Linear(dim, 4 * dim)
        self.hh = nn.Linear(dim, 4 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[1]
        xg = self.ih(x).unflatten(-1, (4, -1))  # [B, T, 4, H]: gates of every step from the input
        h: torch.Tensor | None = None
        c: torch.Tensor | None = None
        outs = []
        for t in range(steps):
            g = xg[:, t] if h is None else xg[:, t] + self.hh(h).unflatten(-1, (4, -1))
            i, f, gg, o = g.unbind(1)
            c = torch.sigmoid(i) * torch.tanh(gg) if c is None else torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h.unsqueeze(1))
        return torch.cat(outs, 1)  # cat, not stack: capture follows the batch and hidden dims through cat


class LSTMLM(ZooModule):
    """Multi-layer LSTM language model, as Tofu (Wang et al., EuroSys 2019) trains: token
    embedding of the hidden size, a stack of LSTM layers unrolled over the sequence, a linear
    softmax head. No dropout (see the module docstring), untied head."""

    def __init__(self, vocab_size: int, dim: int, n_layers: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(LSTMLayer(dim) for _ in range(n_layers))
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self.init_weights()

    def _init_extra(self) -> None:
        # nn.LSTM's initialisation, U(-1/sqrt(H), 1/sqrt(H)) on every weight and bias: N(0, 0.02)
        # on a recurrence of width 4096+ would leave the gates at 0.5 and the state nearly constant
        for layer in self.layers:
            assert isinstance(layer, LSTMLayer)
            bound = layer.hh.in_features ** -0.5
            for p in (layer.ih.weight, layer.ih.bias, layer.hh.weight):
                nn.init.uniform_(p, -bound, bound)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.tok_emb(input_ids)
        for layer in self.layers:
            h = layer(h)
        return _lm_loss(self.lm_head(h), targets)


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------


def _gpt(name: str, family: str, title: str, n_layers: int, dim: int, n_heads: int, n_ctx: int,
         vocab: int = 50257) -> ModelSpec:
    return ModelSpec(
        name=name,
        family=family,
        kind="lm",
        build=partial(GPT, vocab, n_ctx, dim, n_layers, n_heads),
        default_seq_len=n_ctx,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: {n_layers} layers, d={dim}, {n_heads} heads",
        blocks_attr="blocks",
        max_seq_len=n_ctx,
    )


def megatron_gpt(config: dict, label: str = "megatron-gpt") -> ModelSpec:
    """Megatron-LM's GPT as its SC21 runs trained it, from a GPT-2-style config (n_embd, n_layer,
    n_head, vocab_size, n_positions): the zoo's GPT (separate q/k/v projections, which is what
    Megatron's head-interleaved fused QKV splits like) with hidden and attention dropout 0.1 and
    attention run as separate kernels (no fused attention kernel existed in 2021)."""
    try:
        dim, layers, heads = int(config["n_embd"]), int(config["n_layer"]), int(config["n_head"])
        vocab, ctx = int(config["vocab_size"]), int(config["n_positions"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"not a GPT-2-style config (n_embd, n_layer, n_head, vocab_size, n_positions): {e}") from None
    return ModelSpec(
        name=label, family="gpt", kind="lm",
        build=partial(GPT, vocab, ctx, dim, layers, heads, eager_attention=True, dropout=0.1),
        default_seq_len=ctx, image_size=None, vocab_size=vocab,
        description=f"Megatron-LM GPT: {layers} layers, d={dim}, {heads} heads, unfused attention, dropout 0.1",
        blocks_attr="blocks", max_seq_len=ctx,
    )


def _bert(name: str, title: str, n_layers: int, dim: int, n_heads: int, *, vocab: int = 30522,
          max_positions: int = 512, seq: int = 512) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="bert",
        kind="mlm",
        build=partial(Bert, vocab, dim, n_layers, n_heads, 4 * dim, max_positions),
        default_seq_len=seq,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: {n_layers} layers, d={dim}, {n_heads} heads, MLM head",
        blocks_attr="blocks",
        max_seq_len=max_positions,
    )


def _llama(name: str, title: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, ffn: int,
           *, vocab: int = 32000, seq: int = 4096) -> ModelSpec:
    kv = f" ({n_kv_heads} KV heads)" if n_kv_heads != n_heads else ""
    return ModelSpec(
        name=name,
        family="llama",
        kind="lm",
        build=partial(Llama, vocab, dim, n_layers, n_heads, n_kv_heads, ffn),
        default_seq_len=seq,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: {n_layers} layers, d={dim}, {n_heads} heads{kv}, SwiGLU FFN {ffn}",
        blocks_attr="layers",
    )


def _moe(name: str, title: str, n_layers: int, dim: int, n_heads: int, n_kv_heads: int, hidden: int,
         n_experts: int, top_k: int, *, vocab: int = 32000, seq: int = 4096) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="moe",
        kind="lm",
        build=partial(MoELM, vocab, dim, n_layers, n_heads, n_kv_heads, hidden, n_experts, top_k),
        default_seq_len=seq,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: {n_layers} layers, d={dim}, {n_heads} heads, {n_experts} SwiGLU experts of {hidden} "
                    f"(top-{top_k})",
        blocks_attr="layers",
    )


def _vit(name: str, title: str, patch: int, n_layers: int, dim: int, n_heads: int, mlp: int,
         *, image_size: int = 224, num_classes: int = 1000) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="vit",
        kind="vision",
        build=partial(ViT, image_size, patch, dim, n_layers, n_heads, mlp, num_classes),
        default_seq_len=None,
        image_size=image_size,
        vocab_size=None,
        description=f"{title}: {n_layers} layers, d={dim}, {n_heads} heads, patch {patch}",
        blocks_attr="blocks",
        num_classes=num_classes,
    )


def _vision(name: str, family: str, build: Callable[[], nn.Module], description: str,
            *, image_size: int = 224, num_classes: int = 1000) -> ModelSpec:
    return ModelSpec(
        name=name,
        family=family,
        kind="vision",
        build=build,
        default_seq_len=None,
        image_size=image_size,
        vocab_size=None,
        description=description,
        blocks_attr=None,
        num_classes=num_classes,
    )


def _lstm(name: str, title: str, n_layers: int, dim: int, *, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="lstm",
        kind="lm",
        build=partial(LSTMLM, vocab, dim, n_layers),
        default_seq_len=seq,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: {n_layers} LSTM layers, hidden {dim}, unrolled over {seq} steps, vocab {vocab}",
        blocks_attr="layers",
    )


def _seq2seq_build(model_type: str, fields: tuple[tuple[str, Any], ...]) -> nn.Module:
    from transformers import AutoConfig

    from search.models.seq2seq import build_hf_seq2seq

    return build_hf_seq2seq(AutoConfig.for_model(model_type, **dict(fields)))


def _seq2seq(name: str, title: str, model_type: str, *, layers: int, dim: int, heads: int, ffn: int, vocab: int,
             seq: int, positions: int | None = None, tiny: bool = False) -> ModelSpec:
    """T5 (Raffel et al. 2020) or BART (Lewis et al. 2020) from transformers' own config class,
    `layers` in each stack; the test models train without dropout (the executor's loss parity)."""
    if model_type == "t5":
        fields: dict[str, Any] = dict(d_model=dim, d_kv=dim // heads, d_ff=ffn, num_layers=layers,
                                      num_decoder_layers=layers, num_heads=heads, vocab_size=vocab,
                                      decoder_start_token_id=0, pad_token_id=0)
        if tiny:
            fields.update(dropout_rate=0.0, relative_attention_num_buckets=8, relative_attention_max_distance=16)
        stacks = ("model.encoder.block", "model.decoder.block")
    else:
        fields = dict(d_model=dim, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
                      decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, vocab_size=vocab,
                      max_position_embeddings=positions or 1024)
        if tiny:
            fields.update(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        stacks = ("model.model.encoder.layers", "model.model.decoder.layers")
    return ModelSpec(
        name=name,
        family=model_type,
        kind="seq2seq",
        build=partial(_seq2seq_build, model_type, tuple(sorted(fields.items()))),
        default_seq_len=seq,
        image_size=None,
        vocab_size=vocab,
        description=f"{title}: encoder-decoder, {layers}+{layers} layers, d={dim}, {heads} heads, vocab {vocab}",
        blocks_attr=None,
        max_seq_len=positions,
        stacks=stacks,
    )


def _wrn(name: str, depth_layers: list[int], widen: int, title: str, *, image_size: int = 224,
         num_classes: int = 1000, base: int = 64) -> ModelSpec:
    # widening k as torchvision's wide_resnet50_2 reads it: every bottleneck's inner width x k
    return _vision(name, "wrn", partial(ResNet, depth_layers, 64 * widen, num_classes, base),
                   f"{title}: bottleneck blocks {depth_layers}, bottleneck width x{widen}, BatchNorm, "
                   f"{num_classes} classes", image_size=image_size, num_classes=num_classes)


def _register(*specs: ModelSpec) -> dict[str, ModelSpec]:
    return {s.name: s for s in specs}


ZOO: dict[str, ModelSpec] = _register(
    # GPT-2 (Radford et al. 2019, Table 2; shapes of the released checkpoints): n_ctx 1024.
    _gpt("gpt2", "gpt2", "GPT-2 small", 12, 768, 12, 1024),
    _gpt("gpt2-medium", "gpt2", "GPT-2 medium", 24, 1024, 16, 1024),
    _gpt("gpt2-large", "gpt2", "GPT-2 large", 36, 1280, 20, 1024),
    _gpt("gpt2-xl", "gpt2", "GPT-2 XL", 48, 1600, 25, 1024),
    _gpt("gpt2-tiny", "gpt2", "GPT-2 tiny (test model)", 2, 64, 4, 64, vocab=512),
    # four layers: the fewest that interleave 2 pipeline stages x 2 virtual stages
    _gpt("gpt2-mini", "gpt2", "GPT-2 mini (test model)", 4, 64, 4, 64, vocab=512),
    # GPT-3 (Brown et al. 2020, Table 2.1): n_ctx 2048. Two table entries are inconsistent
    # and are read so that n_heads * d_head = d_model (which the stated parameter counts need):
    # XL lists 24 heads of d_head 128 with d_model 2048 -> 16 heads of 128; 13B lists
    # d_model 5140 (not divisible by its 40 heads of 128) -> 5120 = 40 x 128.
    _gpt("gpt3-125m", "gpt3", "GPT-3 Small", 12, 768, 12, 2048),
    _gpt("gpt3-350m", "gpt3", "GPT-3 Medium", 24, 1024, 16, 2048),
    _gpt("gpt3-760m", "gpt3", "GPT-3 Large", 24, 1536, 16, 2048),
    _gpt("gpt3-1.3b", "gpt3", "GPT-3 XL", 24, 2048, 16, 2048),
    _gpt("gpt3-2.7b", "gpt3", "GPT-3 2.7B", 32, 2560, 32, 2048),
    _gpt("gpt3-6.7b", "gpt3", "GPT-3 6.7B", 32, 4096, 32, 2048),
    _gpt("gpt3-13b", "gpt3", "GPT-3 13B", 40, 5120, 40, 2048),
    _gpt("gpt3-175b", "gpt3", "GPT-3 175B", 96, 12288, 96, 2048),
    # BERT (Devlin et al. 2019, section 3): vocab 30522, 512 positions, 2 token types.
    _bert("bert-base", "BERT-base", 12, 768, 12),
    _bert("bert-large", "BERT-large", 24, 1024, 16),
    # Llama 2 (Touvron et al. 2023, Table 1 and the released params.json): 4096 context.
    _llama("llama-7b", "Llama 2 7B", 32, 4096, 32, 32, 11008),
    _llama("llama-70b", "Llama 2 70B", 80, 8192, 64, 8, 28672),
    _llama("llama-tiny", "Llama tiny (test model)", 2, 64, 4, 2, 176, vocab=512, seq=64),
    # Mixtral 8x7B (Jiang et al. 2024, Table 1 and the released config.json): 8 experts, top-2.
    _moe("mixtral-8x7b", "Mixtral 8x7B", 32, 4096, 32, 8, 14336, 8, 2),
    _moe("moe-tiny", "MoE tiny (test model)", 2, 64, 4, 2, 64, 4, 2, vocab=512, seq=64),
    # ViT (Dosovitskiy et al. 2021, Table 1), 224x224 ImageNet-1k head.
    _vit("vit-base", "ViT-B/16", 16, 12, 768, 12, 3072),
    _vit("vit-large", "ViT-L/16", 16, 24, 1024, 16, 4096),
    _vit("vit-huge", "ViT-H/14", 14, 32, 1280, 16, 5120),
    # Convolutional networks, torchvision parameter layout.
    _vision("resnet50", "resnet", partial(ResNet, [3, 4, 6, 3]),
            "ResNet-50: bottleneck blocks [3, 4, 6, 3], BatchNorm, 1000 classes"),
    _vision("resnet152", "resnet", partial(ResNet, [3, 8, 36, 3]),
            "ResNet-152: bottleneck blocks [3, 8, 36, 3], BatchNorm, 1000 classes"),
    _vision("wrn50-2", "wrn", partial(ResNet, [3, 4, 6, 3], 128),
            "Wide ResNet-50-2: ResNet-50 with 2x bottleneck width, 1000 classes"),
    # Tofu's wide ResNets (Wang et al., EuroSys 2019): ResNet-152 widened 4x to 10x.
    _wrn("wrn152-4", [3, 8, 36, 3], 4, "Wide ResNet-152-4"),
    _wrn("wrn152-6", [3, 8, 36, 3], 6, "Wide ResNet-152-6"),
    _wrn("wrn152-8", [3, 8, 36, 3], 8, "Wide ResNet-152-8"),
    _wrn("wrn152-10", [3, 8, 36, 3], 10, "Wide ResNet-152-10"),
    _wrn("wrn-tiny", [1, 1, 1, 1], 4, "Wide ResNet tiny (test model, stem width 8)", image_size=64,
         num_classes=10, base=8),
    # Tofu's multi-layer LSTM language models (Wang et al., EuroSys 2019): 6-10 layers, hidden 4K-8K.
    _lstm("lstm-lm", "LSTM LM 8x8192 (Tofu)", 8, 8192, vocab=10000, seq=20),
    _lstm("lstm-lm-6x4k", "LSTM LM 6x4096 (Tofu)", 6, 4096, vocab=10000, seq=20),
    _lstm("lstm-tiny", "LSTM LM tiny (test model)", 2, 64, vocab=512, seq=4),
    # T5 (Raffel et al. 2020, section 3.1 and the released configs): vocab 32128, relative positions.
    _seq2seq("t5-small", "T5-Small", "t5", layers=6, dim=512, heads=8, ffn=2048, vocab=32128, seq=512),
    _seq2seq("t5-base", "T5-Base", "t5", layers=12, dim=768, heads=12, ffn=3072, vocab=32128, seq=512),
    # BART (Lewis et al. 2020, section 2.1 and the released configs): vocab 50265, 1024 learned positions.
    _seq2seq("bart-base", "BART-base", "bart", layers=6, dim=768, heads=12, ffn=3072, vocab=50265, seq=1024,
             positions=1024),
    _seq2seq("bart-large", "BART-large", "bart", layers=12, dim=1024, heads=16, ffn=4096, vocab=50265, seq=1024,
             positions=1024),
    _seq2seq("t5-tiny", "T5 tiny (test model)", "t5", layers=2, dim=64, heads=4, ffn=128, vocab=512, seq=16, tiny=True),
    _seq2seq("bart-tiny", "BART tiny (test model)", "bart", layers=2, dim=64, heads=4, ffn=128, vocab=512, seq=16,
             positions=64, tiny=True),
    _vision("vgg16", "vgg", VGG,
            "VGG-16 (config D): 13 conv layers, 4096-wide classifier, 1000 classes"),
    _vision("cnn-tiny", "cnn", TinyCNN,
            "Tiny CNN (test model): 2 conv+BN+ReLU+pool stages, 10 classes, 32x32 images",
            image_size=32, num_classes=10),
)

# Small variants for real-execution tests; deliberately not in ZOO (not user-facing).
TEST_MODELS: dict[str, ModelSpec] = _register(
    _bert("bert-tiny", "BERT tiny (test model)", 2, 64, 4, vocab=512, max_positions=64, seq=64),
    _vit("vit-tiny", "ViT tiny (test model)", 8, 2, 64, 4, 128, image_size=32, num_classes=10),
)


def get_model(name: str) -> ModelSpec:
    """Look up a zoo model by name; unknown names raise ``InputError`` listing the known ones."""
    try:
        return ZOO[name]
    except KeyError:
        raise InputError(f"unknown model '{name}'; known: {', '.join(ZOO)}") from None


# --------------------------------------------------------------------------------------
# HuggingFace transformers configs
# --------------------------------------------------------------------------------------


def _periodic_kinds(kinds: list[type], max_period: int = 8) -> bool:
    """Whether a list of layer classes is one class, or repeats with a period of at most
    `max_period` over at least 3 periods (Jamba's Mamba and attention layers: capture groups such
    a stack by period, search/models/capture.py)."""
    n = len(kinds)
    return len(set(kinds)) == 1 or any(
        n % p == 0 and n // p >= 3 and all(kinds[i] == kinds[i + p] for i in range(n - p))
        for p in range(2, max_period + 1))


def find_blocks_attr(model: nn.Module) -> str | None:
    """Dotted path of the largest ``nn.ModuleList`` whose children are all the same class, or
    whose classes repeat with a short period (`_periodic_kinds`).

    "Largest" is by number of children, ties broken by parameter count, then by the
    shallower (earlier) path. Returns None if no such list has at least one child.
    """
    best: tuple[int, int] | None = None
    best_name: str | None = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if not _periodic_kinds([type(child) for child in mod]):
            continue
        key = (len(mod), sum(p.numel() for p in mod.parameters()))
        if best is None or key > best:
            best, best_name = key, name
    return best_name


class HFLossAdapter(nn.Module):
    """Wraps a HuggingFace model so that ``forward(inputs, targets)`` returns a scalar loss.

    lm: ``targets`` are next-token ids already (no shift, unlike HF's ``labels``);
    mlm: loss over every position; vision: ``inputs`` are pixel values, ``targets`` labels.
    """

    def __init__(self, model: nn.Module, kind: str) -> None:
        super().__init__()
        self.model = model
        self.kind = kind

    def init_weights(self) -> None:
        """Re-run HF's own initialisation (after ``to_empty``)."""
        init = getattr(self.model, "init_weights", None)
        if callable(init):
            init()

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.kind == "vision":
            logits = self.model(pixel_values=inputs).logits
            return F.cross_entropy(logits.float(), targets)
        if self.kind == "lm":
            logits = self.model(input_ids=inputs, use_cache=False).logits
        else:
            logits = self.model(input_ids=inputs).logits
        return _lm_loss(logits, targets)


def _hf_kind(config: object) -> str:
    """Pick lm / mlm / vision / seq2seq (encoder-decoder) from ``architectures``, else from the auto mappings."""
    from transformers import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING,
        MODEL_FOR_MASKED_LM_MAPPING,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING,
    )

    if getattr(config, "is_encoder_decoder", False) and type(config) in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        return "seq2seq"  # T5, BART: before the architectures, which name T5's LM head "T5WithLMHeadModel"
    for arch in getattr(config, "architectures", None) or []:
        if arch.endswith(("ForCausalLM", "LMHeadModel")):
            return "lm"
        if arch.endswith("ForMaskedLM"):
            return "mlm"
        if arch.endswith("ForImageClassification"):
            return "vision"
    for kind, mapping in (
        ("lm", MODEL_FOR_CAUSAL_LM_MAPPING),
        ("mlm", MODEL_FOR_MASKED_LM_MAPPING),
        ("vision", MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING),
    ):
        if type(config) in mapping:
            return kind
    raise InputError(
        f"HF model type '{getattr(config, 'model_type', '?')}' is neither a causal LM, a masked LM, "
        "an encoder-decoder (seq2seq) LM nor an image classifier"
    )


def _hf_build(config: object, kind: str) -> nn.Module:
    if kind == "seq2seq":
        from search.models.seq2seq import build_hf_seq2seq

        return build_hf_seq2seq(config)
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageClassification,
        AutoModelForMaskedLM,
    )

    auto = {"lm": AutoModelForCausalLM, "mlm": AutoModelForMaskedLM,
            "vision": AutoModelForImageClassification}[kind]
    try:
        model = auto.from_config(config, attn_implementation="sdpa")
    except ValueError:  # architecture without an SDPA attention path
        # name eager explicitly: the failed call has already set sdpa on `config`, so a bare
        # from_config(config) would fail again with the same error
        model = auto.from_config(config, attn_implementation="eager")
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return HFLossAdapter(model, kind)


def _first_int(config: object, *names: str) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ``ModelSpec`` for a HuggingFace ``config.json`` (a file, or a directory holding one).

    The model is built from the config with random weights (nothing is downloaded; no
    remote code). It is built once on meta here to validate the config, count parameters
    and find the repeated layer list for ``blocks_attr``.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    raw = read_json(p, "HF config")
    label = (p.parent.name or "config") if p.name == "config.json" else p.stem
    return spec_from_hf_config(raw, label, origin=str(p))


# Size fields across the families transformers ships (as the config names them, or as its
# attribute_map aliases them): each must be a positive integer where it is given. transformers
# accepts `n_layer: -3` (an empty layer list) and `n_embd: 0`; the search would price a model
# that cannot exist, so they are refused before anything is built.
HF_SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "vocab_size", "max_position_embeddings", "type_vocab_size", "image_size",
                  "patch_size", "num_channels", "num_labels", "num_experts_per_tok", "num_local_experts",
                  "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "n_ctx", "d_model", "d_ff", "d_kv",
                  "num_layers", "num_heads", "ffn_dim", "encoder_layers", "decoder_layers",
                  "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim")


def _one_line(e: BaseException) -> str:
    """transformers' validation errors wrap the cause over several lines: the cause, on one."""
    cause = e.__cause__ or e
    text = " ".join(str(cause).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _field(config: object, raw: dict, name: str) -> str:
    """The key the user wrote for a config attribute (GPT-2's `n_embd` for `hidden_size`)."""
    alias = (getattr(config, "attribute_map", None) or {}).get(name)
    return alias if alias is not None and alias in raw else name


def check_hf_config(raw: Any, prefix: str = "hf_config.") -> object:
    """Validate a HuggingFace config.json's contents against what its model family and capture
    need, without building the model: an InputError naming the field (`prefix` + its key: the API's
    "hf_config.n_layer", the CLI's "HF config 'c.json': n_layer"), else the transformers config.
    Cheap enough to run on every submission."""
    where = prefix.rstrip(".: ")
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"{prefix}model_type is missing: name the architecture, e.g. \"gpt2\" or \"llama\"")
    for key in HF_SIZE_FIELDS:
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise InputError(f"{prefix}{key} must be a positive integer, got {v!r}")

    import difflib

    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig

    known = list(CONFIG_MAPPING.keys())
    if model_type not in known:
        near = difflib.get_close_matches(model_type, known, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else " (e.g. gpt2, llama, mistral, bert, vit)"
        raise InputError(f"{prefix}model_type {model_type!r} is not a model type transformers "
                         f"{transformers.__version__} knows{hint}")
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map")}
    # transformers rejects a bad config with whatever it raises (ValueError, KeyError, TypeError, ...):
    # all are the input's
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # noqa: BLE001 - inconsistent values
        raise InputError(f"{where} is invalid for model_type {model_type!r}: {_one_line(e)}") from None
    try:
        _hf_kind(config)
    except InputError as e:
        raise InputError(f"{prefix}model_type {model_type!r} cannot be captured: {e}") from None

    # DeepSeek-V2's default config leaves the experts each token visits unset (its topk fails on
    # None): the released model's 6, said in the model's description
    if model_type == "deepseek_v2" and getattr(config, "num_experts_per_tok", 0) is None:
        config.num_experts_per_tok = 6
    # the resolved values, defaults included: what the model will be built with
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v <= 0:
            raise InputError(f"{prefix}{_field(config, raw, name)} must be a positive integer, got {v}")
    width, heads = _first_int(config, "hidden_size"), _first_int(config, "num_attention_heads")
    kv = _first_int(config, "num_key_value_heads")
    explicit_head_dim = isinstance(raw.get("head_dim"), int)  # then q/k/v are heads x head_dim wide
    if width and heads and not explicit_head_dim and width % heads:
        raise InputError(f"{prefix}{_field(config, raw, 'num_attention_heads')} ({heads}) must divide "
                         f"{_field(config, raw, 'hidden_size')} ({width}): each head takes an equal "
                         "share of the width")
    if heads and kv and kv != heads and _first_int(config, "kv_lora_rank"):
        # multi-latent attention (DeepSeek) expands its latent to a key and a value per query head;
        # transformers' attention would still repeat them as grouped-query heads, and fail
        raise InputError(f"{prefix}num_key_value_heads ({kv}) must equal {_field(config, raw, 'num_attention_heads')} "
                         f"({heads}) under multi-latent attention (kv_lora_rank): every query head has its own key "
                         "and value, expanded from the latent")
    if heads and kv and heads % kv:
        raise InputError(f"{prefix}num_key_value_heads ({kv}) must divide "
                         f"{_field(config, raw, 'num_attention_heads')} ({heads}): each key/value head "
                         "serves an equal group of query heads")
    return config


def spec_from_hf_config(raw: Any, label: str = "config", origin: str = "config") -> ModelSpec:
    """A ``ModelSpec`` for the parsed contents of a HuggingFace ``config.json``."""
    p = origin
    config = check_hf_config(raw, f"HF config '{p}': ")
    model_type = raw["model_type"]
    kind = _hf_kind(config)

    try:
        with torch.device("meta"):
            model = _hf_build(config, kind)
    except Exception as e:  # noqa: BLE001 - e.g. hidden size not divisible by the head count
        raise InputError(f"cannot build a model from HF config '{p}': {e}") from None

    stacks: tuple[str, ...] = ()
    if kind == "seq2seq":
        from search.models.seq2seq import find_stacks

        found = find_stacks(model)
        if found is None:
            raise InputError(f"HF config '{p}': the {model_type} model has no encoder and decoder layer lists to "
                             "capture as two block stacks")
        stacks = found
    blocks = None if stacks else find_blocks_attr(model)
    vocab = _first_int(config, "vocab_size") if kind != "vision" else None
    max_pos = _first_int(config, "max_position_embeddings", "n_positions", "n_ctx")
    image_size = _first_int(config, "image_size") if kind == "vision" else None
    if kind == "vision" and image_size is None:
        image_size = 224
    stack = model.get_submodule(blocks or (stacks[0] if stacks else "")) if blocks or stacks else None
    assert stack is None or isinstance(stack, nn.ModuleList)  # find_blocks_attr picks ModuleLists only
    n_layers: int | str | None = len(stack) if stack is not None else None
    if stacks:
        n_layers = "+".join(str(len(_module_list(model, s))) for s in stacks)
    arch = type(model.model).__name__
    dim = _first_int(config, "hidden_size", "n_embd", "d_model")

    spec = ModelSpec(
        name=f"hf:{model_type}:{label}",
        family="hf",
        kind=kind,
        build=partial(_hf_build, config, kind),
        default_seq_len=(min(max_pos, 4096) if max_pos else 1024) if kind != "vision" else None,
        image_size=image_size,
        vocab_size=vocab,
        description=f"HF {arch} from {p}: {n_layers} layers, d={dim}" + (
            "; num_experts_per_tok unset in the config: 6, as DeepSeek-V2's released model"
            if model_type == "deepseek_v2" and raw.get("num_experts_per_tok") is None else ""),
        blocks_attr=blocks,
        num_classes=getattr(config, "num_labels", None) if kind == "vision" else None,
        max_seq_len=max_pos if kind != "vision" and _has_learned_positions(model) else None,
        stacks=stacks,
    )
    spec._cache["params"] = sum(q.numel() for q in model.parameters())
    return spec


def _has_learned_positions(model: nn.Module) -> bool:
    """True if the model has a learned position table (so sequences longer than it fail)."""
    return any(
        isinstance(m, nn.Embedding) and ("pos" in n.rsplit(".", 1)[-1] or n.endswith("wpe"))
        for n, m in model.named_modules()
    )


def _module_list(model: nn.Module, path: str) -> nn.ModuleList:
    stack = model.get_submodule(path)
    assert isinstance(stack, nn.ModuleList)  # find_stacks picks ModuleLists only
    return stack
