"""Plans of a periodic stack (search/models/capture.py groups A, B, A, B, ... by period): the
Plan's recompute list and the executor's per-op configurations name the model's own layers, a
block layer standing for `period` of them (search.models.graph.block_layout)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from search.algorithm.ft import SearchOptions, search
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from worker.analyze import op_configs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "search" / "algorithm"))
from test_periodic_exact import BATCH, _graph  # noqa: E402 - the tiny periodic model, shared


def test_periodic_plans_name_the_models_own_layers() -> None:
    g = _graph("ABABAB")
    cluster = make_cluster("h100-80gb", 4, devices_per_node=4)
    meshes = tuple(Mesh(pp=1, axes=(MeshAxis("dp", 4 // t, t, "data"), MeshAxis("tp", t, 1, "tensor")))
                   for t in (1, 2))
    res = search(g, cluster, TrainingJob(global_batch=BATCH, precision="bf16"),
                 SearchOptions(meshes=meshes, zero_stages=(0,), recompute=True))
    plans = build_plans(res)
    assert any(p.recompute for p in plans)
    for plan in plans:
        # a recomputed block layer is both of its module layers
        assert all(re.fullmatch(r"layers\.[0-5]", r) for r in plan.recompute)
        layers = {int(r.split(".")[1]) for r in plan.recompute}
        assert layers == {j for k in layers for j in (k // 2 * 2, k // 2 * 2 + 1)}
        configs = op_configs(plan, g)
        assert set(configs) == {op.name for op in g.ops}
        for name, codes in configs.items():
            # each code is a dimension of the op itself: layer k's configuration was written in
            # block layer 0's names and mapped to module layers 2k, 2k + 1
            # (a label from outside the stack, the input's, is left as it is)
            assert all(c in g.op(name).labels() for c in codes if c and c.startswith("layers.")), (name, codes)
