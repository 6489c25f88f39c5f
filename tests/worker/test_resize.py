"""Resizing a running job: a run that changes layout mid-way (pipeline, tensor parallel, FSDP,
ZeRO-1, another device count) trains exactly as the uninterrupted single process does, because
every launch loads the previous one's checkpoint resharded into its own layout; a rank that dies
resumes from the last checkpoint; and the pieces that decide it (tied-parameter aliases, the
scripted resizes, the report's segments) on their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from search import Plan, Predicted, ResizeTimes, RunReport, Segment
from tests.worker.families import GPT, LLAMA, baseline, pipelined, with_zero
from tests.worker.parity import assert_losses_match
from worker import checkpoint
from worker.elastic import Control, Elastic, check_resizes, run_plan
from worker.reference import reference_losses
from worker.spec import RunSettings

TOL = 2e-5  # as the faithfulness tests: fp32 losses ~6, collectives reorder float sums


def _chain(plans: list[Plan]) -> Iterator[Plan]:
    yield from plans


def _run_chain(plans: list[Plan], at: list[int], steps: int, tmp_path: Path) -> RunReport:
    """Run plans[0], resizing to plans[1], plans[2], ... before the steps in `at`."""
    rest = _chain(plans[1:])

    def replan(devices: int) -> Plan:
        plan = next(rest)
        assert plan.num_devices == devices
        return plan

    elastic = Elastic(run_dir=tmp_path / "run", resizes=[(s, p.num_devices) for s, p in zip(at, plans[1:], strict=True)],
                      replan=replan)
    settings = RunSettings(steps=steps, warmup=0, measure_memory=False)
    return run_plan(plans[0], settings=settings, elastic=elastic, timeout=900)


@pytest.mark.processes
def test_a_run_moves_across_pipeline_tensor_fsdp_and_zero1_layouts_and_trains_as_one_process(tmp_path):
    """pp2 x FSDP on 4 -> tp2 on 2 -> dp2 x tp2 (sequence parallel, ZeRO-3) on 4 -> ZeRO-1 on 2:
    every step's loss is the single process's."""
    plans = [pipelined(baseline(LLAMA, "fsdp", 2), 2, "1f1b", 2),
             baseline(LLAMA, "megatron-tp2-dp", 2),
             with_zero(baseline(LLAMA, "megatron-tp2-sp-dp"), 3),
             with_zero(baseline(LLAMA, "data-parallel", 2), 1)]
    steps, at = 8, [2, 4, 6]
    rep = _run_chain(plans, at, steps, tmp_path)
    assert [(s.from_step, s.to_step, s.devices, s.cause) for s in rep.segments] == [
        (0, 2, 4, "launch"), (2, 4, 2, "resize"), (4, 6, 4, "resize"), (6, 8, 2, "resize")]
    assert [s.plan_summary for s in rep.segments] == [p.summary for p in plans]
    assert rep.plan_summary == plans[-1].summary and rep.restarts == 0
    for seg in rep.segments[1:]:
        assert seg.resize_s is not None and seg.resize_s.save_s > 0 and seg.resize_s.load_s > 0
    ref = reference_losses(LLAMA, steps, plans[0].global_batch, plans[0].seq_len)
    assert_losses_match("llama-tiny across layouts", rep.losses, ref, steps, TOL)


@pytest.mark.processes
def test_tied_embedding_and_head_load_into_a_pipeline_that_keeps_them_apart(tmp_path):
    """GPT ties its embedding and head: one parameter (one optimizer state) under FSDP, two copies on
    the first and last pipeline stage. The pipeline's last stage reads the head's state under the
    embedding's name."""
    plans = [baseline(GPT, "fsdp", 2), pipelined(baseline(GPT, "data-parallel", 2), 2, "gpipe", 2)]
    steps = 5
    rep = _run_chain(plans, [2], steps, tmp_path)
    assert [s.devices for s in rep.segments] == [2, 4]
    ref = reference_losses(GPT, steps, plans[0].global_batch, plans[0].seq_len)
    assert_losses_match("gpt2-tiny fsdp -> pipeline", rep.losses, ref, steps, TOL)


