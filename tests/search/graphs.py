"""Small random graphs for property tests, built directly in the IR."""

from __future__ import annotations

from search.models.graph import BlockInfo, Op, OpGraph, ParamRef, TensorRef

B, S, H = 8, 64, 512


def act(source: str | None, dims: tuple[str, ...]) -> TensorRef:
    sizes = {"batch": B, "seq": S}
    return TensorRef(source=source, shape=tuple(sizes.get(d, H) for d in dims), dims=dims)


def linear(name: str, src: TensorRef, out_label: str) -> Op:
    k = src.dims[-1]
    out = act(None, src.dims[:-1] + (out_label,))
    return Op(name=name, kind="linear", inputs=(src,), output=out,
              params=(ParamRef(name=f"{name}.weight", shape=(H, H), dims=(out_label, k)),),
              splittable=("batch", out_label, k), flops=2.0 * B * S * H * H, saves="inputs")


def pointwise(name: str, srcs: list[TensorRef], saves: str = "inputs") -> Op:
    out = act(None, srcs[0].dims)
    return Op(name=name, kind="elementwise", inputs=tuple(srcs), output=out,
              splittable=tuple(d for d in out.dims), flops=float(B * S * H), saves=saves)


def norm(name: str, src: TensorRef) -> Op:
    return Op(name=name, kind="norm", inputs=(src,), output=act(None, src.dims),
              params=(ParamRef(name=f"{name}.weight", shape=(H,), dims=(src.dims[-1],)),),
              splittable=("batch", "seq"), flops=8.0 * B * S * H, saves="inputs")


def random_dag(choices: list[tuple[int, int, int]]) -> OpGraph:
    """choices[i] = (kind, first input, second input) as small ints, reduced modulo what exists:
    chains, diamonds, residual branches and fan-out all arise."""
    ops: list[Op] = [linear("op0", act(None, ("batch", "seq", "h")), "f0")]
    for i, (kind, a, b) in enumerate(choices, start=1):
        first = ops[a % len(ops)]
        src = act(first.name, first.output.dims)
        k = kind % 4
        if k == 0:
            ops.append(linear(f"op{i}", src, f"f{i}"))
        elif k == 1:
            ops.append(pointwise(f"op{i}", [src]))
        elif k == 2:
            second = ops[b % len(ops)]
            ops.append(pointwise(f"op{i}", [src, act(second.name, second.output.dims)], saves="none"))
        else:
            ops.append(norm(f"op{i}", src))
    return OpGraph(name="random", ops=tuple(ops))


def with_batch(graph: OpGraph, batch: int) -> OpGraph:
    """The same graph for a global batch of `batch` instead of B (FLOPs scale with it)."""
    def scaled(t):
        if "batch" not in t.dims:
            return t
        return t.model_copy(update={"shape": tuple(batch if d == "batch" else s for s, d in zip(t.shape, t.dims, strict=True))})

    ops = tuple(op.model_copy(update={"inputs": tuple(scaled(t) for t in op.inputs), "output": scaled(op.output),
                                      "flops": op.flops * batch / B}) for op in graph.ops)
    return graph.model_copy(update={"ops": ops})


def stack(n_layers: int, batch: int = B) -> OpGraph:
    """embedding-like linear, then n pre-norm residual layers (norm -> linear -> add), then a head,
    for a global batch of `batch`."""
    if batch != B:
        return with_batch(stack(n_layers), batch)
    ops: list[Op] = [linear("inp", act(None, ("batch", "seq", "h")), "hidden")]
    prev = "inp"
    layers = []
    for i in range(n_layers):
        x = act(prev, ("batch", "seq", "hidden"))
        ln = norm(f"blocks.{i}.ln", x)
        fc = linear(f"blocks.{i}.fc", act(ln.name, ln.output.dims), "hidden")
        add = pointwise(f"blocks.{i}.add", [x, act(fc.name, fc.output.dims)], saves="none")
        ops += [ln, fc, add]
        layers.append((ln.name, fc.name, add.name))
        prev = add.name
    ops.append(linear("head", act(prev, ("batch", "seq", "hidden")), "vocab"))
    return OpGraph(name="stack", ops=tuple(ops), blocks=(BlockInfo(prefix="blocks", layers=tuple(layers)),))


