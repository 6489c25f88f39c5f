"""What the exactness tests of stacks whose layers are tied (block families, periodic stacks)
share: FT against the exhaustive reference on the same meshes, point by point, and every FT point
recosted to itself."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm.exhaustive import exhaustive_search
from search.algorithm.ft import SearchOptions, search
from search.algorithm.results import SearchResult
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh


def assert_ft_equals_exhaustive(g: OpGraph, cluster: Cluster, job: TrainingJob, meshes: tuple[Mesh, ...],
                                recompute: bool) -> SearchResult:
    """FT's frontier (ZeRO 0 and 3) equals the exhaustive one and each point recosts to itself;
    FT's result, for the caller's own checks of how it searched."""
    ft = search(g, cluster, job, SearchOptions(meshes=meshes, zero_stages=(0, 3), recompute=recompute))
    ex = exhaustive_search(g, cluster, job, meshes=list(meshes), zero_stages=(0, 3), recompute=recompute)
    got = np.array([(p.time_s, p.memory_bytes) for p in ft.points])
    want = np.array([(p.time_s, p.memory_bytes) for p in ex.points])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-9)
    for p in ft.points:
        sol = ft.solutions[p.mesh_index]
        again = sol.recost(g, {k: v[p.row:p.row + 1] for k, v in p.configs.items()}, [None])
        assert again["time"][0] == pytest.approx(p.time_s, rel=1e-9)
        assert again["memory"][0] == pytest.approx(p.memory_bytes, rel=1e-9)
    return ft
