"""Context parallelism: each rank of the context mesh dimension holds a share of every sequence's
tokens, and attention runs as ring attention over that dimension.

torch's own ``context_parallel`` (torch.distributed.tensor.experimental) swaps
``scaled_dot_product_attention`` for ring attention only where SDPA dispatches to the flash,
memory-efficient or cuDNN kernels (CUDA); on a CPU process with gloo SDPA runs
``_scaled_dot_product_flash_attention_for_cpu``, which it refuses. So the executor does what it
does, with torch primitives that run on gloo as on NCCL: within the step it swaps
``F.scaled_dot_product_attention`` for `ring_attention` and the model's rotary tables for the
rank's own positions (the load-balanced sharding torch uses: the sequence in 2 x cp chunks, rank
r holding chunks r and 2cp - 1 - r, so that causal attention gives every rank the same work).

Ring attention keeps the rank's queries and passes the K/V shards around the ring: forward, n - 1
hops of K and V, each block merged by its log-sum-exp; backward, n - 1 hops of K and V with the
gradients accumulated for them so far, and one last hop of those gradients home to the block's
owner - what the cost model prices (search/prices/costmodel.py, _ring_attention). A hop is an
``all_to_all_single`` in which each rank sends only to its next neighbour (torch's ring rotates
its K/V gradients the same way), so the collective count of a step can be checked against the plan.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import search.models.zoo as zoo


def shard_positions(seq_len: int, rank: int, size: int) -> torch.Tensor:
    """The positions rank `rank` of `size` holds: chunks r and 2 size - 1 - r of 2 size."""
    if seq_len % (2 * size):
        raise ValueError(f"sequence {seq_len} does not cut into 2 x {size} equal chunks")
    c = seq_len // (2 * size)
    first = torch.arange(rank * c, (rank + 1) * c)
    last = torch.arange((2 * size - 1 - rank) * c, (2 * size - rank) * c)
    return torch.cat([first, last])


class Ring:
    """The context group as a ring: this rank, its size and every rank's positions."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int, seq_len: int) -> None:
        self.group, self.rank, self.size = group, rank, size
        self.positions = [shard_positions(seq_len, r, size) for r in range(size)]

    def hop(self, t: torch.Tensor, async_op: bool = False) -> tuple[torch.Tensor, Any]:
        """Send `t` to the next rank, receive the previous rank's: one all-to-all whose only
        non-empty splits are those two (along dim 0)."""
        rows = t.shape[0]
        send = [0] * self.size
        recv = [0] * self.size
        send[(self.rank + 1) % self.size] = rows
        recv[(self.rank - 1) % self.size] = rows
        out = torch.empty_like(t)
        work = dist.all_to_all_single(out, t.contiguous(), recv, send, group=self.group, async_op=async_op)
        return out, work


def _scores(q: torch.Tensor, k: torch.Tensor, pq: torch.Tensor, pk: torch.Tensor, causal: bool,
            scale: float) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill((pk[None, :] > pq[:, None]).to(s.device), float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, causal: bool,
                scale: float) -> torch.Tensor:
        n, me = ring.size, ring.rank
        kv = torch.stack([k, v])
        out = lse = None
        for i in range(n):
            owner = (me - i) % n
            nxt, work = ring.hop(kv, async_op=True) if i < n - 1 else (None, None)  # overlaps this block
            s = _scores(q, kv[0], ring.positions[me], ring.positions[owner], causal, scale)
            b_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            p = torch.exp(s - torch.where(torch.isinf(b_lse), torch.zeros_like(b_lse), b_lse))
            b_out = torch.matmul(p, kv[1])
            if out is None or lse is None:  # the rank's own block: every query sees itself, lse finite
                out, lse = b_out, b_lse
            else:
                new = torch.logaddexp(lse, b_lse)
                out = out * torch.exp(lse - new) + b_out * torch.exp(b_lse - new)
                lse = new
            if work is not None and nxt is not None:
                work.wait()
                kv = nxt
        assert out is not None and lse is not None
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.scale = ring, causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal, scale = ctx.ring, ctx.causal, ctx.scale
        n, me = ring.size, ring.rank
        d = (dout * out).sum(dim=-1, keepdim=True)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv)
        for i in range(n):
            owner = (me - i) % n
            p = torch.exp(_scores(q, kv[0], ring.positions[me], ring.positions[owner], causal, scale) - lse)
            dv = torch.matmul(p.transpose(-2, -1), dout)
            ds = p * (torch.matmul(dout, kv[1].transpose(-2, -1)) - d)
            dq = dq + torch.matmul(ds, kv[0]) * scale
            dk = torch.matmul(ds.transpose(-2, -1), q) * scale
            dkv = dkv + torch.stack([dk, dv])
            if i < n - 1:  # the next block, with what this rank adds to its gradients, in one hop
                both, _ = ring.hop(torch.cat([kv, dkv]))
                kv, dkv = both[:2], both[2:]
            else:  # the gradients of the block held last go home to its owner, the next rank
                dkv, _ = ring.hop(dkv)
        return dq, dkv[0], dkv[1], None, None, None


def ring_attention(ring: Ring, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s signature, over the ring (no mask, no dropout)."""
    if attn_mask is not None or dropout_p:
        raise NotImplementedError("ring attention here takes no attention mask and no dropout")
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return _RingAttention.apply(q, k, v, ring, is_causal, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))


@contextlib.contextmanager
def context_parallel(ring: Ring) -> Iterator[None]:
    """Within it the model's attention is ring attention and its rotary tables are this rank's
    positions (the zoo computes them per call from the local length, which would be 0..t/cp - 1)."""
    sdpa, rotary = F.scaled_dot_product_attention, zoo._rotary
    mine = ring.positions[ring.rank]

    def ring_sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
        return ring_attention(ring, *args, **kwargs)

    def local_rotary(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if seq_len != len(mine):
            raise RuntimeError(f"rotary tables for {seq_len} tokens, but this context rank holds {len(mine)}")
        cos, sin = rotary(int(mine.max()) + 1, head_dim, theta, device)
        return cos[mine.to(device)], sin[mine.to(device)]

    F.scaled_dot_product_attention = ring_sdpa
    zoo._rotary = local_rotary
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        zoo._rotary = rotary
