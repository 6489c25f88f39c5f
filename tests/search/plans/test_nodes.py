"""How a Plan's mesh lies on nodes: tensor groups inside a node, pipeline and data across."""

from __future__ import annotations

import pytest

from search import EstimateRequest, estimate
from search.plans.nodes import axis_groups, describe, node_map, node_ranks, nodes_blocker


def _plan(tp: int, pp: int, devices: int = 8, per_node: int = 4):
    return estimate(EstimateRequest(model="gpt2-tiny", device="cpu", devices=devices, devices_per_node=per_node,
                                    global_batch=8, precision="fp32", tp=tp, pp=pp)).plan


def test_groups_follow_the_strides_with_pp_outermost():
    p = _plan(tp=2, pp=2)
    g = axis_groups(p)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # every device is in exactly one group of every axis
    for groups in g.values():
        assert sorted(d for grp in groups for d in grp) == list(range(8))


def test_tensor_inside_a_node_pipeline_across():
    p = _plan(tp=2, pp=2)
    assert node_map(p) == {"pp": "across", "dp": "inside", "tp": "inside"}
    # on 4 nodes of 2 the data axis leaves the node too
    assert node_map(p, 4) == {"pp": "across", "dp": "across", "tp": "inside"}
    assert describe(p, 2) == "pp2 across 2 nodes, dp2 inside a node, tp2 inside a node"
    assert nodes_blocker(p, 2) is None and nodes_blocker(p, 4) is None


def test_a_tensor_axis_wider_than_a_node_is_refused_with_the_fix():
    p = _plan(tp=4, pp=1)
    why = nodes_blocker(p, 4)
    assert why is not None and "tensor axis tp4" in why and "2 devices per node" in why
    assert "split evenly" in (nodes_blocker(p, 3) or "")


def test_node_ranks_are_contiguous_blocks():
    assert node_ranks(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="evenly"):
        node_ranks(6, 4)
