"""The exact reference: enumerate every assignment of configurations, price each with the same
cost tables (evaluate.py), keep the Pareto set. Exponential, so only for small graphs; FT must
equal it.

The strategy space is the same as FT's, including its one tie: with block reuse on, the output
op of every layer of a recognised block stack takes the same configuration (ft.py, step 4).
It imports the algorithm's pieces and none of them imports it: the tests compare the two, and
`paretoplan search --exhaustive` (search/plans/api.py) runs it on request.
"""

from __future__ import annotations

import time as _time

import numpy as np

from search.algorithm.chain import find_chain, layer_index, recompute_var
from search.algorithm.evaluate import (
    PipeShape,
    evaluate,
    evaluate_pipeline,
    every_assignment,
    micro_batch_graph,
    pipe_tables,
    tables,
)
from search.algorithm.families import find_families
from search.algorithm.frontier import Factor, Stats, pareto_mask
from search.algorithm.ft import ZERO_STAGES
from search.algorithm.pipeline import partitions
from search.algorithm.results import FrontierPoint, MeshSolution, SearchResult, Solution
from search.algorithm.stack_tables import is_multi_stack
from search.errors import InputError
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import Mesh, mesh_candidates, placeable_meshes, runs_with_zero
from search.prices.profile import DeviceProfile, ProfileLookup

MAX_ASSIGNMENTS = 5_000_000


def exhaustive_search(graph: OpGraph, cluster: Cluster, job: TrainingJob, meshes: list[Mesh] | None = None,
                      tie_blocks: bool = True, limit: int = MAX_ASSIGNMENTS,
                      zero_stages: tuple[int, ...] = ZERO_STAGES, recompute: bool = True,
                      profile: DeviceProfile | ProfileLookup | None = None) -> SearchResult:
    """Every assignment of every mesh and ZeRO stage, priced and Pareto-reduced."""
    start = _time.perf_counter()
    cm = CostModel(graph, cluster, job, profile=profile)
    meshes = placeable_meshes(graph, meshes if meshes is not None else mesh_candidates(cluster))
    # FT's block reuse, so FT's tie (an encoder-decoder: one per block family, families.py)
    families = tuple(f.chain for f in find_families(graph)) if tie_blocks and is_multi_stack(graph) else ()
    chain = find_chain(graph, solo=True) if tie_blocks and not families else None
    tied = {layer[-1]: c.boundary for c in ((chain,) if chain else families) for layer in c.layers[1:]}
    layer_of = layer_index(graph) if recompute else {}
    rc_vars = sorted({recompute_var(i) for i in layer_of.values()})
    all_t, all_m, all_mesh, all_assign = [], [], [], []
    solutions: list[Solution] = []
    for mesh in meshes:
        for zero in zero_stages:
            if not runs_with_zero(mesh, zero):
                continue
            ops, edges = tables(graph, cm, mesh, zero)
            assign, total = every_assignment(graph, ops, tied, rc_vars, limit, f"--exhaustive on mesh {mesh.describe()}")
            buffers = cm.buffers(mesh, zero=zero)
            res = evaluate(ops, edges, buffers, assign, layer_of)
            keep = pareto_mask(np.zeros(total, dtype=np.int64), res["time"], res["memory"])
            all_t.append(res["time"][keep])
            all_m.append(res["memory"][keep])
            all_mesh.append(np.full(len(keep), len(solutions)))
            all_assign.append({v: a[keep] for v, a in assign.items()})
            root = Factor(scope=(), keys=np.zeros((len(keep), 0), dtype=np.int32), t=res["time"][keep],
                          m=res["memory"][keep])
            solutions.append(MeshSolution(mesh=mesh, root=root, chain=chain, op_costs=ops, edge_costs=edges,
                                          buffers=buffers, stats=Stats(), zero=zero, assigns=all_assign[-1]))
    t = np.concatenate(all_t)
    m = np.concatenate(all_m)
    which = np.concatenate(all_mesh)
    offsets = np.cumsum([0] + [len(x) for x in all_t])
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m)
    points = []
    for g in keep:
        mi = int(which[g])
        points.append(FrontierPoint(time_s=float(t[g]), memory_bytes=float(m[g]), mesh_index=mi,
                                    configs=all_assign[mi], row=int(g - offsets[mi])))
    points.sort(key=lambda p: p.time_s)
    return SearchResult(graph=graph, cluster=cluster, job=job, solutions=solutions, points=points,
                        search_seconds=_time.perf_counter() - start, eps=0.0,
                        stats={"ops": len(graph.ops), "frontier": len(points), "exhaustive": True,
                               "meshes": [m_.describe() for m_ in meshes], "zero_stages": list(zero_stages),
                               "recompute": bool(rc_vars)})


def exhaustive_pipeline(graph: OpGraph, cluster: Cluster, job: TrainingJob, shape: PipeShape, recompute: bool = True,
                        limit: int = MAX_ASSIGNMENTS) -> tuple[np.ndarray, np.ndarray]:
    """The reference frontier (time, memory) of one pipeline shape: every assignment of every
    op's configuration (the stack's boundary layout tied, as in FT), every layer's recomputation
    and every split of the layers into stages inside the band (each device's layers as its chunks
    when interleaved), re-costed stage by stage."""
    m = shape.micro_batches
    g = micro_batch_graph(graph, m)
    cm = CostModel(g, cluster, job.model_copy(update={"global_batch": job.global_batch // m}))
    tabs = pipe_tables(g, cm, shape)
    if tabs is None:
        raise InputError(f"{graph.name} cannot be pipelined")
    chain = tabs.chain
    tied = {layer[-1]: chain.boundary for layer in chain.layers[1:]}
    rc_vars = sorted({recompute_var(i) for i in layer_index(g).values()}) if recompute else []
    assign, total = every_assignment(g, tabs.op_costs, tied, rc_vars, limit, "the exhaustive pipeline search")
    ts, ms = [], []
    for split in partitions(len(chain.layers), shape.stages, shape.virtual_stages, shape.spread):
        res = evaluate_pipeline(tabs, assign, split)
        keep = pareto_mask(np.zeros(total, dtype=np.int64), res["time"], res["memory"])
        ts.append(res["time"][keep])
        ms.append(res["memory"][keep])
    t, mem = np.concatenate(ts), np.concatenate(ms)
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, mem)
    return t[keep], mem[keep]
