"""What a submitted request must pass before anything is stored, and its canonical key.

Everything here is cheap (no model capture, no search): model and device names, the cluster's
shape, sizes, a graph's structure (cycles included). What only the search can find out (an HF
config transformers cannot build, say) fails the job later with the same message the CLI prints.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from search import InputError, SearchRequest, request_cluster

KEY_VERSION = "1"  # bump when stored frontiers must not be reused any more


def check(req: SearchRequest) -> tuple[SearchRequest, int]:
    """The request normalised (sizes in bytes), and its device count; InputError when invalid."""
    from search import parse_size
    from service.limits import check_request

    check_request(req)  # sizes first: nothing below may parse or capture an unbounded graph or config
    update: dict[str, Any] = {}
    cluster = request_cluster(req)  # the search's own checks of names, shape and profile
    if req.profile is not None and req.cluster is None and "device" not in req.model_fields_set:
        update["device"] = cluster.device.name  # what the search chose; explicit, so the key and the worker agree
    if req.memory_budget is not None:
        update["memory_budget"] = parse_size(req.memory_budget)
    if req.model is not None:
        from search.models.zoo import get_model

        spec = get_model(req.model)
        if req.seq_len is not None and spec.max_seq_len is not None and req.seq_len > spec.max_seq_len:
            raise InputError(f"seq_len {req.seq_len} exceeds the {spec.max_seq_len} positions of model '{req.model}'")
        if req.seq_len is not None and spec.kind == "vision":
            raise InputError(f"model '{req.model}' is a vision model: it takes no seq_len")
    elif req.graph is not None:
        from search.models.graph import parse_graph

        parse_graph(req.graph)
    elif req.hf_config is not None:
        # checked here, on submit, so a bad config is a 422 naming its field rather than a job that
        # fails later in the worker
        from search.models.zoo import check_hf_config

        check_hf_config(req.hf_config)
    return req.model_copy(update=update), cluster.num_devices


def label(req: SearchRequest) -> str:
    if req.model is not None:
        return req.model
    if req.graph is not None:
        return str(req.graph.get("name") or "graph")[:200]
    return (req.name or str((req.hf_config or {}).get("model_type")))[:200]


def canonical_key(req: SearchRequest) -> str:
    """sha256 of the request with every default filled in, keys sorted, plus the code's versions."""
    from search import PLAN_VERSION

    doc = {"request": req.model_dump(mode="json"), "key": KEY_VERSION, "plan": PLAN_VERSION}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()
