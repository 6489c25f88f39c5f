"""Tests for search.models.capture (torch.export on meta -> OpGraph) and the graph JSON format.

The captured graph is what the whole search prices, so these tests pin it to the real module:
parameter counts, one IR op per Linear / attention / convolution that runs, FLOPs worked out
from the module's weights, dimension labels that survive reshapes, and the repeated-block
shortcut for a 96-layer model. Captures are cached per (model, batch, seq) for the module.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from search.errors import InputError
from search.models import capture
from search.models.capture import capture_model, capture_module
from search.models.graph import OpGraph, load_graph
from search.models.zoo import get_model

# (model, batch, seq) as the brief fixes them; vision models take no seq.
CASES = [
    ("gpt2-tiny", 2, 16),
    ("llama-tiny", 2, 16),
    ("bert-base", 2, 16),
    ("vit-base", 2, None),
    ("resnet50", 2, None),
    ("cnn-tiny", 2, None),
]
TRANSFORMERS = {"gpt2-tiny", "llama-tiny", "bert-base", "vit-base"}

def _param_case(name: str, batch: int, seq: int | None):
    # vit-base guards a fixed bug: its cls_token is read through .expand(batch, ...), and the
    # parameter must keep its stored shape [1, 1, 768], not the view's
    return pytest.param(name, batch, seq, id=name)


@functools.cache
def captured(name: str, batch: int, seq: int | None) -> OpGraph:
    return capture_model(get_model(name), batch, seq)


@functools.cache
def meta_module(name: str) -> nn.Module:
    with torch.device("meta"):
        return get_model(name).build()


@functools.cache
def linear_calls(name: str, batch: int, seq: int | None) -> tuple[int, int]:
    """(number of nn.Linear forward calls, number of distinct nn.Linear modules that ran) in one
    meta forward pass of a fresh meta build, counted with forward hooks."""
    spec = get_model(name)
    with torch.device("meta"):
        m = spec.build()
    calls: list[int] = []
    handles = [mod.register_forward_hook(lambda mod, args, out: calls.append(id(mod)))
               for mod in m.modules() if isinstance(mod, nn.Linear)]
    try:
        with torch.no_grad():
            m(*spec.example_inputs(batch, seq, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return len(calls), len(set(calls))


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize(("name", "batch", "seq"), [_param_case(*c) for c in CASES])
def test_param_count_matches_module(name: str, batch: int, seq: int | None) -> None:
    g = captured(name, batch, seq)
    spec = get_model(name)
    module_count = sum(p.numel() for p in meta_module(name).parameters())  # tied weights once
    assert spec.param_count() == module_count
    assert g.param_count() == module_count


@pytest.mark.parametrize(("name", "batch", "seq"), [_param_case(*c) for c in CASES])
def test_owned_params_have_module_shapes(name: str, batch: int, seq: int | None) -> None:
    """Every parameter is owned by exactly one op, under one of its names (a tied weight may
    be named after either module) and with its real shape."""
    g = captured(name, batch, seq)
    m = meta_module(name)
    alias = {n: p for n, p in m.named_parameters(remove_duplicate=False)}
    owned = [p for op in g.ops for p in op.params if p.owner]
    assert all(p.name in alias for p in owned), [p.name for p in owned if p.name not in alias]
    ids = Counter(id(alias[p.name]) for p in owned)
    assert set(ids) == {id(p) for p in m.parameters()}
    assert all(k == 1 for k in ids.values())
    wrong = [(p.name, p.shape, tuple(alias[p.name].shape)) for p in owned if p.shape != tuple(alias[p.name].shape)]
    assert wrong == []


# ---------------------------------------------------------------- op counts


@pytest.mark.parametrize(("name", "batch", "seq"), CASES, ids=[c[0] for c in CASES])
def test_one_linear_op_per_linear_call(name: str, batch: int, seq: int | None) -> None:
    g = captured(name, batch, seq)
    kinds = Counter(op.kind for op in g.ops)
    n_calls, n_modules = linear_calls(name, batch, seq)
    assert n_calls == n_modules  # no Linear module runs twice in the zoo models
    assert kinds["linear"] == n_calls
    # every nn.Linear in these models runs (BERT has no pooler), GPT-2's tied lm_head included
    assert n_modules == sum(isinstance(m, nn.Linear) for m in meta_module(name).modules())


def test_linear_counts_by_hand() -> None:
    # gpt2-tiny: 2 layers x (q, k, v, o, fc1, fc2) + lm_head = 13
    # llama-tiny: 2 layers x (q, k, v, o, gate, up, down) + lm_head = 15
    # bert-base: 12 x 6 + head_dense + lm_head = 74; vit-base: 12 x 6 + head = 73
    # resnet50 and cnn-tiny: the classifier fc only
    expected = {"gpt2-tiny": 13, "llama-tiny": 15, "bert-base": 74, "vit-base": 73, "resnet50": 1, "cnn-tiny": 1}
    for name, batch, seq in CASES:
        assert sum(op.kind == "linear" for op in captured(name, batch, seq).ops) == expected[name], name


@pytest.mark.parametrize(("name", "batch", "seq"), [c for c in CASES if c[0] in TRANSFORMERS],
                         ids=[c[0] for c in CASES if c[0] in TRANSFORMERS])
def test_one_attention_op_per_layer(name: str, batch: int, seq: int | None) -> None:
    g = captured(name, batch, seq)
    spec = get_model(name)
    n_layers = len(getattr(meta_module(name), spec.blocks_attr))
    assert sum(op.kind == "attention" for op in g.ops) == n_layers
    # and the block annotation lists every layer
    assert len(g.blocks) == 1 and len(g.blocks[0].layers) == n_layers


@pytest.mark.parametrize(("name", "batch", "seq"), CASES, ids=[c[0] for c in CASES])
def test_one_conv_op_per_conv_module(name: str, batch: int, seq: int | None) -> None:
    g = captured(name, batch, seq)
    n_conv = sum(isinstance(m, nn.Conv2d) for m in meta_module(name).modules())
    assert sum(op.kind == "conv" for op in g.ops) == n_conv


def test_resnet50_conv_count() -> None:
    # stem 1 + 16 bottlenecks x 3 convs + 4 downsample convs (first block of each stage) = 53
    assert sum(op.kind == "conv" for op in captured("resnet50", 2, None).ops) == 53


# ---------------------------------------------------------------- repeated blocks


@pytest.mark.slow
def test_gpt3_175b_block_replication() -> None:
    g = captured("gpt3-175b", 8, None)  # default seq 2048; only two layers are exported
    assert g.meta["seq_len"] == 2048 and g.meta["global_batch"] == 8
    assert len(g.blocks) == 1
    block = g.blocks[0]
    assert block.prefix == "blocks"
    assert len(block.layers) == 96
    assert len({len(layer) for layer in block.layers}) == 1
    assert g.param_count() == 174_604_259_328
    assert get_model("gpt3-175b").param_count() == 174_604_259_328
    assert list(block.layers[57]) == [n.replace("blocks.1", "blocks.57") for n in block.layers[1]]
    # the replicated layer is wired to the previous one and owns its own parameters
    first = g.op(block.layers[57][0])
    assert first.inputs[0].source == block.layers[56][-1]
    names57 = {p.name for n in block.layers[57] for p in g.op(n).params}
    assert names57 and all(p.startswith("blocks.57.") for p in names57)
    assert sum(op.kind == "attention" for op in g.ops) == 96
    # 96 layers x 6 Linear + the tied lm head
    assert sum(op.kind == "linear" for op in g.ops) == 96 * 6 + 1


# ---------------------------------------------------------------- FLOPs


def test_gpt2_tiny_linear_flops() -> None:
    batch, seq = 2, 16
    g = captured("gpt2-tiny", batch, seq)
    tokens = batch * seq  # 32
    m = meta_module("gpt2-tiny")
    weights = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, nn.Linear))
    # by hand (dim 64, mlp 256, vocab 512, 2 layers):
    #   per layer q,k,v,o: 4 * 64*64 = 16384; fc1 + fc2: 2 * 64*256 = 32768 -> 49152
    #   2 layers: 98304; tied lm_head 512*64 = 32768 -> 131072 weight elements (no biases)
    assert weights == 131072
    linear_flops = sum(op.flops for op in g.ops if op.kind == "linear")
    # 2 FLOPs per multiply-add, one multiply-add per weight element per token:
    #   2 * 32 * 131072 = 8_388_608
    assert linear_flops == 2 * tokens * weights == 8_388_608


# ---------------------------------------------------------------- labels


def test_gpt2_tiny_labels() -> None:
    g = captured("gpt2-tiny", 2, 16)
    linears = [op for op in g.ops if op.kind == "linear"]
    for op in linears:
        for t in op.inputs:
            assert t.dims[0] == g.batch_label == "batch", (op.name, t.dims)
    emb = next(op for op in g.ops if op.kind == "embedding" and op.inputs)  # the token embedding
    residual = emb.output.dims[-1]
    for layer in g.blocks[0].layers:
        qkv = [g.op(n) for n in layer if n.split(":")[0].rsplit(".", 1)[-1] in ("q", "k", "v")
               and g.op(n).kind == "linear"]
        assert len(qkv) == 3
        for op in qkv:
            assert op.inputs[0].dims[-1] == residual, op.name
        # q's output is viewed to [b, t, heads, hd], transposed, attended, transposed back and
        # reshaped to [b, t, heads*hd]: the o projection reads it under q's output label
        q = qkv[0]
        o = next(g.op(n) for n in layer if n.split(":")[0].endswith(".attn.o"))
        assert o.inputs[0].dims[-1] == q.output.dims[-1]
        # o and fc2 write back into the residual stream
        assert o.output.dims[-1] == residual
    # the lm head reads the residual stream too
    head = next(op for op in linears if op.name.startswith("lm_head"))
    assert head.inputs[0].dims[-1] == residual


# ---------------------------------------------------------------- errors: the user's model or a bug
# A model torch.export cannot trace, or one that uses a pattern the translation does not
# support, is the user's input (InputError, a 422 in the service); anything else escaping the
# translation is a bug in it and must surface as itself, never dressed up as bad input.


class _SoftmaxOfParameter(nn.Module):  # learned mixing weights: softmax reads a parameter only
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.ones(4))
        self.proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.proj(x) * torch.softmax(self.mix, 0)).sum()


class _ComputedConvWeight(nn.Module):  # a hypernetwork: the conv weight is an activation
    def __init__(self) -> None:
        super().__init__()
        self.hyper = nn.Linear(4, 3 * 3 * 3 * 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.hyper(z).view(3, 3, 3, 3)).sum()


class _LearnedQuery(nn.Module):  # Perceiver-style latents: the attention query is a parameter
    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.ones(1, 2, 3, 4))
        self.kv = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kv(x).view(x.shape[0], 2, -1, 4)
        return F.scaled_dot_product_attention(self.latents.expand(x.shape[0], -1, -1, -1), k, k).sum()


class _DataDependentShape(nn.Module):  # boolean-mask indexing: the output's size depends on the data
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return y[y > 0].sum()


class _BadView(nn.Module):  # the forward itself fails: torch.export cannot trace it
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).view(3, -1).sum()


def _capture_on_meta(module: nn.Module, *shapes: tuple[int, ...]) -> OpGraph:
    return capture_module(module.to("meta"), tuple(torch.ones(s, device="meta") for s in shapes), name="mine")


@pytest.mark.parametrize(("module", "shapes", "says"), [
    pytest.param(_SoftmaxOfParameter(), [(2, 8)], "softmax in the top-level module: it reads parameters only",
                 id="softmax-of-parameter"),
    pytest.param(_ComputedConvWeight(), [(2, 3, 8, 8), (4,)], "its weight is an activation, not a parameter",
                 id="computed-conv-weight"),
    pytest.param(_LearnedQuery(), [(2, 4, 4)], "its query is the parameter latents, not an activation",
                 id="learned-query"),
    pytest.param(_DataDependentShape(), [(2, 4)], "shape depends on the data", id="data-dependent-shape"),
    pytest.param(_BadView(), [(2, 4)], "torch.export failed: RuntimeError", id="export-fails"),
])
def test_unsupported_user_model_is_input_error(module: nn.Module, shapes: list[tuple[int, ...]], says: str) -> None:
    with pytest.raises(InputError) as exc:
        _capture_on_meta(module, *shapes)
    msg = str(exc.value)
    assert msg.startswith("cannot capture mine: ") and says in msg and "\n" not in msg


@pytest.mark.parametrize("error", [AssertionError, KeyError, IndexError, TypeError, ValueError])
def test_bug_in_translation_is_not_input_error(monkeypatch: pytest.MonkeyPatch, error: type[Exception]) -> None:
    """A failure inside the walk that no user pattern explains propagates as itself."""
    def broken_emit(*args: object, **kwargs: object) -> None:
        raise error("a bug in the translation")

    monkeypatch.setattr(capture._Capture, "emit", broken_emit)
    with pytest.raises(error) as exc:
        _capture_on_meta(nn.Sequential(nn.Linear(4, 4)), (2, 4))
    assert not isinstance(exc.value, InputError)


# ---------------------------------------------------------------- JSON


def test_json_round_trip(tmp_path: Path) -> None:
    g = captured("gpt2-tiny", 2, 16)
    assert OpGraph.model_validate_json(g.to_json()) == g
    g.dump(tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json") == g


def test_json_round_trip_with_blocks() -> None:
    g = captured("llama-tiny", 2, 16)
    h = OpGraph.model_validate_json(g.to_json())
    assert h == g
    assert h.blocks == g.blocks


def _elementwise(name: str, source: str | None) -> dict:
    return {
        "name": name,
        "kind": "elementwise",
        "inputs": [{"source": source, "shape": [2, 3], "dims": ["batch", "h"]}],
        "output": {"shape": [2, 3], "dims": ["batch", "h"]},
        "splittable": ["batch"],
    }


def _graph(*ops: dict) -> dict:
    return {"format": "paretoplan.graph/1", "name": "t", "ops": list(ops)}


def _load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "graph.json"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_graph(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    assert str(path) in msg
    return msg


def test_load_graph_valid_hand_built(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_graph(_elementwise("a", None), _elementwise("b", "a"))))
    g = load_graph(path)
    assert [op.name for op in g.topological()] == ["a", "b"]


def test_load_graph_cycle(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, json.dumps(_graph(_elementwise("a", "b"), _elementwise("b", "a"))))
    assert "cycle" in msg


def test_load_graph_self_loop(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, json.dumps(_graph(_elementwise("a", "a"))))
    assert "cycle" in msg


def test_load_graph_malformed_json(tmp_path: Path) -> None:
    text = json.dumps(_graph(_elementwise("a", None)))[:-5]
    msg = _load_error(tmp_path, text)
    assert "not valid JSON" in msg


def test_load_graph_missing_field(tmp_path: Path) -> None:
    op = _elementwise("a", None)
    del op["output"]
    msg = _load_error(tmp_path, json.dumps(_graph(op)))
    assert "output" in msg


def test_load_graph_unknown_source(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, json.dumps(_graph(_elementwise("a", None), _elementwise("b", "ghost"))))
    assert "ghost" in msg and "unknown op" in msg


def test_load_graph_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as exc:
        load_graph(tmp_path / "nope.json")
    assert "\n" not in str(exc.value)


@pytest.mark.slow  # builds, exports and captures an HF Llama: ~3 s
def test_hf_llama_config_with_higher_order_ops(tmp_path):
    """HF Llama computes its rotary tables under torch.no_grad, which export wraps in a
    higher-order op with a subgraph; capture walks into it instead of failing."""
    from transformers import LlamaConfig

    from search.algorithm.chain import find_chain
    from search.models.zoo import model_from_hf_config

    path = tmp_path / "config.json"
    LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1000).to_json_file(str(path))
    spec = model_from_hf_config(path)
    g = capture_model(spec, 2, 32)
    assert g.param_count() == spec.param_count()
    assert sum(op.kind == "attention" for op in g.ops) == 4
    assert find_chain(g) is not None


class _UpcastNorm(nn.Module):
    """RMSNorm's shape: upcast, normalise, scale, cast back (HF's LlamaRMSNorm, Falcon-H1's)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class _PreNormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = _UpcastNorm()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return y + self.proj(self.norm(y))  # the residual is read after the norm's cast of it


