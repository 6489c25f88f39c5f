"""Faithfulness: each plan family, run as real training on 4 gloo processes, reproduces the
single-process reference run (same model, initialisation, data and optimizer) step by step."""

from __future__ import annotations

import pytest

from tests.worker.families import FAMILIES, STEPS
from tests.worker.parity import assert_losses_match
from worker.reference import reference_losses

TOL = 2e-5  # fp32, losses ~6: collectives reorder float sums, nothing more


@pytest.mark.parametrize("name", list(FAMILIES))
def test_loss_matches_single_process(name, family_runs):
    job, raw = family_runs[name]
    spec = job.spec
    # data parallelism over a BatchNorm model is per-shard BatchNorm: the reference accumulates
    # gradients over the same shards (see the note the analysis attaches)
    shards = spec.size("data") if any("BatchNorm" in n for n in spec.notes) else 1
    # PipeDream-2BW's reference is one process applying its rule: each step's passes on the weights
    # of the step before (1-stale), its gradients applied to the newest weights
    ref = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr, shards=shards, stale=spec.pipeline.schedule == "2bw")
    got = raw["losses"]
    assert_losses_match(f"{name} ({spec.summary})", got, ref, STEPS, TOL)


def test_the_families_cover_the_parallelisms(family_runs):
    """The runs really used the APIs the families stand for (not, say, all plain DP)."""
    kinds = {name: (job.spec.data_parallel, tuple(d.name for d in job.spec.mesh), job.spec.pipeline.schedule,
                    {s.style for s in job.spec.styles}, bool(job.spec.recompute))
             for name, (job, _) in family_runs.items()}
    assert kinds["dp"][0] == "ddp" and kinds["fsdp"][0] == "fsdp" and kinds["zero1"][0] == "zero1"
    assert kinds["pp x fsdp"][:3] == ("fsdp", ("pp", "dp"), "1f1b")
    assert kinds["tp"][1] == ("tp",) and {"colwise", "rowwise"} <= kinds["tp"][3]
    assert "sequence" in kinds["tp+sp"][3]
    assert kinds["dp x tp"][1] == ("dp", "tp")
    assert kinds["pp gpipe"][2] == "gpipe" and kinds["pp 1f1b"][2] == "1f1b"
    assert kinds["pp x tp"][1] == ("pp", "tp")
    assert kinds["recompute"][4] and kinds["tp+recompute"][4]
    assert kinds["tp 2-d"][1] == ("tp", "tp2") and kinds["tp 2-d"][3] == {"placed", "prepare_input"}
    assert family_runs["pp interleaved"][0].spec.pipeline.virtual_stages == 2
    assert kinds["pp 2bw"][2] == "2bw"
    assert family_runs["pp uneven"][0].spec.pipeline.stage_layers == [[0, 3], [3, 4]]


def test_2bw_trains_on_weights_one_update_old(family_runs):
    """The 2BW run is not the synchronous one: from the second step on, its passes read the weights
    of the update before (the stale reference above is what it matches)."""
    job, raw = family_runs["pp 2bw"]
    spec = job.spec
    sync = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed, lr=job.settings.lr)
    assert raw["losses"][0] == pytest.approx(sync[0], abs=TOL)
    assert abs(raw["losses"][1] - sync[1]) > 100 * TOL


def test_ranks_report_time_and_memory(family_runs):
    for name, (_, raw) in family_runs.items():
        for r in raw["ranks"]:
            assert r["time_s"] > 0, name
            assert r["memory_bytes"] and r["memory_bytes"] > 0, name
        assert len(raw["ranks"]) == 4


def test_fsdp_holds_less_per_rank_than_dp(family_runs):
    """ZeRO-3 shards parameters and optimizer state: its measured peak is below DP's."""
    dp = max(r["memory_bytes"] for r in family_runs["dp"][1]["ranks"])
    fsdp = max(r["memory_bytes"] for r in family_runs["fsdp"][1]["ranks"])
    assert fsdp < dp