@pytest.mark.processes
def test_cli_resizes_and_recovers_a_killed_rank_with_the_losses_of_one_process(tmp_path):
    """`paretoplan run --resize 4:2,8:4 --checkpoint-every 2` with rank 1 killed before step 6 (on the
    2-process segment): it restarts from the checkpoint at step 4, moves back to 4 processes at
    step 8, and every loss is the single process's."""
    report = tmp_path / "r.json"
    env = {**os.environ, "PARETOPLAN_KILL_RANK_AT": "1:6", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "paretoplan", "run", "--model", LLAMA, "--devices", "4", "--steps", "12",
                        "--seed", "7", "--resize", "4:2,8:4", "--checkpoint-every", "2", "--report", str(report),
                        "--no-progress"], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = RunReport.model_validate_json(report.read_text())
    assert [(s.devices, s.cause, s.ended) for s in rep.segments] == [
        (4, "launch", "resize"), (2, "resize", "failed"), (2, "restart", "resize"), (4, "resize", "finished")]
    assert rep.restarts == 1 and rep.segments[1].to_step == 6 and "SIGKILL" in (rep.segments[1].error or "")
    assert rep.segments[0].plan_summary != rep.segments[1].plan_summary  # a different plan on 2 processes
    ref = reference_losses(LLAMA, 12, rep.plan["global_batch"], rep.plan["seq_len"], seed=7)
    assert_losses_match("llama-tiny 4 -> 2 (killed) -> 4", rep.losses, ref, 12, TOL)
    assert "4 segments, 1 restarts" in p.stdout