def test_a_reader_outside_a_no_op_cast_s_module_reads_the_tensor_itself():
    """`x.to(torch.float32)` of an fp32 tensor returns x itself, and export then hands x's later
    readers (the residual add after the norm) the cast's node. Read through the cast, Falcon-H1's
    residual add read the norm's module, where the executor converted it, and failed on
    mismatched shards: the add reads x itself. The cast stays an op of the norm for the norm's own
    readers (under bf16 autocast the same cast of a bf16 tensor is real and priced)."""
    g = capture_module(_PreNormBlock().to("meta"), (torch.ones(2, 4, 8, device="meta"),), name="mine",
                       input_labels=[["batch", "seq", "h"]])
    casts = [op for op in g.ops if op.target in ("aten.to.dtype", "aten._to_copy.default")]
    assert casts and all(op.module == "norm" for op in casts), [(op.name, op.module) for op in g.ops]
    add = next(op for op in g.ops if op.target.startswith("aten.add") and not op.module)
    relu = next(op for op in g.ops if op.target.startswith("aten.relu"))
    assert relu.name in [t.source for t in add.inputs]
    inside = [op for op in g.ops if op.module == "norm" and any(t.source == casts[0].name for t in op.inputs)]
    assert inside, "the norm's own ops read its cast"


def test_a_top_level_cast_before_the_loss_stays_an_op():
    """GPT's `logits.float()` before the loss is captured (fp32) as a cast of an fp32 tensor; the loss
    reads it in the same (top-level) module, so the op stays: under bf16 it converts bf16 logits."""
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = capture_model(get_model("gpt2-tiny"), 4, 64)
    loss = next(op for op in g.ops if op.kind == "loss")
    src = {op.name: op for op in g.ops}[loss.inputs[0].source]
    assert src.target == "aten.to.dtype", src


