"""The launcher: a crashing rank ends the whole run with that rank's error and leaves no process
behind; a finished run becomes a RunReport with the fields calibration reads."""

from __future__ import annotations

import json
from datetime import UTC

import pytest

from search import RunReport
from tests.proctools import pids_mentioning
from tests.worker.families import baseline
from worker.analyze import analyze
from worker.launch import RunFailed, format_table, make_report, run_jobs
from worker.spec import Job, RunSettings


@pytest.mark.processes
def test_a_crashing_rank_ends_the_run_with_its_error_and_no_orphans(tmp_path):
    spec = analyze(baseline("gpt2-tiny", "data-parallel"))
    job = Job(spec=spec, settings=RunSettings(steps=5, warmup=1, fail_rank=2, fail_step=1, measure_memory=False))
    with pytest.raises(RunFailed, match=r"rank 2 failed: InjectedFailure: injected failure on rank 2 at step 1") as e:
        run_jobs([job], workdir=tmp_path, timeout=300)
    assert e.value.rank == 2
    # every rank of the run had the work dir on its command line: none may be left
    assert pids_mentioning(str(tmp_path)) == []


def test_report_from_a_run(family_runs):
    """A RunReport (the JSON `paretoplan run --report` writes) from one of the shared runs."""
    from datetime import datetime

    job, raw = family_runs["fsdp"]
    now = datetime.now(UTC)
    rep = make_report(job, raw, now, now)
    data = json.loads(rep.model_dump_json())
    for key in ("predicted", "measured", "errors", "plan", "losses", "started", "finished"):
        assert key in data
    assert data["predicted"]["time_s"] == job.spec.predicted_time_s
    assert data["measured"]["memory_bytes"] == max(r["memory_bytes"] for r in raw["ranks"])
    assert len(data["measured"]["per_rank"]) == 4
    assert data["errors"]["time"] == pytest.approx(rep.measured.time_s / rep.predicted.time_s - 1)
    assert RunReport.model_validate(data) == rep
    table = format_table(rep)
    assert table.count("\n") >= 6 and "all" in table




@pytest.mark.processes
def test_a_run_past_its_time_limit_is_stopped_with_all_its_ranks(tmp_path):
    """The launcher's own way out (time limit; Ctrl-C takes the same path) kills torchrun and every
    rank it started, though torchrun starts each rank in a session of its own."""
    spec = analyze(baseline("gpt2-tiny", "data-parallel"))
    job = Job(spec=spec, settings=RunSettings(steps=100_000, warmup=1, measure_memory=False))
    seen = []
    with pytest.raises(RunFailed, match="time limit"):
        run_jobs([job], workdir=tmp_path, timeout=25, progress=lambda msg: seen.append(msg))
    assert any("step" in m for m in seen), "the ranks never started training: nothing was tested"
    assert pids_mentioning(str(tmp_path)) == []


@pytest.mark.processes
def test_a_run_past_its_memory_limit_is_stopped_with_all_its_ranks(tmp_path, monkeypatch):
    """PARETOPLAN_RUN_MAX_MEMORY bounds a run's resident memory, all its ranks together (each gloo
    rank of torch holds far more than 64 MiB): the run fails saying so and leaves no process."""
    monkeypatch.setenv("PARETOPLAN_RUN_MAX_MEMORY", "64MiB")
    spec = analyze(baseline("gpt2-tiny", "data-parallel"))
    job = Job(spec=spec, settings=RunSettings(steps=100_000, warmup=1, measure_memory=False))
    with pytest.raises(RunFailed, match=r"memory limit of 64.0 MiB \(PARETOPLAN_RUN_MAX_MEMORY\)") as e:
        run_jobs([job], workdir=tmp_path, timeout=300)
    assert not e.value.died  # final: a restart would pass the limit again
    assert pids_mentioning(str(tmp_path)) == []


def test_a_run_memory_limit_that_is_no_size_is_an_input_error(monkeypatch):
    from search import InputError
    from worker.memwatch import run_memory_limit

    monkeypatch.setenv("PARETOPLAN_RUN_MAX_MEMORY", "plenty")
    with pytest.raises(InputError, match="PARETOPLAN_RUN_MAX_MEMORY='plenty' is not a memory size"):
        run_memory_limit()
    monkeypatch.setenv("PARETOPLAN_RUN_MAX_MEMORY", "")
    assert run_memory_limit() is None
