"""Gradient accumulation on context-parallel meshes (search/prices/mesh.py, context_meshes).

A context axis pays off once the data axes run out of sequences to split: with a global batch of
one sequence per device, dp x cp holds as many tokens per device as dp alone, and only running
the per-rank batch as micro-batches halves them again. The stage search (pipeline.py) enumerates
its one-stage shapes over ``mesh_candidates``, which cannot see the graph; these are the same
shapes on the context variants of those meshes, for the graphs that get them.
"""

from __future__ import annotations

from search.algorithm.evaluate import PipeShape
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import CONTEXT, context_meshes, data_ways, mesh_candidates, runs_with_zero


def context_accumulation_shapes(graph: OpGraph, cluster: Cluster, job: TrainingJob,
                                zero_stages: tuple[int, ...]) -> list[PipeShape]:
    """One stage, every m >= 2 dividing the per-rank batch, every ZeRO stage, on each context mesh."""
    shapes = []
    for mesh in context_meshes(graph, mesh_candidates(cluster)):
        if not any(a.role == CONTEXT for a in mesh.axes):
            continue
        dp = data_ways(mesh)
        if job.global_batch % dp:
            continue
        per_rank = job.global_batch // dp
        for zero in filter(lambda z: runs_with_zero(mesh, z), zero_stages):
            shapes += [PipeShape(mesh, zero, m, "1f1b") for m in range(2, per_rank + 1) if per_rank % m == 0]
    return shapes
