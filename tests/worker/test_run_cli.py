"""`paretoplan run` as a user runs it: a frontier saved by `search --json`, a pick, a real
4-process launch, the predicted-vs-measured table and the RunReport; and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paretoplan.cli import main
from worker.reference import reference_losses

SEARCH = ["search", "--model", "gpt2-tiny", "--device", "cpu", "--devices", "4", "--global-batch", "8",
          "--precision", "fp32"]


@pytest.fixture(scope="module")
def frontier(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "frontier.json"
    assert main([*SEARCH, "--devices-per-node", "4", "--json", str(path)]) == 0
    return path


def _one_line_error(capsys, rc: int, code: int = 2) -> str:
    err = capsys.readouterr().err
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paretoplan: error:") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.processes  # paretoplan run: torchrun and 4 gloo ranks
def test_run_a_picked_baseline_from_a_frontier_json(frontier, tmp_path):
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "paretoplan", "run", "--plan", str(frontier), "--pick", "fsdp",
                        "--steps", "3", "--warmup", "1", "--report", str(report), "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("pp1 x dp4 x tp1 zero3")
    assert sum(1 for line in lines if line.split() and line.split()[0] in "0123") == 4  # one row per rank
    assert any(line.split()[0] == "all" for line in lines if line.split())
    # measured against the catalog's price: it says so, and how to profile this machine
    assert "`paretoplan profile --model gpt2-tiny --devices 4 --out P.json`" in lines[-1]
    rep = json.loads(report.read_text())
    assert rep["plan"]["zero_stage"] == 3 and rep["num_devices"] == 4 and rep["backend"] == "gloo"
    ref = reference_losses("gpt2-tiny", 3, 8, 64)
    assert max(abs(a - b) for a, b in zip(rep["losses"], ref, strict=True)) < 2e-5
    assert rep["measured"]["memory_bytes"] > 0 and rep["measured"]["time_s"] > 0


def test_inexpressible_pick_is_refused_naming_the_op(frontier, tmp_path, capsys):
    """A frontier file edited by hand so a plan splits an embedding's hidden size on the axis
    where every other op splits the batch (the search itself never offers that)."""
    data = json.loads(frontier.read_text())
    i, entry = next((i, p) for i, p in enumerate(data["frontier"])
                    if any(a["role"] == "data" and a["size"] > 1 for a in p["plan"]["mesh"]["axes"]))
    dp = next(k for k, a in enumerate(entry["plan"]["mesh"]["axes"]) if a["role"] == "data")
    for op in entry["plan"]["ops"]:
        if op["op"] == "tok_emb:embedding":
            op["config"][dp] = "hidden"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    rc = main(["run", "--plan", str(path), "--pick", str(i), "--steps", "2"])
    line = _one_line_error(capsys, rc)
    assert "op 'tok_emb:embedding' splits 'hidden' on mesh axis" in line


def test_pick_out_of_range(frontier, capsys):
    line = _one_line_error(capsys, main(["run", "--plan", str(frontier), "--pick", "999"]))
    assert "--pick 999" in line


def test_unknown_pick(frontier, capsys):
    line = _one_line_error(capsys, main(["run", "--plan", str(frontier), "--pick", "cheapest"]))
    assert "expected one of fastest, leanest, budget, N" in line


def test_single_plan_file_the_executor_cannot_run_is_refused(frontier, tmp_path, capsys):
    """A hand-edited 2BW pipeline whose weights are not marked 1-stale: refused in one line, naming why."""
    plan = json.loads(frontier.read_text())["baselines"][0]["plan"]
    plan["mesh"]["pp"] = 2
    plan["num_devices"] = 8
    plan["pipeline"] = {"stages": 2, "schedule": "2bw", "micro_batches": 2, "stage_layers": [[0, 1], [1, 2]],
                        "async_weights": False}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    line = _one_line_error(capsys, main(["run", "--plan", str(path)]))
    assert "PipeDream-2BW is schedule '2bw' with async (1-stale) weights" in line


def test_missing_plan_file(tmp_path, capsys):
    line = _one_line_error(capsys, main(["run", "--plan", str(tmp_path / "nope.json")]))
    assert "cannot read plan file" in line


def test_more_processes_than_the_machine_hosts(capsys):
    line = _one_line_error(capsys, main(["run", "--model", "gpt2-tiny", "--devices", "16", "--max-procs", "8",
                                         "--steps", "1"]))
    assert "needs 16 processes" in line
