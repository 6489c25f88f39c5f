"""A Plan carries the source of its model; a model that cannot be rebuilt is refused at launch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from search.models.source import ModelSource
from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from worker.analyze import Unsupported, analyze

TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


def _search(**model) -> Plan:
    o = run_search(SearchRequest(**model, device="cpu", devices=2, devices_per_node=2, global_batch=4, seq_len=16,
                                 precision="fp32", pipeline=False))
    assert all(Plan.model_validate(b.plan).source == o.plans[0].source for b in o.report.baselines)
    return o.plans[0]


def test_every_plan_names_how_to_rebuild_its_model():
    zoo = _search(model="gpt2-tiny")
    assert zoo.source == ModelSource(kind="zoo", name="gpt2-tiny")
    hf = _search(hf_config=TINY_LLAMA, name="mine")
    assert hf.model == "hf:llama:mine" and hf.source is not None
    assert hf.source.kind == "hf_config" and hf.source.config == TINY_LLAMA and hf.source.params
    assert Plan.model_validate_json(hf.model_dump_json()).source == hf.source  # what the database stores
    assert analyze(hf).source == hf.source  # the worker rebuilds it


def test_a_plan_of_an_uploaded_graph_is_refused_at_launch_saying_why(tmp_path):
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    graph = capture_model(get_model("gpt2-tiny"), 4, 16).model_dump(mode="json")
    plan = _search(graph=graph)
    assert plan.source is not None and plan.source.kind == "graph"
    with pytest.raises(Unsupported, match="uploaded OpGraph"):
        analyze(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.model_dump(mode="json")))
    r = subprocess.run([sys.executable, "-m", "paretoplan", "run", "--plan", str(path), "--steps", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "uploaded OpGraph" in r.stderr and "Traceback" not in r.stderr


def test_an_old_plan_without_a_source_still_runs_its_zoo_model():
    plan = _search(model="gpt2-tiny")
    old = Plan.model_validate({k: v for k, v in plan.model_dump(mode="json").items() if k != "source"})
    assert old.source is None and analyze(old).model == "gpt2-tiny"
    with pytest.raises(Unsupported, match="carries no source"):
        analyze(old.model_copy(update={"model": "hf:llama:gone"}))
