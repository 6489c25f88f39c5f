"""Bounds on what one request may ask the service (and its workers) to work on, checked on the
JSON before anything is parsed into models, captured or stored: each refusal is a 422 naming the
field and the bound.

The bounds sit far above real models (GPT-3 175B captures to 1,159 ops; Llama 3 405B has 126
layers, hidden size 16,384, a 128,256-token vocabulary) and far below what ties up a process:
a 10^6-op graph took 7 GB and 212 s to parse and price, a Llama config of hidden size 10^9 never
finishes capturing. What is within them and still slow is bounded by the worker's per-search
time and memory limits (worker/bounded.py).
"""

from __future__ import annotations

from typing import Any

from search import InputError

MAX_GRAPH_OPS = 20_000
MAX_GRAPH_EDGES = 100_000  # op inputs, summed
MAX_HF_LAYERS = 1_024
MAX_HF_WIDTH = 262_144  # hidden, intermediate, head and embedding sizes
MAX_HF_HEADS = 4_096
MAX_HF_VOCAB = 4_194_304
MAX_HF_POSITIONS = 10_000_000
MAX_HF_EXPERTS = 4_096
MAX_HF_PARAMS = 10**14  # 100 T parameters, estimated from the sizes
MAX_HF_DEPTH = 4  # nested configs (text_config, vision_config, encoder/decoder ones)

LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")
WIDTHS = ("hidden_size", "intermediate_size", "n_embd", "n_inner", "d_model", "d_ff", "d_kv", "head_dim", "ffn_dim",
          "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size", "image_size", "patch_size", "num_channels")
HEADS = ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "encoder_attention_heads",
         "decoder_attention_heads")
VOCAB = ("vocab_size", "type_vocab_size", "num_labels")
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx")
EXPERTS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts")
BOUNDS = ([(k, MAX_HF_LAYERS, "layers") for k in LAYERS] + [(k, MAX_HF_WIDTH, "width") for k in WIDTHS]
          + [(k, MAX_HF_HEADS, "heads") for k in HEADS] + [(k, MAX_HF_VOCAB, "vocabulary") for k in VOCAB]
          + [(k, MAX_HF_POSITIONS, "positions") for k in POSITIONS] + [(k, MAX_HF_EXPERTS, "experts") for k in EXPERTS])


def _first(cfg: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def estimated_params(cfg: dict[str, Any]) -> int:
    """A transformer's parameters from its sizes: 12 h^2 per layer (attention and a 4h MLP; the
    MLP's own width when given), times the experts, plus the embeddings. An estimate, to bound."""
    layers = _first(cfg, LAYERS, 1)
    h = _first(cfg, ("hidden_size", "n_embd", "d_model"), 1)
    ff = _first(cfg, ("intermediate_size", "n_inner", "d_ff", "ffn_dim"), 4 * h)
    experts = _first(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), 1)
    vocab = _first(cfg, ("vocab_size",), 0)
    return layers * (4 * h * h + 3 * h * ff * experts) + vocab * h


def check_hf_config(cfg: Any, where: str = "hf_config", depth: int = 0) -> None:
    if not isinstance(cfg, dict):
        return  # the config's own check says what it must be
    if depth > MAX_HF_DEPTH:
        raise InputError(f"{where}: configs nest at most {MAX_HF_DEPTH} deep")
    for key, bound, what in BOUNDS:
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > bound:
            raise InputError(f"{where}.{key} {v:,} is over the limit of {bound:,} ({what})")
    params = estimated_params(cfg)
    if params > MAX_HF_PARAMS:
        raise InputError(f"{where}: about {params:.2e} parameters, over the limit of {MAX_HF_PARAMS:.0e}")
    for key, v in cfg.items():
        if isinstance(v, dict):
            check_hf_config(v, f"{where}.{key}", depth + 1)


def check_graph(graph: Any, where: str = "graph") -> None:
    if not isinstance(graph, dict):
        return
    ops = graph.get("ops")
    if not isinstance(ops, list):
        return
    if len(ops) > MAX_GRAPH_OPS:
        raise InputError(f"{where}.ops: {len(ops):,} ops, over the limit of {MAX_GRAPH_OPS:,}")
    edges = sum(len(op.get("inputs") or ()) for op in ops if isinstance(op, dict)
                and isinstance(op.get("inputs"), list))
    if edges > MAX_GRAPH_EDGES:
        raise InputError(f"{where}: {edges:,} op inputs, over the limit of {MAX_GRAPH_EDGES:,}")


def check_request(req: Any) -> None:
    """The bounds of a JobRequest (a job, an estimate): its graph or HF config."""
    if getattr(req, "graph", None) is not None:
        check_graph(req.graph)
    if getattr(req, "hf_config", None) is not None:
        check_hf_config(req.hf_config)
