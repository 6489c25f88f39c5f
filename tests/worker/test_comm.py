"""The plan is what ran: the collectives of one executed step, counted per module with
CommDebugMode, against the collectives the Plan's cost model prices on the tensor axis.

Two checks per tensor-parallel family:
- nothing ran that the plan does not price at that place (an executor defect would show here:
  before the executor reduced sequence-parallel gradients once, AdamW all-reduced them 3x);
- the counts are equal, kind by kind, per block, forward and backward.
"""

from __future__ import annotations

import pytest

from tests.worker.families import COMM_FAMILIES, P2P_FAMILIES
from worker.commcheck import expected_counts, measured_counts, mismatches


def _units(job, comm) -> set[str]:
    units = {e.unit for e in job.spec.expected_comms}
    units |= {k for k in comm if k != "Global" and "." not in k}
    units |= {".".join(k.split(".")[:2]) for k in comm if k.count(".") >= 1 and k.split(".")[1].isdigit()}
    return units


@pytest.mark.parametrize("name", COMM_FAMILIES)
def test_no_collective_the_plan_does_not_price(name, family_runs):
    job, raw = family_runs[name]
    comm = raw["ranks"][0]["comm"]
    assert comm, "CommDebugMode recorded nothing"
    exp = expected_counts(job.spec.expected_comms)
    got = measured_counts(comm, _units(job, comm))
    assert sum(got.values()) > 0
    extra = {k: n - exp[k] for k, n in got.items() if n > exp[k]}
    assert not extra, f"{name}: collectives the plan does not price: {extra}"


def test_every_rank_performs_the_same_collectives(family_runs):
    for name in COMM_FAMILIES:
        _, raw = family_runs[name]
        first = raw["ranks"][0]["comm"]
        assert all(r["comm"] == first for r in raw["ranks"]), name


def test_tp_collectives_equal_the_plan(family_runs):
    """Kind and count per module, forward and backward (a row-parallel bias once cost a gradient
    all-reduce torch never performs; op_costs now synchronises only labels that reach the output)."""
    job, raw = family_runs["tp"]
    assert mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"]) == []


def test_tp_sp_collectives_equal_the_plan(family_runs):
    """ln1's output, gathered for q, k and v, is converted once where they enter the attention
    module, as the plan prices it (it once priced one conversion per reader)."""
    job, raw = family_runs["tp+sp"]
    assert mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"]) == []


@pytest.mark.parametrize("name", P2P_FAMILIES)
def test_pipeline_sends_equal_the_plan(name, family_runs):
    """Each pp rank's point-to-point sends and receives of one step are those the plan prices:
    per micro-batch every chunk boundary is crossed once forward (the activation) and once back
    (its gradient), p x v - 1 boundaries (search/algorithm/interleave.py)."""
    job, raw = family_runs[name]
    pipe = job.spec.pipeline
    for r in raw["ranks"]:
        want = pipe.p2p[r["coord"]["pp"]]
        assert r["p2p"] == {"send": want, "recv": want}, f"{name} rank {r['rank']}"
    one_pipeline = [r for r in raw["ranks"] if all(v == 0 for k, v in r["coord"].items() if k != "pp")]
    assert len(one_pipeline) == pipe.stages
    boundaries = pipe.stages * pipe.virtual_stages - 1
    assert sum(r["p2p"]["send"] for r in one_pipeline) == 2 * pipe.micro_batches * boundaries


@pytest.mark.parametrize("name", ["tp 2-d", "tp 2-d fastest"])
def test_2d_tensor_collectives_equal_the_plan(name, family_runs):
    """Two tensor axes: each axis's conversions happen where the plan puts them, as DTensor's
    redistributions of both placements at once; kind and count per block equal the plan's (an
    all-to-all the plan prices is an all-gather and a chunk in DTensor on a CPU mesh)."""
    job, raw = family_runs[name]
    assert [d.name for d in job.spec.mesh] == ["tp", "tp2"]
    assert any(e.kind == "all_gather" for e in job.spec.expected_comms)
    assert mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"]) == []