def block_stack(n_layers: int, *, side_branch: bool = False, side_input: bool = False, last: str = "head",
                extra_output: bool = False, skip_residual: bool = False, side_output: bool = False,
                keep_input: bool = True) -> OpGraph:
    """A stack of `n_layers` identical blocks whose boundary varies the ways block reuse must
    price exactly (issue 16):
    - `side_branch`: each block forks a pointwise op off its norm that only its add reads;
    - `side_input`: each block also reads a graph input (a mask-like tensor of its own);
    - `last`: what reads the last block's output - "head" (a linear, which keeps it for its
      backward), "pointwise" (an add, which keeps nothing), "none" (nothing reads it), "two"
      (a linear and an add);
    - `extra_output`: each block's norm is also read by the next block (a second output);
    - `skip_residual`: each block from the third on also adds the output of the block two back;
    - `side_output`: the head also reads the last block's linear (an output beside the block's);
    - `keep_input`: False makes each block's first op keep only its own output, so inside the
      stack nothing keeps a block's output for backward, while a "head" after it does.
    Every op keeps the batch, so a data axis splits them all."""
    ops: list[Op] = [linear("inp", act(None, ("batch", "seq", "h")), "hidden")]
    outs = ["inp"]
    layers = []
    prev_ln: str | None = None
    for i in range(n_layers):
        x = act(outs[-1], ("batch", "seq", "hidden"))
        ln_in = [x]
        if side_input:
            ln_in.append(TensorRef(source=None, shape=(B, S, H), dims=("batch", "seq", "hidden")))
        if keep_input and len(ln_in) == 1:
            ln = norm(f"blocks.{i}.ln", x)
        else:
            ln = pointwise(f"blocks.{i}.ln", ln_in, saves="inputs" if keep_input else "output")
        fc_src = act(ln.name, ln.output.dims)
        if extra_output and prev_ln is not None:
            mix = pointwise(f"blocks.{i}.mix", [fc_src, act(prev_ln, ("batch", "seq", "hidden"))], saves="none")
        else:  # the first block has no earlier norm: it mixes in its own, so every block has the same ops
            mix = pointwise(f"blocks.{i}.mix", [fc_src, act(ln.name, ln.output.dims)], saves="none")
        fc = linear(f"blocks.{i}.fc", act(mix.name, mix.output.dims), "hidden")
        add_in = [x, act(fc.name, fc.output.dims)]
        block = [ln, mix, fc]
        if side_branch:
            br = pointwise(f"blocks.{i}.branch", [act(ln.name, ln.output.dims)])
            block.append(br)
            add_in.append(act(br.name, br.output.dims))
        if skip_residual:
            add_in.append(act(outs[-2] if len(outs) >= 2 else outs[-1], ("batch", "seq", "hidden")))
        add = pointwise(f"blocks.{i}.add", add_in, saves="none")
        block.append(add)
        ops += block
        layers.append(tuple(o.name for o in block))
        outs.append(add.name)
        prev_ln = ln.name
    h = act(outs[-1], ("batch", "seq", "hidden"))
    if last in ("head", "two"):
        head_in = act(layers[-1][2], ("batch", "seq", "hidden")) if side_output else h
        ops.append(linear("head", head_in, "vocab") if not side_output else
                   pointwise("head", [h, head_in]))
    if last in ("pointwise", "two"):
        ops.append(pointwise("tail", [h, h], saves="none"))
    if last == "none" and side_output:
        ops.append(pointwise("tail", [act(layers[-1][2], ("batch", "seq", "hidden"))]))
    return OpGraph(name="block-stack", ops=tuple(ops), blocks=(BlockInfo(prefix="blocks", layers=tuple(layers)),))


def _tiny_lm(blocks: list, batch: int, seq: int, dim: int, name: str) -> OpGraph:
    """Captured from torch: embedding (16 tokens), `blocks` in turn, head and the loss over the
    flattened tokens; the blocks a stack when there is more than one."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from search.models.capture import capture_with_blocks

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, dim)
            self.layers = nn.ModuleList(blocks)
            self.head = nn.Linear(dim, 16, bias=False)

        def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            h = self.emb(ids)
            for layer in self.layers:
                h = layer(h)
            return F.cross_entropy(self.head(h).flatten(0, 1).float(), targets.flatten(0, 1))

    with torch.device("meta"):
        model = Model()
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return capture_with_blocks(model, (ids, ids), "layers" if len(blocks) > 1 else None, name,
                               [["batch", "seq"], ["batch", "seq"]])


def moe_layer(batch: int = 8, seq: int = 4, dim: int = 8, experts: int = 4, top_k: int = 2, layers: int = 1) -> OpGraph:
    """A small language model around routed experts, captured from the zoo's MoE feed-forward:
    embedding, `layers` x (router, top-k, dispatch, two grouped GEMMs, combine), head, loss."""
    import torch

    from search.models.zoo import MoEFFN

    with torch.device("meta"):
        blocks = [MoEFFN(dim, dim, experts, top_k) for _ in range(layers)]
    return _tiny_lm(blocks, batch, seq, dim, "moe-layer")


def attention_lm(batch: int = 2, seq: int = 8, dim: int = 8, heads: int = 2, layers: int = 1,
                 causal: bool = True) -> OpGraph:
    """A small causal language model captured from torch: embedding, `layers` x (norm, q/k/v,
    fused attention, output projection, residual), head and the loss over the flattened tokens,
    the shape of every decoder the zoo has, small enough for the exhaustive reference."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(dim)
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            h = self.norm(x)
            q, k, v = (m(h).view(b, t, heads, dim // heads).transpose(1, 2) for m in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return x + self.o(a.transpose(1, 2).reshape(b, t, dim))

    with torch.device("meta"):
        blocks = [Block() for _ in range(layers)]
    return _tiny_lm(blocks, batch, seq, dim, "attention-lm")
