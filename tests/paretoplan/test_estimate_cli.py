"""`paretoplan estimate` as a user runs it: what it prints, the JSON it writes, its place against a
frontier, and one-line errors with exit code 2 for every bad input."""

from __future__ import annotations

import json
import re

import pytest

from paretoplan.cli import main
from search.plans.plan import Plan
from tests.paretoplan.test_cli import assert_clean_error, run_cli, table_rows

TINY = ["--model", "gpt2-tiny", "--device", "h100-80gb", "--devices", "8", "--global-batch", "16"]


@pytest.fixture(scope="module")
def frontier_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("estimate") / "frontier.json"
    assert main(["search", *TINY, "--no-baselines", "--json", str(path)]) == 0
    return path


def test_prints_time_memory_mfu_source_and_launchability(tmp_path, capsys):
    out_json = tmp_path / "est.json"
    assert main(["estimate", *TINY, "--tp", "2", "--pp", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert {"time_s", "memory_bytes", "mfu", "plan", "model_flops", "launchable", "priced_from"} <= set(doc)
    plan = Plan.model_validate(doc["plan"])  # the format `search --json` writes: `run --plan` takes it
    assert plan.mesh.pp == 2 and {a.name: a.size for a in plan.mesh.axes} == {"dp": 2, "tp": 2}
    assert doc["mfu"] == pytest.approx(doc["model_flops"] / (doc["time_s"] * 8 * doc["peak_flops"]))
    assert re.search(r"^time per iteration +\d+\.\d+ ms$", out, re.M), out
    assert re.search(r"^memory per device +\S+ \S+ \(fits the 80\.0 GiB budget\)$", out, re.M), out
    assert re.search(r"^  params .*, activations .*, buffers ", out, re.M)
    assert re.search(r"^MFU +\S+% of 8 x 989\.4 TFLOP/s", out, re.M), out
    assert "priced from the catalog (no profile of this machine" in out
    assert "`paretoplan profile --model gpt2-tiny --devices 8 --out P.json`" in out
    assert "launchable: yes" in out  # GPT's tied head, split over tp on both stages: the worker runs it
    assert "against the frontier" not in out  # nothing to compare with


def test_not_launchable_says_why(capsys):
    assert main(["estimate", *TINY, "--tp", "2", "--recompute", "selective"]) == 0
    out = capsys.readouterr().out
    assert "launchable: no: selective recomputation is not executed" in out


def test_against_a_frontier_file(frontier_file, capsys):
    assert main(["estimate", *TINY, "--tp", "2", "--pp", "2", "--frontier", str(frontier_file)]) == 0
    out = capsys.readouterr().out
    doc = json.loads(frontier_file.read_text())
    line = next(x for x in out.splitlines() if x.startswith("against the frontier"))
    assert f"({len(doc['frontier'])} points)" in line
    m = re.search(r"dominated by #(\d+)", line)
    if m:  # the dominating point is at least as fast and as lean
        p = doc["frontier"][int(m.group(1))]
        assert f"  #{m.group(1)}: " in out and p["plan"]["summary"] in out
    else:
        assert "on the frontier" in line or "not dominated" in line


def test_a_frontier_of_another_job_is_refused(frontier_file, capsys):
    rc = main(["estimate", *TINY[:-1], "32", "--tp", "2", "--frontier", str(frontier_file)])
    err = capsys.readouterr().err
    assert_clean_error(rc, err)
    assert "global batch is 16" in err and "global batch is 32" in err


def test_search_table_shows_mfu_as_in_the_json(frontier_file, capsys):
    assert main(["search", *TINY, "--no-baselines", "--all"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    doc = json.loads(frontier_file.read_text())
    assert len(rows) == len(doc["frontier"])
    for r in rows:
        mfu = doc["frontier"][int(r["idx"])]["mfu"]
        assert float(r["mfu"].rstrip("%")) == pytest.approx(100 * mfu, rel=0.05)
    assert "priced from the catalog (no profile of this machine" in out


BAD = {
    "tp x pp": (["--tp", "3"], "--tp 3 x --pp 1"),
    "micro-batch": (["--tp", "2", "--micro-batch", "3"], "--micro-batch 3"),
    "pp over layers": (["--pp", "4"], "at most --pp 2"),
    "zero out of range": (["--zero", "5"], "--zero"),
    "recompute kind": (["--recompute", "some"], "--recompute"),
    "non-positive tp": (["--tp", "0"], "--tp"),
    "frontier and compare": (["--frontier", "f.json", "--compare"], "not allowed with"),
    "missing frontier file": (["--frontier", "no-such.json"], "no-such.json"),
    "json into missing folder": (["--json", "no/such/dir/e.json"], "no/such/dir"),
    "virtual stages without pp": (["--virtual-stages", "2"], "--pp 2 or more"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_exit_2(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flags, needle = BAD[case]
    try:
        rc = main(["estimate", *TINY, *flags])
    except SystemExit as e:  # argparse's own refusals exit from inside
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert_clean_error(rc, err)
    assert needle in err, err


@pytest.mark.slow  # a process of its own: ~4 s
def test_process_level_bad_input_has_no_traceback(tmp_path):
    proc = run_cli("estimate", *TINY, "--tp", "3", cwd=tmp_path)
    assert_clean_error(proc.returncode, proc.stderr)
    assert proc.stdout == ""


def test_run_takes_the_plan_of_an_estimate_json(tmp_path, capsys):
    """`paretoplan run --plan est.json` launches the estimate's Plan (the launch itself is the
    worker suite's)."""
    import argparse

    from paretoplan.cli import _run_plan_from_file

    out = tmp_path / "est.json"
    assert main(["estimate", *TINY, "--tp", "2", "--pp", "2", "--json", str(out)]) == 0
    capsys.readouterr()
    plan = _run_plan_from_file(argparse.Namespace(plan=str(out), pick=None))
    assert plan == Plan.model_validate(json.loads(out.read_text())["plan"])
    with pytest.raises(Exception, match="--pick chooses from a frontier JSON"):
        _run_plan_from_file(argparse.Namespace(plan=str(out), pick="fastest"))