@pytest.mark.processes
def test_sigterm_saves_first_and_resume_goes_on_from_there(tmp_path):
    """SIGTERM to `paretoplan run`: the ranks save at the next step boundary and it exits 5, naming
    the run directory; the same command with --resume finishes the run, every loss the single
    process's."""
    import re
    import signal
    import time

    run_dir, report = tmp_path / "ckpt", tmp_path / "r.json"
    cmd = [sys.executable, "-m", "paretoplan", "run", "--model", LLAMA, "--devices", "2", "--steps", "40",
           "--checkpoint-dir", str(run_dir), "--report", str(report)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    err = tmp_path / "first.err"
    with err.open("w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=tmp_path, env=env)
    end = time.monotonic() + 600
    while not re.search(r"step=([3-9]|\d\d)/40", err.read_text(errors="replace")):  # the progress bar
        assert p.poll() is None and time.monotonic() < end, err.read_text()[-3000:]
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=300) == 5, err.read_text()[-3000:]
    said = err.read_text().strip().splitlines()[-1]
    stopped = int(re.search(r"stopped before step (\d+)", said).group(1))
    assert 3 < stopped < 40 and f"--resume {run_dir}" in said and not report.exists()
    again = subprocess.run([*cmd, "--resume", str(run_dir), "--no-progress"], capture_output=True, text=True,
                           timeout=600, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    rep = RunReport.model_validate_json(report.read_text())
    assert [(s.from_step, s.to_step, s.cause, s.ended) for s in rep.segments] == [
        (0, stopped, "launch", "stopped"), (stopped, 40, "restart", "finished")]
    ref = reference_losses(LLAMA, 40, rep.plan["global_batch"], rep.plan["seq_len"])
    assert_losses_match("llama-tiny stopped and resumed", rep.losses, ref, 40, TOL)


# ---- the pieces, without processes --------------------------------------------------------------
def test_a_tied_parameter_is_read_under_the_name_the_checkpoint_has():
    ties = [["tok_emb.weight", "lm_head.weight"]]
    have = {"model.tok_emb.weight", "optim.state.tok_emb.weight.exp_avg", "optim.param_groups.tok_emb.weight.lr"}
    assert checkpoint.alias("optim.state.lm_head.weight.exp_avg", ties, have) == "optim.state.tok_emb.weight.exp_avg"
    assert checkpoint.alias("optim.param_groups.lm_head.weight.lr", ties, have) == "optim.param_groups.tok_emb.weight.lr"
    assert checkpoint.alias("model.lm_head.weight", ties, have) == "model.tok_emb.weight"
    assert checkpoint.alias("model.lm_head.weightx", ties, have) is None  # a prefix of a name is not the name
    assert checkpoint.alias("model.norm.weight", ties, have) is None


@pytest.mark.parametrize("resizes, message", [
    ([(0, 2)], "between 1 and 11"), ([(12, 2)], "between 1 and 11"), ([(4, 2), (4, 4)], "steps must increase"),
    ([(4, 0)], "must be positive")])
def test_scripted_resizes_are_checked_before_anything_starts(resizes, message):
    from search import InputError

    with pytest.raises(InputError, match=message):
        check_resizes(resizes, 12)


@pytest.mark.parametrize("flag, message", [
    ("8", "STEP:DEVICES pairs"), ("8:2,x:4", "STEP:DEVICES pairs"), ("30:2", "between 1 and 23"),
    ("8:2,4:4", "steps must increase")])
def test_cli_rejects_a_bad_resize_in_one_line(flag, message, capsys):
    from paretoplan.cli import main

    rc = main(["run", "--model", LLAMA, "--devices", "2", "--steps", "24", "--resize", flag])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_control_asks_the_running_launch_to_stop_through_its_file(tmp_path):
    control = Control()
    control.stop("SIGTERM")  # before any launch: remembered
    stop = tmp_path / "launch-0" / "stop"
    control.arm(stop)
    assert stop.exists() and control.stopping == "SIGTERM"


def test_an_order_for_the_layout_running_now_stops_nothing(tmp_path):
    from worker.elastic import Order

    control, answers = Control(), []
    control.answer = lambda order, outcome: answers.append((order.id, outcome))
    control.current = baseline(LLAMA, "fsdp", 2)
    stop = tmp_path / "stop"
    control.arm(stop)
    control.resize(Order(devices=2, id=7))
    control.resize(Order(devices=2, plan=baseline(LLAMA, "fsdp", 2), id=8))
    assert not stop.exists() and control.take_order() is None
    assert answers == [(7, "already on 2 devices with that plan"), (8, "already on 2 devices with that plan")]
    control.resize(Order(devices=2, plan=baseline(LLAMA, "megatron-tp2-dp", 2), id=9))  # another layout: it moves
    assert stop.exists() and control.take_order() is not None


def _seg(plan: dict, a: int, b: int, cause: str, ended: str = "finished") -> Segment:
    return Segment(from_step=a, to_step=b, devices=plan["num_devices"], plan_summary=plan["summary"], plan=plan,
                   cause=cause, ended=ended, predicted=Predicted(time_s=1.0, memory_bytes=1),  # type: ignore[arg-type]
                   resize_s=ResizeTimes(save_s=0.1, replan_s=0.2, restart_s=3.0, load_s=0.4) if a else None)


def test_report_segments_must_tile_the_steps_and_count_the_restarts():
    from pydantic import ValidationError

    from tests.service.svchelp import run_report

    plan = baseline(LLAMA, "fsdp", 2).model_dump(mode="json")
    data = run_report(plan, 6)
    good = [_seg(plan, 0, 2, "launch", "failed"), _seg(plan, 2, 6, "restart")]
    rep = RunReport.model_validate({**data, "segments": [s.model_dump(mode="json") for s in good], "restarts": 1})
    assert rep.segments[1].resize_s is not None and rep.segments[1].resize_s.total_s == pytest.approx(3.7)
    for segments, restarts, message in (
            (good, 0, "restarts 0, but 1"),
            ([good[0], _seg(plan, 3, 6, "restart")], 1, "starts at step 3"),
            ([good[0], _seg(plan, 2, 5, "restart")], 1, "end at step 5"),
            ([_seg(plan, 0, 6, "launch", "resize")], 0, "the last segment")):
        with pytest.raises(ValidationError, match=message):
            RunReport.model_validate({**data, "segments": [s.model_dump(mode="json") for s in segments],
                                      "restarts": restarts})
    now = datetime.now(UTC)
    assert json.loads(rep.model_dump_json())["segments"][0]["cause"] == "launch" and rep.finished <= now
