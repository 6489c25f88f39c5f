"""Bounds that let the stage search skip work exactly (stacks.py: pruning): what no plan of a
stage (`stage_bounds`), of the stages still to come (`rest_bounds`) or of a whole shape
(`shape_bound`) beats, and the staircase of plans found so far that is asked whether one beats a
bound (`Staircase`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from search.algorithm.evaluate import (
    Weights,
    stage_weights,
    weigh_op,
)
from search.algorithm.minsum import least_sums
from search.algorithm.stack_stages import StageFactors
from search.algorithm.stack_tables import StackTables


def stage_bounds(S: StageFactors, tight: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per stage s, a time and a memory no plan of stage s holding units [a, e) beats
    ([a, e] tables): each family copy it holds at its template's cheapest (solved under the
    stage's weights with the edges inside it, which on a tensor-parallel mesh are most of a
    layer's cost); the other ops of each unit with the edges into them at their cheapest
    (`loose_least`) and the transfers it receives at theirs (`received_least`) - or, not
    `tight`, each other op at its cheapest alone (edges and transfers cost >= 0). Per-unit
    sums, so each is a prefix-sum difference. Every distinct stage weighting at once: one
    elimination per unit and per family."""
    tabs = S.tabs
    ws = list(dict.fromkeys(S.weights))
    ut, um = loose_least(S, ws) if tight else ops_least(S, ws)  # [weighting, unit]
    for fam in S.var.families:
        t1, m1 = S.least(fam, ws)
        at = np.array([tabs.anchor[fam.chain.layers[i][-1]] for i in fam.copies])
        for j in range(len(ws)):
            np.add.at(ut[j], at, t1[j])
            np.add.at(um[j], at, m1[j])
    recv = received_least(S) if tight else None
    per_w: dict[Weights, tuple[np.ndarray, np.ndarray]] = {}
    for j, w in enumerate(ws):
        ct, cm = np.concatenate([[0.0], np.cumsum(ut[j])]), np.concatenate([[0.0], np.cumsum(um[j])])
        t_span = ct[None, :] - ct[:, None]
        per_w[w] = (t_span if recv is None else t_span + w.slots * recv, cm[None, :] - cm[:, None])
    return [per_w[w][0] for w in S.weights], [per_w[w][1] for w in S.weights]


def ops_least(S: StageFactors, ws: list[Weights]) -> tuple[np.ndarray, np.ndarray]:
    """Per weighting and unit ([weighting, unit]), the sums of the unit's ops outside any family
    copy each at its least time and at its least memory, alone."""
    tabs = S.tabs
    covered = {name for fam in S.var.families for name in fam.covered}
    loose = [name for name in tabs.op_costs if name not in covered]
    unit = np.array([tabs.anchor[name] for name in loose], dtype=np.int64)
    ut, um = np.zeros((len(ws), tabs.n_units)), np.zeros((len(ws), tabs.n_units))
    for j, w in enumerate(ws):
        weighed = [S._weigh(name, w) for name in loose]
        np.add.at(ut[j], unit, [float(min(o.time.min(), o.time_rc.min())) for o in weighed])
        np.add.at(um[j], unit, [float(min(o.mem.min(), o.mem_rc.min())) for o in weighed])
    return ut, um


def loose_least(S: StageFactors, ws: list[Weights]) -> tuple[np.ndarray, np.ndarray]:
    """Per weighting and unit ([weighting, unit]), the least time and the least memory (each on
    its own) of the unit's ops outside any family copy with the edges into them: the stage's
    factors of that unit (`StageFactors.unit_factors`), min-sum eliminated with every variable
    free. A variable they share with another unit's factors may take another value there, so
    the sum over a stage's units is at most its least cost (a minimum of a sum is at least the
    sum of the minima). The edges make it tight where each op at its cheapest is not: the LM
    head's logits in one layout and the loss reading them in another pay the relayout and the
    copy kept for backward (BART's last stages were bounded at a third of their memory)."""
    n = S.tabs.n_units
    ut, um = np.zeros((len(ws), n)), np.zeros((len(ws), n))
    for u in range(n):
        if not S.loose[u]:
            continue  # every edge into a unit without loose ops is its family copy's (unit_least)
        least = least_sums([S.unit_factors(u, w) for w in ws], S.domain, (), np.eye(2))  # [weighting, objective]
        ut[:, u], um[:, u] = least[:, 0], least[:, 1]
    return ut, um


def received_least(S: StageFactors) -> np.ndarray:
    """[a, e]: the least time per slot of the transfers a stage over units [a, e) receives (each
    tensor its ops read from an earlier unit, once per variable, at its cheapest layout; as
    `StageFactors._solve` prices them): the residual stream at the cut and, on a decoder stage,
    the encoder's output - what kept a middle stage's bound below its need without it. Zero
    without pipeline stages (no transfers)."""
    tabs = S.tabs
    n = tabs.n_units
    out = np.zeros((n + 1, n + 1))
    if not tabs.p2p:
        return out
    anchor, var = tabs.anchor, S.var
    # per unit, each variable it reads from another unit, with the earliest unit producing it
    reads: list[dict[str, int]] = []
    for u in range(n):
        got: dict[str, int] = {}
        for _, _, src in sorted(S.reads[u]):
            if anchor[src] != u:
                v = var(src)
                got[v] = min(got.get(v, n), anchor[src])
        reads.append(got)
    least = {v: float(tabs.p2p[v].min()) for got in reads for v in got}
    for a in range(n):
        seen: set[str] = set()
        total = 0.0
        for e in range(a + 1, n + 1):
            for v, lo in reads[e - 1].items():
                if lo < a and v not in seen:  # produced before the stage: received, once
                    seen.add(v)
                    total += least[v]
            out[a, e] = total
    return out


