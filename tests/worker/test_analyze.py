"""Plans the executor cannot run as planned are refused before launch, naming the op or reason;
the ones it can are mapped onto the torch APIs the module docstrings promise."""

from __future__ import annotations

from functools import cache

import pytest

from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from tests.worker.configs import GPT2
from tests.worker.families import baseline, estimated, pipelined
from worker.analyze import Unsupported, analyze
from worker.launch import check_capacity


@cache
def gpt2_frontier() -> list[Plan]:
    o = run_search(SearchRequest(model="gpt2-tiny", device="cpu", devices=4, devices_per_node=4, global_batch=8,
                                 precision="fp32"))
    return o.plans


def test_search_offers_one_role_per_axis():
    """Every frontier plan splits the batch on dp for every op that carries one and never on tp
    (search/prices/mesh.py axis_choices): the mixes the executor cannot express are not in the space."""
    for plan in gpt2_frontier():
        roles = {a.name: a.role for a in plan.mesh.axes}
        assert roles == {"dp": "data", "tp": "tensor"}
        ops = list(plan.ops) + [o for b in plan.blocks for v in b.variants for o in v]
        for o in ops:
            dp, tp = o.config
            assert tp != "batch", (plan.summary, o.op)
            assert plan.mesh.axes[0].size == 1 or dp == "batch" or o.op == "pos_emb:embedding", (plan.summary, o.op)


@pytest.mark.parametrize(("model", "devices"), [("gpt2-tiny", 2), ("gpt2-tiny", 8), ("llama-tiny", 4),
                                               ("llama-tiny", 8), ("cnn-tiny", 8)])
def test_every_frontier_plan_is_executable(model, devices):
    """docs/design.md, Strategy space: every configuration the search offers runs as planned. Before axes had roles
    and tensors one conversion for all their readers, 40 of gpt2-tiny@4's 43 plans were refused."""
    o = run_search(SearchRequest(model=model, device="cpu", devices=devices, devices_per_node=devices,
                                 global_batch=16, precision="fp32", pipeline=True))
    assert o.plans
    for plan in o.plans + [Plan.model_validate(b.plan) for b in o.report.baselines]:
        analyze(plan)  # raises Unsupported naming the op if not


_TINY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256,
             max_position_embeddings=128, pad_token_id=0)
# transformers' own modules the executor once refused where the search had split them: GPT-2's
# Conv1D and its activation module between two of them, Gemma-3's embedding scaled in its forward,
# OPT's learned positions and its layers' sequence (flattened and unflattened by its MLP), BERT's
# head transform (a square weight a tie makes one label), Phi-3's fused gate_up read by the MLP's
# product and by its activation module
HF_CASES = {
    "gpt2": (GPT2, 4),
    "gemma3_text": ({"model_type": "gemma3_text", **_TINY, "num_key_value_heads": 2, "head_dim": 16}, 4),
    "opt": ({"model_type": "opt", **_TINY, "ffn_dim": 128, "word_embed_proj_dim": 64}, 8),
    "bert": ({"model_type": "bert", **_TINY}, 8),
    "phi3": ({"model_type": "phi3", **_TINY, "num_key_value_heads": 2}, 8),
    # its lm head's bias is its decoder's (tied): the head module itself never reads it
    "roberta": ({"model_type": "roberta", **_TINY}, 8),
    # its logits leave the lm head to two readers (the loss's cast, the cast the model returns):
    # one conversion where the head ends serves both, so they must want one placement
    "mamba": ({"model_type": "mamba", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
               "vocab_size": 256, "pad_token_id": 0}, 8),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(HF_CASES))
def test_every_frontier_plan_of_an_hf_config_is_executable(family):
    config, devices = HF_CASES[family]
    o = run_search(SearchRequest(hf_config=config, name=family, device="cpu", devices=devices,
                                 devices_per_node=devices, global_batch=8, seq_len=32, precision="fp32",
                                 baselines=False))
    assert any(a.role == "tensor" and a.size > 1 for p in o.plans for a in p.mesh.axes), "no tensor axis searched"
    refused = []
    for plan in o.plans:
        try:
            analyze(plan)
        except Unsupported as e:
            refused.append(f"{plan.summary}: {e}")
    assert not refused, "\n".join(refused)


def test_mixed_axis_is_refused_naming_the_op():
    """A hand-edited plan splitting the batch on dp for most ops but one embedding's hidden size on
    the same axis is not expressible as DDP/FSDP + parallelize_module."""
    plan = baseline("gpt2-tiny", "data-parallel")
    ops = [o.model_copy(update={"config": ["hidden", *o.config[1:]]}) if o.op == "tok_emb:embedding" else o
           for o in plan.ops]
    with pytest.raises(Unsupported, match=r"op 'tok_emb:embedding' splits 'hidden' on mesh axis"):
        analyze(plan.model_copy(update={"ops": ops}))


