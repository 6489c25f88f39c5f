"""A graph the search would price silently wrong is an InputError naming the op and the tensor:
the CLI's exit 2, the service's 422 (issue 16)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from search.errors import InputError
from search.models.graph import parse_graph
from tests.search.graphs import stack

Doc = dict[str, Any]


def doc() -> Doc:
    """A valid graph as JSON: inp -> 3 blocks of (ln, fc, add) -> head."""
    return json.loads(stack(3).to_json())


def op(d: Doc, name: str) -> Doc:
    return next(o for o in d["ops"] if o["name"] == name)


def rejected(d: Doc, *needles: str) -> str:
    with pytest.raises(InputError) as e:
        parse_graph(json.loads(json.dumps(d)), origin="g.json")
    msg = str(e.value)
    assert msg.startswith("g.json: invalid graph")
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_the_valid_graph_parses() -> None:
    assert len(parse_graph(doc()).ops) == 11


def _input(d: Doc, name: str, i: int = 0) -> Doc:
    return op(d, name)["inputs"][i]


CASES: dict[str, tuple[Callable[[Doc], None], tuple[str, ...]]] = {
    # a reader that disagrees with its producer about the tensor
    "shape disagrees with producer": (
        lambda d: _input(d, "blocks.1.fc").update(shape=[8, 64, 500]),
        ("op 'blocks.1.fc' input 0 (from op 'blocks.1.ln')", "[8, 64, 500]", "[8, 64, 512]")),
    "dtype disagrees with producer": (
        lambda d: _input(d, "head").update(dtype="float16"),
        ("op 'head' input 0 (from op 'blocks.2.add')", "'float16'", "'float32'")),
    # one dimension of one op, two sizes
    "contraction size differs from the weight's": (
        lambda d: op(d, "blocks.0.fc")["params"][0].update(shape=[512, 256]),
        ("op 'blocks.0.fc' parameter 'blocks.0.fc.weight'", "size 256")),
    # what the cost model cannot size
    "complex output": (
        lambda d: op(d, "blocks.0.ln")["output"].update(dtype="complex64"),
        ("op 'blocks.0.ln' output", "complex dtypes are not supported", "'complex64'")),
    "complex graph input": (
        lambda d: _input(d, "inp").update(dtype="complex128"),
        ("op 'inp' input 0 (graph input)", "complex")),
    "complex parameter": (
        lambda d: op(d, "head")["params"][0].update(dtype="cfloat"),
        ("op 'head' parameter 'head.weight'", "complex")),
    "unknown dtype": (
        lambda d: op(d, "blocks.0.ln")["output"].update(dtype="banana"),
        ("op 'blocks.0.ln' output", "unknown dtype: 'banana'")),
    "zero size": (
        lambda d: _input(d, "inp").update(shape=[8, 0, 512]),
        ("op 'inp' input 0 (graph input)", "[8, 0, 512]")),
    "negative size": (
        lambda d: op(d, "head")["output"].update(shape=[8, -64, 512]),
        ("op 'head' output", "[8, -64, 512]")),
    "non-finite flops": (
        lambda d: op(d, "head").update(flops=float("inf")),
        ("flops",)),
    # a batch the search could not split
    "batch_label names no dimension": (
        lambda d: d.update(batch_label="samples"),
        ("batch_label 'samples' names no dimension",)),
    # wiring
    "duplicate op name": (
        lambda d: op(d, "blocks.1.ln").update(name="blocks.0.ln"),
        ("duplicate op name 'blocks.0.ln'",)),
    "dangling input": (
        lambda d: _input(d, "head").update(source="nowhere"),
        ("op 'head' reads from unknown op 'nowhere'",)),
    "reads itself": (
        lambda d: _input(d, "head").update(source="head"),
        ("op 'head' reads its own output",)),
    "cycle": (
        lambda d: _input(d, "inp").update(source="head", shape=[8, 64, 512], dims=["batch", "seq", "vocab"]),
        ("cycle",)),
    # parameters: one name, one tensor, one owner
    "parameter owned twice": (
        lambda d: op(d, "head")["params"].append({**op(d, "inp")["params"][0]}),
        ("op 'head' parameter 'inp.weight'", "already owned by op 'inp'")),
    "tied parameter of another shape": (
        lambda d: op(d, "head")["params"].append({**op(d, "inp")["params"][0], "owner": False,
                                                  "shape": [512, 256]}),
        ("op 'head' parameter 'inp.weight'", "disagrees with op 'inp'")),
    "tied parameter nobody owns": (
        lambda d: op(d, "head")["params"][0].update(owner=False),
        ("op 'head' parameter 'head.weight'", "no earlier op holds it")),
    # block stacks
    "empty layer": (
        lambda d: d["blocks"][0]["layers"].append([]),
        ("block 'blocks'", "a layer needs ops")),
    "op in two layers": (
        lambda d: d["blocks"][0]["layers"].__setitem__(2, d["blocks"][0]["layers"][1]),
        ("op 'blocks.1.ln' is named twice",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_odd_graph_is_an_input_error_naming_the_op(case: str) -> None:
    d = doc()
    change, needles = CASES[case]
    change(d)
    rejected(d, *needles)


def test_a_view_may_change_the_shape() -> None:
    """Capture folds views into edges: a reshape (other labels, other shape), a slice and a
    repeat_interleave (same labels, a whole multiple) are not disagreements."""
    d = doc()
    _input(d, "blocks.0.fc").update(shape=[8, 64, 8, 64], dims=["batch", "seq", "heads", "hd"])
    op(d, "blocks.0.fc")["params"][0].update(shape=[512, 8, 64], dims=["hidden", "heads", "hd"])
    op(d, "blocks.0.fc")["splittable"] = ["batch", "hidden"]
    _input(d, "head").update(shape=[8, 128, 512])  # twice the sequence, labels kept
    op(d, "head")["output"].update(shape=[8, 128, 512])
    assert parse_graph(d).op("head").output.shape == (8, 128, 512)
    _input(d, "head").update(shape=[8, 96, 512])  # not a repeat of 64
    op(d, "head")["output"].update(shape=[8, 96, 512])
    rejected(d, "op 'head' input 0 (from op 'blocks.2.add'): shape [8, 96, 512]")


def test_grouped_query_attention_reads_fewer_kv_heads() -> None:
    """An attention's K/V may carry a divisor of the query heads (SDPA's grouped-query attention)."""
    d = doc()
    q = {"source": "blocks.0.fc", "shape": [8, 8, 64, 64], "dims": ["batch", "heads", "seq", "hd"]}
    kv = {**q, "shape": [8, 2, 64, 64]}
    d["ops"].append({"name": "attn", "kind": "attention", "inputs": [q, kv, kv],
                     "output": {"shape": [8, 8, 64, 64], "dims": ["batch", "heads", "seq", "hd"]},
                     "splittable": ["batch", "heads"], "saves": "attention"})
    assert parse_graph(d).op("attn").kind == "attention"
    d["ops"][-1]["kind"] = "matmul"  # anything else must agree
    rejected(d, "op 'attn' input 1 (from op 'blocks.0.fc')", "'heads' has size 2")


def test_the_cli_exits_2_naming_the_op(tmp_path, capsys) -> None:
    from paretoplan.cli import main

    d = doc()
    _input(d, "blocks.1.fc").update(shape=[8, 64, 500])
    (tmp_path / "g.json").write_text(json.dumps(d))
    assert main(["search", "--graph", str(tmp_path / "g.json"), "--devices", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "op 'blocks.1.fc' input 0 (from op 'blocks.1.ln')" in err, err


def test_the_service_refuses_it_before_storing(tmp_path) -> None:
    """service.validation.check runs on every submitted job; its InputError is the API's 422."""
    from search import SearchRequest
    from service.validation import check

    d = doc()
    op(d, "blocks.0.ln")["output"].update(dtype="complex64")
    with pytest.raises(InputError, match="op 'blocks.0.ln' output: complex dtypes are not supported"):
        check(SearchRequest(graph=d, device="h100-80gb", devices=4))
