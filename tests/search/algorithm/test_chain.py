"""find_chain reuses a block stack only where every layer prices like the template (issue 16)."""

from __future__ import annotations

import pytest

from search.algorithm.chain import find_chain
from search.models.graph import OpGraph, ParamRef
from tests.search.graphs import block_stack, stack


def changed(g: OpGraph, name: str, **update: object) -> OpGraph:
    """g with op `name` changed (validated again)."""
    ops = [op.model_copy(update=update) if op.name == name else op for op in g.ops]
    return OpGraph.model_validate({**g.model_dump(), "ops": [op.model_dump() for op in ops]})


@pytest.mark.parametrize("name", ["gpt2", "llama-7b", "bert-base", "vit-base"])
def test_the_zoo_transformers_keep_block_reuse(name: str) -> None:
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = capture_model(get_model(name), 8, None if name == "vit-base" else 64)
    chain = find_chain(g)
    assert chain is not None and len(chain.layers) == len(g.blocks[0].layers)


def test_a_uniform_stack_is_reused_whatever_reads_it_after() -> None:
    assert find_chain(stack(4)) is not None
    assert find_chain(block_stack(4, last="head")) is not None
    assert find_chain(block_stack(4, last="pointwise", keep_input=False)) is not None


@pytest.mark.parametrize("last,keep_input", [("none", True), ("pointwise", True), ("head", False)])
def test_a_last_block_kept_otherwise_than_the_template_is_solved_on_its_own(last: str, keep_input: bool) -> None:
    """Not one template for every layer (a pipeline cuts them alike: no chain), but FT's block
    reuse may solve the last one with its own tables."""
    g = block_stack(4, last=last, keep_input=keep_input)
    assert find_chain(g) is None
    chain = find_chain(g, solo=True)
    assert chain is not None and chain.solo and chain.reused == 2
    assert chain.covered == set(g.blocks[0].layers[2])  # priced through the template: layer 2 only


def test_one_layer_differing_in_what_the_cost_model_reads_is_not() -> None:
    g = stack(4)
    fc = g.op("blocks.2.fc")
    assert find_chain(changed(g, "blocks.2.fc", target="aten.addmm")) is None  # a profile keys on it
    assert find_chain(changed(g, "blocks.2.fc", saves="none")) is None
    # the same signature (kind, output shape, FLOPs, arity), another dtype on its weight
    w = fc.params[0].model_copy(update={"dtype": "bfloat16"})
    assert find_chain(changed(g, "blocks.2.fc", params=(w,))) is None
    # a layer whose norm splits differently
    assert find_chain(changed(g, "blocks.3.ln", splittable=("batch",))) is None
    # layer 0 configures the boundary every layer's output shares: it must match too
    assert find_chain(changed(g, "blocks.0.add", splittable=("batch", "seq"))) is None


def test_a_parameter_tied_across_layers_is_not() -> None:
    """ALBERT-like sharing: every layer reads layer 0's weight, a pair constraint across layers
    the template cannot carry."""
    g = stack(4)
    shared = g.op("blocks.0.fc").params[0]
    tied = ParamRef(name=shared.name, shape=shared.shape, dims=shared.dims, owner=False)
    for i in (1, 2, 3):
        g = changed(g, f"blocks.{i}.fc", params=(tied,))
    assert find_chain(g) is None


def test_the_answer_is_kept_per_graph() -> None:
    g = stack(4)
    assert find_chain(g) is find_chain(g)
    assert find_chain(g, 2) is not find_chain(g)  # each minimum asked for is its own answer


@pytest.mark.parametrize("name", ["gpt2", "llama-7b"])
def test_a_micro_batch_graph_inherits_the_proven_stack(name: str) -> None:
    """The stack proven on the full batch is the micro-batch graph's own: the proof run afresh on
    the micro-batch graph finds the same layers (what lets the pipeline search skip it)."""
    from search.algorithm.chain import _find_chain
    from search.algorithm.evaluate import micro_batch_graph
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = capture_model(get_model(name), 8, 64)
    full = find_chain(g)
    assert full is not None
    for m in (2, 4, 8):
        mg = micro_batch_graph(g, m)
        carried = find_chain(mg)
        assert carried is full
        fresh = _find_chain(mg, 3, False)
        assert fresh is not None and fresh.layers == full.layers and fresh.solo == full.solo


@pytest.mark.parametrize("batch", [16, 12])
def test_the_template_places_the_copies_on_every_mesh(batch: int) -> None:
    """FT tests placeability on every op but the stack's copies (layers 2..), which configure
    as the template does: the same meshes are placeable as when every op is tested, also where
    the batch leaves some meshes out (12 splits over neither 16 nor 8 data-parallel ranks)."""
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.mesh import mesh_candidates, placeable_meshes

    g = capture_model(get_model("gpt2"), batch, 64)
    chain = find_chain(g, solo=True)
    assert chain is not None and chain.copies
    candidates = mesh_candidates(make_cluster("h100-80gb", 16))
    every = placeable_meshes(g, candidates)
    assert placeable_meshes(g, candidates, [op for op in g.ops if op.name not in chain.copies]) == every
    assert (len(every) < len(candidates)) == (batch == 12)
