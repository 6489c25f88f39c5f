"""Pipelines and gradient accumulation over several block stacks: encoder-decoder models.

An encoder-decoder graph (search/models/seq2seq.py) has two block families; the decoder's layers
all read the encoder's output (cross-attention), and T5's layers all read their stack's position
bias. The single-stack pipeline search (pipeline.py) cuts one chain of identical layers whose
only link across a cut is the residual stream; here a cut may fall anywhere in the sequence
*units* = the encoder's layers, then the decoder's, and a stage may hold encoder layers, decoder
layers or both.

Where the other ops go. An op outside the layers sits with the unit it follows when it reads
some layer (the encoder's final norm with the last encoder layer, the LM head and loss with the
last decoder layer), else with the first unit that reads it (the decoder's embedding with the
first decoder layer, a position bias with the first layer of its stack).

What crosses a cut. Every tensor produced on one stage and read on another - the residual
stream at the cut, and the encoder output, which every stage holding decoder layers needs - is
sent point-to-point once per micro-batch to each stage that reads it (forward activation and its
gradient back, on the pp link), in the producer's layout; the receiving stage pays it within its
slots. Reading it is an edge like any other, priced on the reader's stage; so is a pair
constraint between ops on two stages (a tied parameter's layouts: T5's and BART's shared
embedding, read by the encoder, the decoder and the head). A tied parameter's copy on a second
stage is not counted, as in pipeline.py.

Exact search. Fix the shape (p, m, sub-mesh, ZeRO stage, schedule). Each stage's cost is a sum
over its ops, edges and received tensors under its weights (evaluate.stage_weights), so FT's
elimination solves stage s holding units [a, e) down to a factor over its *interface*: the ops
whose outputs cross a cut into or out of it. Stages share no variable but the interface, and a
pipeline's time and memory are those of its slowest and its heaviest stage. The stages are
combined one of two ways, both exact - equal to the enumeration of every assignment and cut
(`stack_tables.exhaustive_stacks`):
- each cut on its own (stack_cuts.py, a shape of at most MAX_CUTS cuts): per joint interface
  configuration, the pointwise maximum of the stages' staircases; the union
  over configurations and cuts, Pareto-reduced. The cuts and configurations most promising by
  their bounds go first, and one whose bound a plan already found beats is never combined.
- a DP over the stages (stack_dp.py, more cuts: 477k for 16 stages over 24 units): the state
  after s stages is the units they cover and the frontier of (max time, max memory) per
  configuration of the variables carried across that position (each interface
  variable from the first to the last position one of its edges crosses); a step pairs a state
  with stage s's factor, each pair costing the larger time and the larger memory
  (`frontier.peak_join`), eliminates what is carried no further, and the states reaching one
  position are united. Linear in the stages.

Gradient accumulation is the one-stage case: every unit on one stage, m micro-batches as m slots,
one micro-batch's activations held, no interface.

Block reuse. A stack whose layers one template stands for (families.py: T5's and BART's
encoder and decoder) is solved as FT's flat meshes solve it: its copies' outputs share the
boundary's configuration (the tie), the template is eliminated once per stage weights to a
factor over (boundary, side inputs), and a stage's run of k copies is k copies by doubling. The
tie is part of the space, as on flat meshes (the reference ties too: `exhaustive_stacks(tie=)`);
`reuse=False` solves every stage op by op, untied.

Pruning, exact. A stage over units [a, e) is bounded before it is solved (stack_bounds.py): each
family copy at its template's least time and least memory (a min-sum elimination,
`families.unit_least`), and in the DP each unit's loose ops with the edges into them (min-sum
again: the LM head and the loss priced apart left BART's last stages at a third of their memory)
and the transfers the stage receives at their cheapest (the stream at the cut, the encoder's
output); each cut on its own keeps the loose ops at their cheapest alone (its bounds order the
cuts and so pick among equal-cost plans: tighter ones changed T5's picks). A cut's bound is its
slowest and heaviest stage's; in the DP a partial plan ends in plans at least as slow and as
heavy as it and as the stages still to come (the best cut of the rest): where a known plan (the
envelope: plans of other shapes) beats that in both, it is dropped, and a stage none of whose
partial plans survive is never solved.

Left out on purpose: a cut whose interface, or a DP step whose variables (carried in, the
stage's interface, carried on), have more than MAX_INTERFACE joint configurations (counted out of the space, so the search stays
exact over what it offers); interleaved 1F1B (virtual stages of a two-stack sequence have no executor
either).

The modules, each importing only those before it: stack_tables.py (a shape's tables, where each
op sits, the exact price of given assignments and the reference), stack_solution.py (a shape's
solved frontier, read back and priced again), stack_stages.py (each stage's factor over its
interface), stack_bounds.py (the bounds and the staircase of found plans), stack_cuts.py and
stack_dp.py (the two ways of combining stages), and this one: which way a shape takes, and every
shape of a search.
"""

from __future__ import annotations

import numpy as np

from search.algorithm.evaluate import (
    PipeShape,
    micro_batch_graph,
)
from search.algorithm.pipeline import pipeline_shapes, stage_band
from search.algorithm.stack_bounds import Staircase, rest_bounds, shape_bound, stage_bounds
from search.algorithm.stack_cuts import band_cuts, by_cuts
from search.algorithm.stack_dp import by_stages
from search.algorithm.stack_solution import StacksSolution
from search.algorithm.stack_stages import StageFactors
from search.algorithm.stack_tables import (
    STACKS_BAND,
    SharedTables,
    StackTables,
    is_multi_stack,
    stack_tables,
    units,
)
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.profile import DeviceProfile, ProfileLookup

