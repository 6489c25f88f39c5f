"""What a search returns: per solved mesh or pipeline shape a `Solution`, and the merged frontier.

Two kinds of solution share one protocol, so that the merge (ft.py), the plans and the planners
read either the same way:
- `MeshSolution`: one mesh and ZeRO stage without a pipeline (FT, the exhaustive reference, the
  data- and tensor-parallel planners);
- `PipeSolution`: one pipeline shape, its points also splitting the layers into stages (the
  pipeline stage search, the pipeline planners).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from search.algorithm.chain import Chain, layer_index
from search.algorithm.evaluate import PipeShape, PipeTables, evaluate, evaluate_pipeline
from search.algorithm.frontier import Factor, Stats, assignments
from search.models.graph import OpGraph
from search.prices.boundaries import Boundaries
from search.prices.cluster import Cluster
from search.prices.costmodel import EdgeCosts, OpCosts, TrainingJob
from search.prices.mesh import Mesh

Split = tuple[int, ...]  # layers per pipeline stage


class Solution(Protocol):
    """One solved mesh or pipeline shape: its frontier points (`root.t`, `root.m`, one row per
    point), the cost tables they were priced from, and how a point's plan is read back and
    re-costed."""

    @property
    def root(self) -> Factor: ...
    @property
    def mesh(self) -> Mesh: ...
    @property
    def zero(self) -> int: ...
    @property
    def chain(self) -> Chain | None: ...
    @property
    def op_costs(self) -> dict[str, OpCosts]: ...
    @property
    def edge_costs(self) -> dict[tuple[str, str], EdgeCosts]: ...
    @property
    def buffers(self) -> float: ...
    @property
    def stats(self) -> Stats: ...

    @property
    def pipeline(self) -> PipeShape | None:
        """The pipeline shape (stages, micro-batches, schedule); None without a pipeline."""
        ...

    def describe(self) -> str: ...

    def read_back(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[Split | None]]:
        """For the points `rows` of `root`: every op's configuration index (and every layer's
        recomputation choice), and each point's layers per stage (None without a pipeline)."""
        ...

    def configured_graph(self, graph: OpGraph) -> OpGraph:
        """The graph whose ops the configuration indices index: the searched graph, or a
        pipeline's micro-batch graph."""
        ...

    def recost(self, graph: OpGraph, assignment: dict[str, np.ndarray], splits: list[Split | None]
               ) -> dict[str, np.ndarray]:
        """Time, memory, breakdown and communication of many assignments of `graph`'s ops at once
        (one split per assignment), straight from the cost tables."""
        ...


@dataclass
class MeshSolution:
    mesh: Mesh
    root: Factor
    chain: Chain | None
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    stats: Stats
    zero: int = 0
    # every point's assignment, when `root` carries no provenance to read it back from (the
    # exhaustive reference and the planners price given assignments)
    assigns: dict[str, np.ndarray] | None = None
    # block families solved through their templates beside `chain` (search/algorithm/families.py)
    families: tuple[Chain, ...] = ()

    @property
    def pipeline(self) -> PipeShape | None:
        return None

    def describe(self) -> str:
        return f"{self.mesh.describe()} zero{self.zero}"

    def read_back(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[Split | None]]:
        if self.assigns is not None:
            configs = {name: v[rows] for name, v in self.assigns.items()}
        else:
            configs = assignments(self.root, rows, self.chain.layer_maps() if self.chain else None)
        return configs, [None] * len(rows)

    def configured_graph(self, graph: OpGraph) -> OpGraph:
        return graph

    def recost(self, graph: OpGraph, assignment: dict[str, np.ndarray], splits: list[Split | None]
               ) -> dict[str, np.ndarray]:
        op_map, edge_map = self._cost_names()
        ops: dict[str, OpCosts] = {}
        edges: dict[tuple[str, str], EdgeCosts] = {}
        remap: dict[str, np.ndarray] = {v: a for v, a in assignment.items() if v.startswith("recompute@")}
        layer_of = layer_index(graph) if remap else {}
        for op in graph.ops:
            ops[op.name] = self.op_costs[op_map.get(op.name, op.name)]
            remap[op.name] = assignment[op.name]
            for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
                mapped = edge_map.get((src, op.name))
                # else: within a layer priced as the template, from a side input into it, or real
                keys = [mapped] if mapped is not None else [
                    (op_map.get(src, src), op_map.get(op.name, op.name)), (src, op_map.get(op.name, op.name))]
                k = next((c for c in keys if c in self.edge_costs), (src, op.name))
                edges[(src, op.name)] = self.edge_costs[k]
        # a pair priced as a conversion (a reader converting from its outer reader's placement,
        # search/prices/boundaries.py) between ops no edge joins; the pairs that only constrain
        # cost nothing in any assignment the search returns
        for pair in Boundaries.of(graph).pairs:
            if pair.kind == "outer" and (pair.a, pair.b) not in edges:
                mapped = (op_map.get(pair.a, pair.a), op_map.get(pair.b, pair.b))
                edges[(pair.a, pair.b)] = self.edge_costs[mapped if mapped in self.edge_costs else (pair.a, pair.b)]
        return evaluate(ops, edges, self.buffers, remap, layer_of)

    def _cost_names(self) -> tuple[dict[str, str], dict[tuple[str, str], tuple[str, str]]]:
        """Ops of layers solved through the template are priced with the template's tables."""
        op_map: dict[str, str] = {}
        edge_map: dict[tuple[str, str], tuple[str, str]] = {}
        for chain in ((self.chain,) if self.chain else ()) + self.families:
            for i in range(2, 1 + chain.reused):
                prev_out = chain.layers[i - 1][-1]
                for a, b in zip(chain.template, chain.layers[i], strict=True):
                    op_map[b] = a
                for b in chain.layers[i]:
                    edge_map[(prev_out, b)] = (chain.boundary, op_map[b])
        return op_map, edge_map