def test_1f1b_with_too_few_micro_batches_is_refused():
    plan = pipelined(baseline("gpt2-tiny", "data-parallel", 2), 2, "1f1b", 1)
    with pytest.raises(Unsupported, match="1F1B needs at least as many micro-batches"):
        analyze(plan)


def test_unknown_recompute_module_is_refused():
    plan = baseline("gpt2-tiny", "data-parallel").model_copy(update={"recompute": ["blocks.7"]})
    with pytest.raises(Unsupported, match="'blocks.7'"):
        analyze(plan)


def test_plan_for_another_model_is_refused():
    plan = baseline("gpt2-tiny", "data-parallel").model_copy(update={"model": "llama-tiny"})
    with pytest.raises(Unsupported, match="block stack|no configuration for op"):
        analyze(plan)


def test_megatron_sp_maps_onto_parallelize_module_styles():
    spec = analyze(baseline("gpt2-tiny", "megatron-tp4-sp-dp"))
    by_module = {(s.module, s.style): s for s in spec.styles}
    assert by_module[("blocks.0.attn.q", "colwise")]
    assert by_module[("blocks.0.attn.o", "rowwise")].output_layout == "Shard(1)"  # reduce-scatter into SP
    assert by_module[("blocks.0.ln1", "sequence")].sequence_dim == 1
    gather = by_module[("blocks.0.attn", "prepare_input")]  # one all-gather for q, k and v
    assert (gather.input_layout, gather.desired_input_layout, gather.use_local_output) == ("Shard(1)", "Replicate()", False)
    # the vocabulary splits (Megatron's vocab-parallel embedding, tied to the LM head): the embedding's
    # partial sums are reduce-scattered into the sequence split, the head's logits gathered whole
    assert by_module[("tok_emb", "rowwise")].output_layout == "Shard(1)"
    assert by_module[("lm_head", "colwise")].output_layout == "Replicate()"
    assert [d.name for d in spec.mesh] == ["tp"] and spec.data_parallel == "none"


def test_zero_stages_map_to_data_parallel_apis():
    plan = baseline("gpt2-tiny", "data-parallel")
    got = {z: (s.data_parallel, s.reshard_after_forward)
           for z in range(4) for s in [analyze(plan.model_copy(update={"zero_stage": z}))]}
    assert got == {0: ("ddp", False), 1: ("zero1", False), 2: ("fsdp", False), 3: ("fsdp", True)}


def test_axes_are_named_by_role_not_by_plan_name():
    """A plan (say, hand-written) that splits the batch on an axis it calls 'tp' runs it as data parallelism."""
    plan = baseline("llama-tiny", "data-parallel")
    dp, tp = plan.mesh.axes
    mesh = plan.mesh.model_copy(update={"axes": [dp.model_copy(update={"name": "tp"}), tp.model_copy(update={"name": "dp"})]})
    spec = analyze(plan.model_copy(update={"mesh": mesh}))
    assert [(d.name, d.role, d.plan_axes) for d in spec.mesh] == [("dp", "data", ["tp"])]


def test_too_many_processes_are_refused_before_launch():
    spec = analyze(baseline("gpt2-tiny", "data-parallel"))
    with pytest.raises(Unsupported, match="needs 4 processes .* hosts at most 2"):
        check_capacity(spec, "cpu", max_procs=2)


def test_too_much_memory_is_refused_before_launch():
    spec = analyze(baseline("gpt2-tiny", "data-parallel"))
    spec = spec.model_copy(update={"predicted_memory_bytes": 2**50})
    with pytest.raises(Unsupported, match="of memory .* available"):
        check_capacity(spec, "cpu")


def test_a_tied_parameter_split_over_tp_across_pipeline_stages_is_accepted():
    """GPT's vocabulary-parallel head and embedding share a weight; pipelined, they are a copy on
    the first and on the last stage, each split along the vocabulary (the executor sums their
    gradients as placed, worker/executor.py Runner._sum_tied_grads; launched in
    tests/worker/test_tied_pipelines.py): accepted, and `paretoplan estimate` calls the same
    layout launchable."""

    plan = pipelined(baseline("gpt2-tiny", "megatron-tp2-dp", 2), 2, "1f1b", 2)
    spec = analyze(plan)
    tied = {st.module: st.style for st in spec.styles if st.module in ("tok_emb", "lm_head")}
    assert tied == {"tok_emb": "rowwise", "lm_head": "colwise"}  # both shard the vocabulary (dim 0)
    assert any("tied parameters across pipeline stages" in n for n in spec.notes)
    from search.plans.estimate import EstimateRequest, estimate

    e = estimate(EstimateRequest(model="gpt2-tiny", device="cpu", devices=4, global_batch=8, precision="fp32",
                                 tp=2, pp=2, micro_batch=2))
    assert e.launchable, e.not_launchable_reason