class _FlatLinear(nn.Module):
    """GPT-2's Conv1D: the weight stored [in, out], the input flattened inside the forward."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class _ScaledEmbedding(nn.Embedding):
    """Gemma's embedding: the lookup scaled inside the module's own forward."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * 2.0


class _TiedHeadLM(nn.Module):
    """BERT's masked-LM head: a square transform, then a decoder tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = _ScaledEmbedding(32, 8)
        self.mlp = _FlatLinear(8, 16)
        self.proj = nn.Linear(16, 8)
        self.transform = nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.proj(torch.relu(self.mlp(x)))
        return F.linear(self.transform(x), self.embed.weight)


@functools.cache
def _tied_head_graph() -> OpGraph:
    return capture_module(_TiedHeadLM().to("meta"), (torch.ones(2, 4, dtype=torch.long, device="meta"),),
                          name="mine", input_labels=[["batch", "seq"]])


def test_only_modules_a_parallel_style_shards_may_split_their_parameters():
    """GPT-2's Conv1D (an addmm on a weight stored [in, out]) and an embedding scaled inside its own
    forward have no parallel style, so the executor refused every plan splitting them on a tensor
    axis: capture marks them, and the search keeps them whole there (but splits their batch)."""
    from search.prices.mesh import DATA, TENSOR, MeshAxis, axis_choices

    g = _tied_head_graph()
    styled = {op.module: op.styled for op in g.ops if op.params}
    assert styled["mlp"] is False and styled["embed"] is False, styled
    assert styled["proj"] is True and styled["transform"] is True, styled
    tensor, data = MeshAxis("tp", 2, 1, TENSOR), MeshAxis("dp", 2, 2, DATA)
    for op in g.ops:
        if op.params and not op.styled:
            assert axis_choices(op, tensor, g.batch_label) == [None], op.name
            assert axis_choices(op, data, g.batch_label) == [g.batch_label], op.name
    proj = next(op for op in g.ops if op.module == "proj")
    assert len(axis_choices(proj, tensor, g.batch_label)) > 1


def test_a_label_on_two_dims_of_one_tensor_is_not_split():
    """The decoder tied to the embedding makes the transform's input and output features one label
    (`hidden` on both sides of its [8, 8] weight): splitting it would price a block-diagonal
    product, which is not the op (BERT's plans splitting it were refused at launch)."""
    g = _tied_head_graph()
    transform = next(op for op in g.ops if op.module == "transform")
    w = transform.params[0]
    assert w.dims[0] == w.dims[1], w.dims  # the tie made them one
    assert w.dims[0] not in transform.splittable and g.batch_label in transform.splittable, transform.splittable


class _CumsumPositions(nn.Module):
    """RoBERTa's position ids: a running count of the non-padding tokens along the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Embedding(40, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids.ne(0).int()
        positions = torch.cumsum(mask, dim=1) * mask
        return self.pos(positions) + torch.gather(self.pos(ids), 1, ids.unsqueeze(-1).expand(-1, -1, 8) % 4)


def test_an_op_reading_along_a_dimension_does_not_split_it():
    """A cumsum over the sequence split over ranks would count each shard's tokens alone: the plan
    ran and its losses differed (RoBERTa's position ids). The batch still splits."""
    g = capture_module(_CumsumPositions().to("meta"), (torch.ones(2, 6, dtype=torch.long, device="meta"),),
                       name="mine", input_labels=[["batch", "seq"]])
    for target in ("aten.cumsum.default", "aten.gather.default"):  # both along dim 1, the sequence
        op = next(op for op in g.ops if op.target == target)
        assert op.output.dims[1] not in op.splittable and g.batch_label in op.splittable, (op.name, op.splittable)
    gather = next(op for op in g.ops if op.target == "aten.gather.default")
    assert gather.output.dims[2] in gather.splittable  # its other dimensions still may


def test_dims_a_reshape_flattened_get_their_labels_back_when_unflattened():
    """GPT-2's Conv1D and OPT's MLP flatten [b, s, n] to [b*s, n] and view the result back: the
    sequence came back as a fresh label, so OPT's second layer was labelled unlike its first, and
    its plans (which copy the first layer's configuration) were refused at launch."""
    g = _tied_head_graph()
    relu = next(op for op in g.ops if op.target == "aten.relu.default")
    emb = next(op for op in g.ops if op.module == "embed" and op.kind == "embedding")
    assert relu.output.dims[:2] == emb.output.dims[:2] == ("batch", "seq"), (relu.output.dims, emb.output.dims)


class _BucketBias(nn.Module):
    """T5's relative-position bias: an embedding looked up at a [q, k] grid of buckets made inside
    the forward, added to every sequence's scores."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Embedding(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.arange(x.shape[1], device=x.device)
        buckets = (q[None, :] - q[:, None]).abs().clamp(max=7)
        return x + self.bias(buckets).permute(2, 0, 1).sum(0)


def test_an_embedding_splits_its_table_not_its_lookups_on_a_tensor_axis():
    """A parallel style shards an embedding's table (rows or width), never the grid of lookups it
    is given: T5's pp4 plans splitting the bias's query rows were refused at launch."""
    from search.prices.mesh import TENSOR, MeshAxis, axis_choices

    g = capture_module(_BucketBias().to("meta"), (torch.ones(2, 6, 6, device="meta"),), name="mine",
                       input_labels=[["batch", "q", "k"]])
    emb = next(op for op in g.ops if op.kind == "embedding")
    table = {d for p in emb.params for d in p.dims}
    assert set(emb.splittable) - table, emb.splittable  # the lookups' dims are splittable elsewhere
    choices = axis_choices(emb, MeshAxis("tp", 2, 1, TENSOR), g.batch_label)
    assert None in choices and all(c is None or c in table for c in choices), choices