# rows of a pipeline solution's points -> every op's configuration for them (PipeSolution.reader)
Reader = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass
class PipeSolution(PipeTables):
    """One pipeline shape's frontier, with the tables plan building and re-costing need.

    Its points' configurations are read back on demand (`reader`): a search solves many shapes
    whose points later shapes beat, and reading every point's plan back through the stage
    factors took a tenth of the search; only the final frontier's points are read (ft.py)."""

    root: Factor
    partitions: list[Split]                      # per point: layers per stage
    stats: Stats = field(default_factory=Stats)
    reader: Reader | None = None                 # per point rows: every op's configuration, recompute vars
    _assigns: dict[str, np.ndarray] | None = None

    @classmethod
    def of(cls, tables: PipeTables, root: Factor, partitions: list[Split], assigns: dict[str, np.ndarray] | None = None,
           stats: Stats | None = None, reader: Reader | None = None) -> PipeSolution:
        """Given every point's `assigns`, or a `reader` of any points' (one of the two)."""
        assert (assigns is None) != (reader is None)
        return cls(shape=tables.shape, graph=tables.graph, chain=tables.chain, op_costs=tables.op_costs,
                   edge_costs=tables.edge_costs, buffers=tables.buffers, p2p=tables.p2p, p2p_bytes=tables.p2p_bytes,
                   root=root, partitions=partitions, stats=stats if stats is not None else Stats(), reader=reader,
                   _assigns=assigns)

    @property
    def assigns(self) -> dict[str, np.ndarray]:
        """Every point's configuration of every op (and recompute variable), read back once."""
        if self._assigns is None:
            assert self.reader is not None
            self._assigns = self.reader(np.arange(len(self.root)))
        return self._assigns

    @property
    def pipeline(self) -> PipeShape | None:
        return self.shape

    def read_back(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[Split | None]]:
        rows = np.asarray(rows, dtype=np.int64)
        if self._assigns is None and self.reader is not None:
            configs = self.reader(rows)
        else:
            configs = {name: v[rows] for name, v in self.assigns.items()}
        return configs, [self.partitions[int(r)] for r in rows]

    def configured_graph(self, graph: OpGraph) -> OpGraph:
        return self.graph

    def recost(self, graph: OpGraph, assignment: dict[str, np.ndarray], splits: list[Split | None]
               ) -> dict[str, np.ndarray]:
        """Stage by stage, the points of each split at once."""
        return recost_by_split(assignment, splits, lambda a, split: evaluate_pipeline(self, a, split))


def recost_by_split(assignment: dict[str, np.ndarray], splits: list[Split | None],
                    evaluate_split: Callable[[dict[str, np.ndarray], Split], dict[str, np.ndarray]]
                    ) -> dict[str, np.ndarray]:
    """A pipeline solution's points re-costed with one evaluation per distinct split over all its
    points (`evaluate_split(their assignments, split)`), each point's results in its row. The
    evaluation is elementwise over points, so each row is what evaluating its point alone gives;
    a shape's points mostly share a few splits (GPT-NeoX's accumulation shape: 187 points, one
    split, 11 of a request's 21 CPU s when evaluated point by point)."""
    by_split: dict[Split, list[int]] = {}
    for j, split in enumerate(splits):
        assert split is not None, "a pipeline point always has its split"
        by_split.setdefault(tuple(split), []).append(j)
    out: dict[str, np.ndarray] = {}
    for split, js in by_split.items():
        idx = np.array(js)
        res = evaluate_split({k: np.asarray(v).reshape(-1)[idx] for k, v in assignment.items()}, split)
        for k, v in res.items():
            if k not in out:
                out[k] = np.zeros((len(splits),) + v.shape[1:], dtype=v.dtype)
            out[k][idx] = v
    return out


@dataclass
class FrontierPoint:
    time_s: float
    memory_bytes: float
    mesh_index: int
    configs: dict[str, np.ndarray]  # op name -> configuration indices, shared by the mesh's points
    row: int                        # this point's position in those arrays
    stages: Split | None = None     # a pipeline plan: layers per stage

    @property
    def assignment(self) -> dict[str, int]:
        """op name -> index of its configuration in mesh.op_configs order."""
        return {name: int(v[self.row]) for name, v in self.configs.items()}


@dataclass
class SearchResult:
    graph: OpGraph
    cluster: Cluster
    job: TrainingJob
    solutions: list[Solution]
    points: list[FrontierPoint]
    search_seconds: float
    eps: float
    stats: dict[str, Any] = field(default_factory=dict)


__all__ = ["FrontierPoint", "MeshSolution", "PipeSolution", "SearchResult", "Solution", "Split"]
