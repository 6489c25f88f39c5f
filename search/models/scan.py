"""State-space and linear-recurrence layers (Mamba, Mamba-2, gated delta nets, lightning attention)
as capture sees them.

transformers runs these layers' scans over the sequence through kernels (mamba_ssm, fla) where
they are installed and through a torch reference (its "slow path") where they are not, as on CPU.
The reference loops over time steps or chunks in Python: exported as written, a 2,048-token
Mamba layer unrolls into tens of thousands of ops, each too small to price, and capture takes
minutes. So for capture each scan function is swapped for one custom op standing for the whole
scan, and the layer's projections around it (Mamba's in_proj, conv1d, x_proj, dt_proj and
out_proj; the gated delta net's in_proj_qkvz and in_proj_ba; lightning attention's qkv_proj,
output_gate and out_proj) stay ordinary ops the search prices and shards as any Linear:

- ``paretoplan::selective_scan`` (Mamba, Falcon-Mamba, Jamba): the selective scan over
  ``u, dt [b, d_inner, L]``, ``A [d_inner, N]``, ``B, C [b, N, L]``, with the skip ``D`` and the
  gate ``z``; every channel has its own N-wide state.
- ``paretoplan::chunk_scan`` (Mamba-2, Falcon-H1: the SSD chunked scan): ``x [b, L, h, p]``,
  ``dt [b, L, h]``, ``A [h]``, ``B, C [b, L, g, n]``; every head has its own p x n state.
- ``paretoplan::gated_delta`` (Qwen3-Next): the chunked gated delta rule over ``q, k [b, L, hk, dk]``,
  ``v [b, L, hv, dv]``, decay ``g`` and rate ``beta [b, L, hv]``; a dk x dv state per value head.
- ``paretoplan::lightning_attention`` (MiniMax): block-wise linear attention with a per-head
  decay over ``q, k, v [b, h, L, d]``; a d x d state per head.

Each op's FLOPs and the bytes autograd keeps for backward follow the torch reference that runs
(``scan_flops``, ``scan_workspace``): the per-step states and decays it materialises, in fp32.
The layers' heads (channels for Mamba) are independent: each has its own state, so the op could
split them over a tensor axis; the executor cannot (transformers' layer code reshapes with its
full head counts and runs its depthwise conv1d, which no parallel style shards), so the search
replicates these ops on tensor axes and splits them only by batch (search/prices/mesh.py).
The custom ops exist for capture on the meta device only.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType, ModuleType
from typing import Any

import torch
from torch import nn

SCAN_OPS: dict[str, str] = {}  # custom op target -> what it stands for (for messages)


@torch.library.custom_op("paretoplan::selective_scan", mutates_args=())
def selective_scan(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None) -> torch.Tensor:
    raise RuntimeError("paretoplan::selective_scan stands for Mamba's scan during capture on the meta device only")


@selective_scan.register_fake
def _selective_scan_shape(u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                          D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None) -> torch.Tensor:
    return u.new_empty(u.shape)


@torch.library.custom_op("paretoplan::chunk_scan", mutates_args=())
def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               D: torch.Tensor | None, dt_bias: torch.Tensor | None, chunk_size: int) -> torch.Tensor:
    raise RuntimeError("paretoplan::chunk_scan stands for Mamba-2's scan during capture on the meta device only")


@chunk_scan.register_fake
def _chunk_scan_shape(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                      D: torch.Tensor | None, dt_bias: torch.Tensor | None, chunk_size: int) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.float32)  # the reference computes and returns fp32


@torch.library.custom_op("paretoplan::gated_delta", mutates_args=())
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                chunk_size: int) -> torch.Tensor:
    raise RuntimeError("paretoplan::gated_delta stands for the gated delta rule during capture on the meta device only")


@gated_delta.register_fake
def _gated_delta_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       chunk_size: int) -> torch.Tensor:
    return v.new_empty(v.shape)


@torch.library.custom_op("paretoplan::lightning_attention", mutates_args=())
def lightning_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> torch.Tensor:
    raise RuntimeError("paretoplan::lightning_attention stands for MiniMax's linear attention during capture on "
                       "the meta device only")


@lightning_attention.register_fake
def _lightning_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> torch.Tensor:
    return v.new_empty(v.shape)


# ---- the swaps: transformers' scan functions, by the name its modeling modules give them ----------
def _selective(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               D: torch.Tensor | None = None, z: torch.Tensor | None = None, delta_bias: torch.Tensor | None = None,
               delta_softplus: bool = False, return_last_state: bool = False, **_: Any) -> torch.Tensor:
    out: torch.Tensor = torch.ops.paretoplan.selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias)
    return out


def _chunked(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
             **_: Any) -> torch.Tensor:
    out: torch.Tensor = torch.ops.paretoplan.chunk_scan(hidden_states, dt, A, B, C, D, dt_bias, int(chunk_size))
    return out


def _delta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
           chunk_size: int = 64, **_: Any) -> tuple[torch.Tensor, None]:
    out: torch.Tensor = torch.ops.paretoplan.gated_delta(query, key, value, g, beta, int(chunk_size))
    return out, None


_FUNCTIONS = {"mamba_selective_scan": _selective, "mamba2_chunk_scan": _chunked,
              "torch_chunk_gated_delta_rule": _delta}


def _lightning_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any
                       ) -> tuple[torch.Tensor, None]:
    """MiniMaxLightningAttention.forward without a cache, its block loop as one op (transformers
    5's forward, the projections, norm and gate as written there)."""
    b, seq, _ = hidden_states.shape
    at: Any = self  # transformers' module: its sizes are ints, its parts modules and functions
    heads, head_dim = int(at.num_attention_heads), int(at.head_dim)
    qkv = at.act_fn(at.qkv_proj(hidden_states)).reshape(b, seq, heads, 3 * head_dim)
    q, k, v = (t.transpose(1, 2) for t in torch.split(qkv, head_dim, dim=3))
    out = torch.ops.paretoplan.lightning_attention(q, k, v, int(at.block_size))
    out = out.transpose(1, 2).reshape(b, seq, heads * head_dim)
    out = torch.sigmoid(at.output_gate(hidden_states)) * at.norm(out)
    return at.out_proj(out), None


_FORWARDS = {"MiniMaxLightningAttention": _lightning_forward}


def captured_kind(module: nn.Module) -> bool:
    """Whether capture swaps this module's scan for one op (its modeling module defines a scan
    function swapped here, or its forward is)."""
    if type(module).__name__ in _FORWARDS:
        return True
    mod = sys.modules.get(type(module).__module__)
    return mod is not None and any(callable(getattr(mod, f, None)) for f in _FUNCTIONS)


@contextmanager
def scans_as_ops(model: nn.Module) -> Iterator[list[str]]:
    """Within the block, every scan of `model`'s state-space and linear-recurrence layers runs as
    one custom op (for capture on meta); yields the paths of the modules swapped by forward."""
    swapped: list[tuple[ModuleType, str, object]] = []
    forwards: list[tuple[str, nn.Module]] = []
    seen: set[str] = set()
    for name, m in model.named_modules():
        fwd = _FORWARDS.get(type(m).__name__)
        if fwd is not None:
            m.forward = MethodType(fwd, m)
            forwards.append((name, m))
        modname = type(m).__module__
        if modname in seen:
            continue
        seen.add(modname)
        mod = sys.modules.get(modname)
        for fname, repl in _FUNCTIONS.items():
            if mod is not None and callable(getattr(mod, fname, None)):
                swapped.append((mod, fname, getattr(mod, fname)))
                setattr(mod, fname, repl)
    try:
        yield [name for name, _ in forwards]
    finally:
        for mod, fname, orig in swapped:
            setattr(mod, fname, orig)
        for _, m in forwards:
            del m.forward


# ---- arithmetic of the torch references -----------------------------------------------------------
def selective_scan_flops(batch: int, channels: int, seq: int, state: int) -> float:
    """Forward FLOPs of the selective scan: per channel, step and state element the discretised
    decay exp(A dt) (2), dt B (1), its product with u (1), the state update (a multiply and an
    add) and the read-out against C (a multiply and an add); per channel and step dt's bias and
    softplus (3), the D skip (2) and the SiLU gate (5)."""
    return float(batch * channels * seq) * (8.0 * state + 10.0)


def chunk_scan_flops(batch: int, seq: int, heads: int, head_dim: int, state: int, chunk: int) -> float:
    """Forward FLOPs of the SSD chunked scan as the reference computes it: within each chunk the
    C B^T scores (Q x Q per head, over the state), their decay mask and product with x (over the
    head dim); each chunk's state from B and x; the chunk-to-chunk recurrence of the states; the
    read-out of the carried states through C."""
    chunks = math.ceil(seq / chunk)
    padded = chunks * chunk
    intra = 2.0 * padded * chunk * heads * (state + head_dim) + padded * chunk * heads
    states = 2.0 * padded * heads * head_dim * state * 2
    carry = 2.0 * (chunks + 1) ** 2 * heads * head_dim * state
    return float(batch) * (intra + states + carry + 6.0 * padded * heads * head_dim)


def gated_delta_flops(batch: int, seq: int, heads: int, k_dim: int, v_dim: int, chunk: int) -> float:
    """Forward FLOPs of the chunked gated delta rule: per chunk and value head the two Q x Q
    products over the keys (k_beta k^T and q k^T), the triangular solves for the new values and
    decayed keys, the intra-chunk product with the new values, and the three state products
    (reading the carried state twice, writing it once: dk x dv each)."""
    padded = math.ceil(seq / chunk) * chunk
    per_token = 4.0 * chunk * k_dim + chunk * (k_dim + v_dim) + 2.0 * chunk * v_dim + 6.0 * k_dim * v_dim
    return float(batch * heads * padded) * per_token


def lightning_flops(batch: int, heads: int, seq: int, head_dim: int, block: int) -> float:
    """Forward FLOPs of block-wise lightning attention (blocks of `block` tokens, the last one
    shorter, not padded), per head and block of s tokens: Q K^T (2 s^2 d), its decay mask (s^2)
    and product with V (2 s^2 d); Q, decayed, against the carried K^T V state (s d + 2 s d^2); the
    block's K^T V, its keys decayed (s d + 2 s d^2); the state's decay and update (2 d^2)."""
    full, rest = divmod(seq, block)
    d = head_dim
    per_head = sum(4.0 * s * s * d + s * s + 4.0 * s * d * d + 2.0 * s * d + 2.0 * d * d
                   for s in [block] * full + ([rest] if rest else []))
    return float(batch * heads) * per_head


# Elements autograd keeps for backward beyond the op's inputs and output, per element of its
# output, in fp32 (the references cast to float): the tensors the reference's own autograd saves.
def selective_scan_workspace(state: int) -> float:
    """exp(A dt), dt B and the state after every step: three [b, d_inner, L, N] tensors."""
    return 3.0 * state


def chunk_scan_workspace(head_dim: int, state: int, chunk: int) -> float:
    """The decay mask, the scores and their product ([b, c, Q, Q, h], three), B and C repeated to
    the heads in fp32, x times dt, and each chunk's state before and after the carry."""
    return 3.0 * chunk / head_dim + 2.0 * state / head_dim + 2.0 + 2.0 * state / chunk


def gated_delta_workspace(k_dim: int, v_dim: int, chunk: int) -> float:
    """Per value head: the pairwise decays, the UT system and the intra-chunk scores ([Q, Q] per
    chunk, three), q, k, v and the keys scaled by beta in fp32, and the state carried into every
    chunk (dk x dv per chunk)."""
    return 3.0 * chunk / v_dim + 3.0 * k_dim / v_dim + 2.0 + k_dim / chunk


def lightning_workspace(head_dim: int, block: int, seq: int) -> float:
    """Per head: the intra-block scores and their decayed copy ([s, s] per block of s tokens, two)
    and the K^T V state carried into every block (head_dim x head_dim per block)."""
    s = min(block, seq)
    return 2.0 * s / head_dim + 2.0 * head_dim / s + 1.0
