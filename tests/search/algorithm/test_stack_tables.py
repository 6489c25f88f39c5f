"""A shape's tables made with what other shapes of its micro-batch graph already made
(`SharedTables`: placeability, edges, bytes sent, anchors) equal the tables made alone."""

from __future__ import annotations

import numpy as np

from search.algorithm.evaluate import micro_batch_graph
from search.algorithm.stack_tables import SharedTables, StackTables, stack_tables
from search.algorithm.stacks import stack_shapes
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, EdgeCosts
from search.prices.mesh import Mesh
from tests.search.algorithm.test_families_exact import _graph as _family_graph
from tests.search.algorithm.test_stacks_exact import BATCH, _graph, _job


def _same_edge(a: EdgeCosts, b: EdgeCosts) -> None:
    assert (a.src, a.dst) == (b.src, b.dst)
    for x, y in ((a.time, b.time), (a.mem, b.mem), (a.comm, b.comm), (a.time_rc, b.time_rc)):
        np.testing.assert_array_equal(x, y)


def _same_tables(a: StackTables, b: StackTables) -> None:
    assert a.shape == b.shape and a.anchor == b.anchor and a.n_units == b.n_units and a.buffers == b.buffers
    assert list(a.op_costs) == list(b.op_costs)
    for name, oc in a.op_costs.items():
        np.testing.assert_array_equal(oc.time, b.op_costs[name].time)
        np.testing.assert_array_equal(oc.mem, b.op_costs[name].mem)
    assert list(a.edge_costs) == list(b.edge_costs)  # the same edges in the same order
    for key, ec in a.edge_costs.items():
        _same_edge(ec, b.edge_costs[key])
    assert list(a.p2p) == list(b.p2p) and list(a.p2p_bytes) == list(b.p2p_bytes)
    for name in a.p2p:
        np.testing.assert_array_equal(a.p2p[name], b.p2p[name])
        np.testing.assert_array_equal(a.p2p_bytes[name], b.p2p_bytes[name])


def test_shared_tables_equal_the_tables_made_alone() -> None:
    """Every shape of two models (every ZeRO stage, accumulation and pipelines of several stage
    counts), its tables made with one SharedTables per micro-batch graph, against each made
    alone; the sharing is real (one edge table per sub-mesh)."""
    for g in (_graph(tied=True), _family_graph(5, 3)):
        cluster = make_cluster("cpu", 8, devices_per_node=8)
        shapes = stack_shapes(cluster, _job(), g, (0, 1, 2, 3), pipelines=True, accumulate=True)
        assert len({s.stages for s in shapes}) > 2
        models: dict[int, tuple[CostModel, SharedTables]] = {}
        made = 0
        for shape in shapes:
            m = shape.micro_batches
            mg = micro_batch_graph(g, m)
            if m not in models:
                cm = CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // m}))
                models[m] = (cm, SharedTables(mg, cm))
            cm, shared = models[m]
            got = stack_tables(mg, cm, shape, shared)
            alone = stack_tables(mg, CostModel(mg, cluster, _job().model_copy(update={"global_batch": BATCH // m})),
                                 shape)
            assert (got is None) == (alone is None)
            if got is not None and alone is not None:
                _same_tables(got, alone)
                assert got.edge_costs is shared.edges[Mesh(pp=1, axes=shape.mesh.axes)]
                made += 1
        assert made
        assert sum(len(s.edges) for _, s in models.values()) < made  # fewer edge tables than shapes
