"""`paretoplan profile` and `paretoplan search --profile` as a user runs them: the loop end to
end, and every bad input a one-line error with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paretoplan.cli import main
from profiler.collectives import host_capacity
from search.prices.profile import load_profile
from tests.profiler.tiny import TINY

TINY_FLAGS = ["--model", TINY["model"], "--devices", str(TINY["devices"]), "--devices-per-node",
              str(TINY["devices_per_node"]), "--global-batch", str(TINY["global_batch"])]


def one_line_error(rc: int, err: str, match: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("paretoplan: error:"), lines[0]
    assert match in lines[0], lines[0]
    assert "Traceback" not in err


def test_profile_then_search(tiny_profile, tmp_path: Path, capsys) -> None:
    """Extending the session's profile with the same model re-times nothing; searching with it
    prices everything from measurements."""
    prof, _ = tiny_profile
    base, new, frontier = tmp_path / "base.json", tmp_path / "new.json", tmp_path / "f.json"
    prof.dump(base)
    rc = main(["profile", *TINY_FLAGS, "--base", str(base), "--out", str(new)])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"0 timed, {len(prof.ops)} reused" in out and "0 collective fits measured" in out
    assert load_profile(new).ops == prof.ops
    rc = main(["search", *TINY_FLAGS, "--profile", str(new), "--json", str(frontier)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "on 1 node x 2 cpu" in out  # the profile's device, with no --device given
    assert "costs from the cpu profile: " in out
    assert "0 priced from the roofline" in out and "; 0 of" in out
    report = json.loads(frontier.read_text())
    assert report["stats"]["profile"]["signatures_estimated"] == 0
    assert all(not e["plan"]["predicted"]["estimated"] for e in report["frontier"])


def test_collectives_only_needs_no_model(tiny_profile, tmp_path: Path, capsys) -> None:
    prof, _ = tiny_profile
    base = tmp_path / "base.json"
    prof.dump(base)
    rc = main(["profile", "--collectives-only", "--devices", "2", "--devices-per-node", "2", "--base", str(base),
               "--out", str(tmp_path / "n.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "op signatures (" not in out.split("\n")[0]  # no op timing in the summary
    assert load_profile(tmp_path / "n.json").collectives == prof.collectives


@pytest.fixture
def profiles(tmp_path: Path, tiny_profile) -> dict[str, Path]:
    prof, _ = tiny_profile
    good = tmp_path / "good.json"
    prof.dump(good)
    v2 = json.loads(good.read_text())
    v2["format"] = "paretoplan.profile/2"
    (tmp_path / "v2.json").write_text(json.dumps(v2))
    (tmp_path / "corrupt.json").write_text(good.read_text()[: len(good.read_text()) // 2])
    neg = json.loads(good.read_text())
    next(iter(neg["ops"].values()))["fwd"]["median"] = -1
    (tmp_path / "neg.json").write_text(json.dumps(neg))
    return {p.stem: p for p in tmp_path.glob("*.json")}


@pytest.mark.parametrize("argv,match", [
    (["profile", *TINY_FLAGS, "--device", "no-such-device", "--out", "{tmp}/x.json"], "unknown device 'no-such-device'"),
    (["profile", "--collectives-only", "--devices", "{too_many}", "--out", "{tmp}/x.json"], "can host at most"),
    (["profile", "--model", "gpt2-tiny", "--out", "{tmp}/x.json"], "--devices is required"),
    (["profile", "--devices", "2", "--out", "{tmp}/x.json"], "give --model"),
    (["profile", *TINY_FLAGS], "--out is required"),
    (["profile", *TINY_FLAGS, "--out", "{tmp}/no/such/dir/x.json"], "does not exist"),
    (["profile", "--model", "no-such-model", "--devices", "2", "--out", "{tmp}/x.json"], "no-such-model"),
    (["profile", *TINY_FLAGS, "--base", "{v2}", "--out", "{tmp}/x.json"], "is not supported"),
    (["profile", "--calibrate", "{tmp}/r.json", "--out", "{tmp}/x.json"], "--calibrate needs --profile"),
    (["profile", "--calibrate", "{tmp}/r.json", "--profile", "{good}", "--out", "{tmp}/x.json"], "cannot read run report"),
    (["search", *TINY_FLAGS, "--profile", "{v2}"], "'paretoplan.profile/2' is not supported"),
    (["search", *TINY_FLAGS, "--profile", "{corrupt}"], "not valid JSON"),
    (["search", *TINY_FLAGS, "--profile", "{neg}"], "invalid profile at ops"),
    (["search", *TINY_FLAGS, "--profile", "{tmp}/missing.json"], "cannot read profile"),
    (["search", *TINY_FLAGS, "--profile", "{good}", "--device", "h100-80gb"], "measured on 'cpu'"),
])
def test_bad_input_is_one_line(argv, match, profiles, tmp_path: Path, capsys) -> None:
    subs = {"tmp": str(tmp_path), "too_many": str(host_capacity("gloo") + 1),
            **{k: str(v) for k, v in profiles.items()}}
    rc = main([a.format(**subs) for a in argv])
    one_line_error(rc, capsys.readouterr().err, match)


def test_a_gpu_without_cuda_is_refused(tmp_path: Path, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: profiling an H100 here is not an error")
    rc = main(["profile", *TINY_FLAGS, "--device", "h100-80gb", "--out", str(tmp_path / "x.json")])
    one_line_error(rc, capsys.readouterr().err, "no CUDA device")


def test_process_level_error_has_no_traceback(profiles, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "paretoplan", "search", *TINY_FLAGS, "--profile",
                           str(profiles["v2"])], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    one_line_error(proc.returncode, proc.stderr, "is not supported")