def test_interleaved_1f1b_runs_the_plans_chunks():
    """An interleaved plan runs its chunks where the plan puts them (chunk c on pp rank c % p);
    what torch's ScheduleInterleaved1F1B cannot run is refused before launch."""
    plan = estimated("gpt2-mini", pp=2, micro_batch=1, virtual_stages=2)
    spec = analyze(plan)
    assert spec.pipeline.virtual_stages == 2 and spec.pipeline.stage_layers == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert [spec.pipeline.chunks_of(r) for r in (0, 1)] == [[0, 2], [1, 3]]
    assert spec.pipeline.p2p == [12, 12]  # m 4 x (2 boundaries forward + 1 back, or 1 forward + 2 back)

    def with_pipe(**update):
        return plan.model_copy(update={"pipeline": plan.pipeline.model_copy(update=update)})

    with pytest.raises(Unsupported, match="not a multiple of the 2 stages"):
        analyze(with_pipe(micro_batches=3))
    with pytest.raises(Unsupported, match="interleaved 1F1B; the plan's schedule is 'gpipe'"):
        analyze(with_pipe(schedule="gpipe"))
    with pytest.raises(Unsupported, match=r"as 2 x 2 chunks"):
        analyze(with_pipe(stage_layers=[[0, 2], [2, 4]]))


def test_2bw_runs_with_its_two_weight_versions():
    spec = analyze(estimated("gpt2-mini", pp=2, micro_batch=2, schedule="2bw"))
    assert spec.pipeline.schedule == "2bw" and any("2BW" in n for n in spec.notes)
    plan = estimated("gpt2-mini", pp=2, micro_batch=2, schedule="2bw")
    bad = plan.model_copy(update={"pipeline": plan.pipeline.model_copy(update={"async_weights": False})})
    with pytest.raises(Unsupported, match="disagree"):
        analyze(bad)


def test_gradient_accumulation_without_a_pipeline_runs_as_micro_batches():
    """A one-stage plan with micro-batches runs each rank's batch as that many equal micro-batches
    (tests/worker/test_accumulation.py runs them); a count that does not divide it is refused."""
    plan = baseline("gpt2-tiny", "data-parallel")
    two = plan.model_copy(update={"pipeline": plan.pipeline.model_copy(update={"micro_batches": 2})})
    spec = analyze(two)
    assert (spec.pipeline.stages, spec.pipeline.micro_batches) == (1, 2)
    three = plan.model_copy(update={"pipeline": plan.pipeline.model_copy(update={"micro_batches": 3})})
    with pytest.raises(Unsupported, match="do not divide"):
        analyze(three)


@pytest.mark.parametrize(("tp", "pp", "micro_batch"), [(2, 2, 2), (2, 1, 4), (1, 2, 1)])
def test_estimates_called_launchable_are_executable(tp, pp, micro_batch):
    """`paretoplan estimate` flags only what it knows the executor refuses: what it calls launchable
    passes the worker's own analysis."""
    from search.plans.estimate import EstimateRequest, estimate

    # Llama: its head and embedding are not tied (GPT's, split over tp across stages, are refused below)
    e = estimate(EstimateRequest(model="llama-tiny", device="cpu", devices=4, global_batch=8, precision="fp32",
                                 tp=tp, pp=pp, micro_batch=micro_batch))
    assert e.launchable, e.not_launchable_reason
    spec = analyze(e.plan)
    assert spec.pipeline.stages == pp


def test_estimates_not_launchable_are_refused_by_the_worker_too():
    from search.plans.estimate import EstimateRequest, estimate

    # 1F1B over 2 stages with one micro-batch per iteration
    e = estimate(EstimateRequest(model="gpt2-tiny", device="cpu", devices=4, global_batch=8, precision="fp32",
                                 pp=2, micro_batch=4))
    assert not e.launchable and "1F1B needs at least as many micro-batches" in (e.not_launchable_reason or "")
    with pytest.raises(Unsupported, match="1F1B needs at least as many micro-batches"):
        analyze(e.plan)


def test_a_module_taking_two_tensors_of_one_shape_is_not_given_a_first_input_conversion():
    """MPT's MLP is called as `ffn(hidden, residual)`, two [batch, seq, hidden] tensors. A plan that
    redistributes the residual where it enters the MLP once ran with the hidden states converted
    instead (DTensor then failed on mismatched shards), then was refused by the executor while the
    search still offered it as the leanest. The search now prices that conversion infeasible
    (search/prices/boundaries.py `ambiguous_entry`): every plan of the frontier runs, and none
    converts an input of that module."""
    config = {"model_type": "mpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256, "max_seq_len": 128,
              "pad_token_id": 0}
    o = run_search(SearchRequest(hf_config=config, name="mpt", device="cpu", devices=4, devices_per_node=4,
                                 global_batch=8, seq_len=32, precision="fp32", baselines=False))
    assert len(o.plans) > 1
    for plan in o.plans:
        spec = analyze(plan)  # Unsupported here: the search offered a plan the executor cannot run
        assert not [st for st in spec.styles if st.style == "prepare_input" and st.module.endswith(".ffn")]