# cuts of a shape up to which each is solved on its own (the stages' DP beyond)
MAX_CUTS = 2_000


def solve_stacks(tabs: StackTables, eps: float = 0.0, recompute: bool = True,
                 envelope: tuple[np.ndarray, np.ndarray] | None = None, reuse: bool = True) -> StacksSolution | None:
    """The exact frontier of one shape over every cut of the band. With an `envelope` of plans
    known to exist (time, memory with buffers), what one of them beats in both is dropped:
    exact. Few cuts (T5's 12 units): each cut on its own, the most promising first, whose plans
    prune the rest (`by_cuts`); many (BART's 24 units over 8 or 16 stages: up to 477k): the DP
    over the stages (`by_stages`), linear in them."""
    p, n = tabs.shape.stages, tabs.n_units
    S = StageFactors(tabs, eps, recompute, reuse)
    band = list(stage_band(n, p, 1, STACKS_BAND))
    stair = Staircase(envelope, tabs.buffers)
    if cut_count(n, p, band) <= MAX_CUTS:
        # the ops at their cheapest alone: the bounds order the cuts and their configurations,
        # and so decide which equal-cost plans are combined at all, and pareto_mask's pick among
        # exact ties follows the whole array - the tight bounds, exact too, changed T5's picks
        return by_cuts(S, band_cuts(n, p), stair, *stage_bounds(S, tight=False))
    t_stage, m_stage = stage_bounds(S)
    return by_stages(S, band, stair, t_stage, m_stage, rest_bounds(t_stage, m_stage, p, n, band))


def cut_count(n: int, p: int, band: list[int]) -> int:
    """How many cuts of n units into p stages the band allows (`band_cuts`, without listing
    the 477k of 16 stages over 24 units)."""
    ways = [1] + [0] * n  # ways[e]: the cuts of the first e units into the stages so far
    for _ in range(p):
        ways = [sum(ways[e - k] for k in band if k <= e) for e in range(n + 1)]
    return ways[n]


def stack_shapes(cluster: Cluster, job: TrainingJob, graph: OpGraph, zero_stages: tuple[int, ...],
                 allow_async: bool = False, pipelines: bool = True, accumulate: bool = False) -> list[PipeShape]:
    """The shapes of pipeline.py's space (no virtual stages) over the sequence of units."""
    n = len(units(graph))
    return [s for s in pipeline_shapes(cluster, job, n, zero_stages, allow_async, pipelines=pipelines,
                                       accumulate=accumulate, spread=STACKS_BAND)
            if s.virtual_stages == 1]


def search_stacks(graph: OpGraph, cluster: Cluster, job: TrainingJob, zero_stages: tuple[int, ...],
                  recompute: bool = True, allow_async: bool = False, eps: float = 0.0,
                  profile: DeviceProfile | ProfileLookup | None = None, pipelines: bool = True,
                  accumulate: bool = False, shapes: list[PipeShape] | None = None,
                  counts: dict[str, int] | None = None,
                  envelope: tuple[np.ndarray, np.ndarray] | None = None, reuse: bool = True) -> list[StacksSolution]:
    """Every shape's frontier over the graph's block stacks (pipelines with p >= 2 and gradient
    accumulation with p = 1, as pipeline.search_pipelines offers them for one stack). With an
    `envelope` of plans known to exist, a shape whose bound (`shape_bound`) they beat is skipped."""
    if not is_multi_stack(graph):
        return []
    shapes = shapes if shapes is not None else stack_shapes(cluster, job, graph, zero_stages, allow_async,
                                                            pipelines, accumulate)
    models: dict[int, tuple[OpGraph, CostModel, SharedTables]] = {}
    bounded: list[tuple[tuple[float, float], int, StackTables]] = []
    for k, shape in enumerate(shapes):
        m = shape.micro_batches
        if m not in models:
            g = micro_batch_graph(graph, m)
            # the shape-free pricing (collective coefficients, boundaries) shared with the first
            # count's model: the same tables as a fresh one (tests/search/algorithm/test_fast_paths.py)
            like = next(iter(models.values()))[1] if models else None
            cm = CostModel(g, cluster, job.model_copy(update={"global_batch": job.global_batch // m}), profile=profile,
                           like=like)
            models[m] = (g, cm, SharedTables(g, cm))
        g, cm, shared = models[m]
        tabs = stack_tables(g, cm, shape, shared)
        if tabs is not None:
            bounded.append((shape_bound(tabs), k, tabs))
    # accumulation first, then each kind by its time bound: the plans found bound the rest
    bounded.sort(key=lambda x: (x[2].shape.stages > 1, x[0][0], x[1]))
    out: list[StacksSolution] = []
    solved = skipped = 0
    for (t_lb, m_lb), _, tabs in bounded:
        if envelope is not None and len(envelope[0]) and bool(np.any(
                (envelope[0] < t_lb * (1.0 - 1e-9)) & (envelope[1] < m_lb * (1.0 - 1e-9)))):
            skipped += 1  # a known plan beats every plan of this shape in both: exact
            continue
        solved += 1
        sol = solve_stacks(tabs, eps, recompute, envelope=envelope, reuse=reuse)
        if sol is not None and len(sol.root):
            out.append(sol)
            if envelope is not None:
                envelope = (np.concatenate([envelope[0], sol.root.t]), np.concatenate([envelope[1], sol.root.m]))
    if counts is not None:
        counts.update(shapes=len(bounded), bounded_out=skipped, solved=solved)
    return out