@dataclass
class RestBounds:
    """[s, e]: a time (`t`) and a memory (`m`) no plan of stages s .. p - 1 over units [e, n)
    beats - the least over their cuts of the slowest stage's bound, and of the heaviest's, each
    on its own; inf where those stages cannot cover those units within the band - and how many
    cuts they have (`cuts`)."""

    t: np.ndarray
    m: np.ndarray
    cuts: np.ndarray


def rest_bounds(t_stage: list[np.ndarray], m_stage: list[np.ndarray], p: int, n: int, band: list[int]) -> RestBounds:
    t = np.full((p + 1, n + 1), np.inf)
    m = np.full((p + 1, n + 1), np.inf)
    cuts = np.zeros((p + 1, n + 1))
    t[p, n] = m[p, n] = 0.0
    cuts[p, n] = 1
    for s in range(p - 1, -1, -1):
        for e in range(n):
            for k in band:
                if e + k <= n and np.isfinite(t[s + 1, e + k]):
                    t[s, e] = min(t[s, e], max(t_stage[s][e, e + k], t[s + 1, e + k]))
                    m[s, e] = min(m[s, e], max(m_stage[s][e, e + k], m[s + 1, e + k]))
                    cuts[s, e] += cuts[s + 1, e + k]
    return RestBounds(t, m, cuts)


class Staircase:
    """The points found so far (and an envelope of known plans), asked whether one beats a
    bound in both time and memory by more than rounding. New points wait in a small batch and
    join the sorted staircase when it fills."""

    BATCH = 256

    def __init__(self, envelope: tuple[np.ndarray, np.ndarray] | None, buffers: float) -> None:
        self.buffers = buffers
        self.t = np.zeros(0)
        self.m = np.zeros(0)  # running minimum of memory over t ascending
        self.pending_t: list[np.ndarray] = []
        self.pending_m: list[np.ndarray] = []
        self.n_pending = 0
        if envelope is not None and len(envelope[0]):
            self._rebuild(np.asarray(envelope[0], float), np.asarray(envelope[1], float))

    def _rebuild(self, t: np.ndarray, m: np.ndarray) -> None:
        t = np.concatenate([self.t, t])
        m = np.concatenate([self.m, m])
        o = np.argsort(t, kind="stable")
        self.t, self.m = t[o], np.minimum.accumulate(m[o])

    def add(self, t: np.ndarray, m: np.ndarray) -> None:
        self.pending_t.append(t)
        self.pending_m.append(m + self.buffers)
        self.n_pending += len(t)
        if self.n_pending >= self.BATCH:
            self._rebuild(np.concatenate(self.pending_t), np.concatenate(self.pending_m))
            self.pending_t, self.pending_m, self.n_pending = [], [], 0

    def beats_all(self, t_lb: np.ndarray, m_lb: np.ndarray) -> np.ndarray:
        """`beats` for many bounds against the staircase (not the pending batch)."""
        t_cut = t_lb * (1.0 - 1e-9)
        m_cut = (m_lb + self.buffers) * (1.0 - 1e-9)
        k = np.searchsorted(self.t, t_cut, side="left")
        if not len(self.t):
            return np.zeros(len(t_lb), dtype=bool)
        return (k > 0) & (self.m[np.maximum(k - 1, 0)] < m_cut)

    def beats(self, t_lb: float, m_lb: float) -> bool:
        t_cut = t_lb * (1.0 - 1e-9)
        m_cut = (m_lb + self.buffers) * (1.0 - 1e-9)
        k = int(np.searchsorted(self.t, t_cut, side="left"))
        if k and self.m[k - 1] < m_cut:
            return True
        return any(bool(np.any((pt < t_cut) & (pm < m_cut)))
                   for pt, pm in zip(self.pending_t, self.pending_m, strict=True))


def shape_bound(tabs: StackTables) -> tuple[float, float]:
    """A (time, memory) no plan of the shape beats: the stages' sums are at least every op at its
    cheapest in each (transfers and edges cost >= 0), and the busiest stage holds at least 1/p of
    the sums (every stage runs the same slots; the fewest micro-batches in flight on any)."""
    shape = tabs.shape
    p = shape.stages
    ws = stage_weights(p, shape.micro_batches, shape.schedule)
    w = Weights(slots=min(x.slots for x in ws), copies=min(x.copies for x in ws),
                inflight=min(x.inflight for x in ws))
    t = m = 0.0
    for oc in tabs.op_costs.values():
        wo = weigh_op(oc, w)
        t += float(min(wo.time.min(), wo.time_rc.min()))
        m += float(min(wo.mem.min(), wo.mem_rc.min()))
    return t / p, m / p + tabs.buffers
