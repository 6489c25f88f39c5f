"""One shape's solved frontier over several block stacks: every point's cut and assignment, read
back and priced again as the plans need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from search.algorithm.chain import Chain
from search.algorithm.evaluate import (
    PipeShape,
)
from search.algorithm.frontier import (
    Factor,
    Stats,
)
from search.algorithm.results import Split, recost_by_split
from search.algorithm.stack_tables import StackTables, evaluate_stacks
from search.models.graph import OpGraph
from search.prices.costmodel import EdgeCosts, OpCosts
from search.prices.mesh import Mesh


@dataclass
class StacksSolution:
    """One shape's frontier over several block stacks: every point's assignment and cut."""

    tables: StackTables
    root: Factor
    partitions: list[Split]
    assigns: dict[str, np.ndarray]
    stats: Stats = field(default_factory=Stats)

    @property
    def chain(self) -> Chain | None:
        return None  # no single-stack chain: families are read back through each stage's factor

    @property
    def edge_costs(self) -> dict[tuple[str, str], EdgeCosts]:
        return self.tables.edge_costs

    @property
    def buffers(self) -> float:
        return self.tables.buffers

    @property
    def mesh(self) -> Mesh:
        return self.tables.shape.mesh

    @property
    def zero(self) -> int:
        return self.tables.shape.zero

    @property
    def pipeline(self) -> PipeShape:
        return self.tables.shape

    @property
    def shape(self) -> PipeShape:
        return self.tables.shape

    @property
    def op_costs(self) -> dict[str, OpCosts]:
        return self.tables.op_costs

    def describe(self) -> str:
        return self.tables.shape.describe()

    def read_back(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[Split | None]]:
        return {name: v[rows] for name, v in self.assigns.items()}, [self.partitions[int(r)] for r in rows]

    def configured_graph(self, graph: OpGraph) -> OpGraph:
        return self.tables.graph

    def recost(self, graph: OpGraph, assignment: dict[str, np.ndarray], splits: list[Split | None]
               ) -> dict[str, np.ndarray]:
        # one evaluation per distinct cut over all its points: per point, T5's plans took ~90 s
        return recost_by_split(assignment, splits, lambda a, split: evaluate_stacks(self.tables, a, split))
