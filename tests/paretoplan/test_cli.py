"""The `paretoplan` command as a user runs it.

Process-level checks (exit codes, what reaches stderr, no Traceback) run the real command with
`python -m paretoplan` in a scratch directory; checks where speed matters call
`paretoplan.cli.main` in-process. The gpt2-tiny search with --json/--html/--dump-graph runs once
per module and its outputs are shared.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paretoplan.cli import main
from search.models.graph import Op, OpGraph, ParamRef, TensorRef
from search.prices.cluster import format_size

# A table row: mark (2 chars), index, "x.xx ms", "x.x MiB", MFU "x.x%", two spaces, the plan summary.
ROW = re.compile(r"^(?P<mark>[*! ]) +(?P<idx>\d+) +(?P<time>\d+\.\d{2,4}) ms +"
                 r"(?P<mem>\d+(?:\.\d)? [KMGTPE]?i?B) +(?P<mfu>\d+(?:\.\d+)?(?:e-\d+)?%)  (?P<plan>\S.*)$")
HEADER = re.compile(r"^\s+#\s+time/iter\s+memory/device\s+MFU\s+plan$")

TINY_SEARCH = ["search", "--model", "gpt2-tiny", "--devices", "4", "--device", "h100-80gb", "--global-batch", "8"]


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paretoplan", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def table_rows(stdout: str) -> list[dict[str, str]]:
    return [m.groupdict() for line in stdout.splitlines() if (m := ROW.match(line))]


def assert_clean_error(rc: int, err: str, code: int = 2, prefix: str = "paretoplan: error:") -> None:
    assert rc == code, err
    assert "Traceback" not in err
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"stderr should be one line, got {len(lines)}:\n{err}"
    assert lines[0].startswith(prefix), lines[0]


def mlp_graph() -> OpGraph:
    """norm -> linear -> linear, sized so the frontier has several points (the 8x4x8 helpers of
    tests/search/graphs.py give a single-point frontier at 4 devices), small enough for
    --exhaustive (a few thousand assignments per mesh)."""
    sizes = {"batch": 16, "seq": 256, "h": 256, "f": 256}
    B, S, H, F = sizes["batch"], sizes["seq"], sizes["h"], sizes["f"]

    def t(src: str | None, dims: tuple[str, ...]) -> TensorRef:
        return TensorRef(source=src, shape=tuple(sizes[d] for d in dims), dims=dims)

    bsh, bsf = ("batch", "seq", "h"), ("batch", "seq", "f")
    ln = Op(name="ln", kind="norm", inputs=(t(None, bsh),), output=t(None, bsh),
            params=(ParamRef(name="ln.weight", shape=(H,), dims=("h",)),),
            splittable=("batch", "seq"), flops=8.0 * B * S * H)
    fc1 = Op(name="fc1", kind="linear", inputs=(t("ln", bsh),), output=t(None, bsf),
             params=(ParamRef(name="fc1.weight", shape=(F, H), dims=("f", "h")),),
             splittable=("batch", "seq", "f", "h"), flops=2.0 * B * S * H * F)
    fc2 = Op(name="fc2", kind="linear", inputs=(t("fc1", bsf),), output=t(None, bsh),
             params=(ParamRef(name="fc2.weight", shape=(H, F), dims=("h", "f")),),
             splittable=("batch", "seq", "h", "f"), flops=2.0 * B * S * H * F)
    return OpGraph(name="mlp", ops=(ln, fc1, fc2), meta={"global_batch": B, "seq_len": S})


# ---- the gpt2-tiny run shared by several tests ----------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    proc = run_cli(*TINY_SEARCH, "--json", "out.json", "--html", "out.html", "--dump-graph", "g.json", cwd=d)
    assert proc.returncode == 0, proc.stderr
    return d, proc


@pytest.fixture(scope="module")
def tiny_doc(tiny):
    d, _ = tiny
    return json.loads((d / "out.json").read_text())


# ---- 1. models and devices ------------------------------------------------------------------------
@pytest.mark.slow  # a process that counts the parameters of the whole zoo: ~10 s
def test_models_lists_zoo_with_parameter_counts(tmp_path):
    proc = run_cli("models", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert "gpt2-medium" in lines and "gpt3-175b" in lines
    assert "354,823,168" in lines["gpt2-medium"]
    assert re.search(r"\b\d{3},\d{3},\d{3},\d{3}\b", lines["gpt3-175b"])  # hundreds of billions


def test_devices_lists_catalog(tmp_path):
    proc = run_cli("devices", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()[1:] if line.strip()]
    assert "h100-80gb" in names


# ---- 2. a full search with every output -----------------------------------------------------------
def test_search_prints_table(tiny):
    _, proc = tiny
    out = proc.stdout
    assert "Traceback" not in proc.stderr
    lines = out.splitlines()
    assert any(HEADER.match(line) for line in lines), out
    rows = table_rows(out)
    assert rows, out
    assert sum(r["mark"] == "*" for r in rows) == 1
    assert "search (exact) took" in out
    assert "136,960 parameters" in out


def test_search_json_schema(tiny_doc):
    doc = tiny_doc
    assert isinstance(doc["search_seconds"], float) and doc["search_seconds"] > 0
    stats = doc["stats"]
    for key in ("ops", "frontier", "configurations"):
        assert key in stats
    assert stats["ops"] == 31
    assert stats["frontier"] == len(doc["frontier"]) > 1
    for point in doc["frontier"]:
        assert isinstance(point["time_s"], float) and point["time_s"] > 0
        assert isinstance(point["memory_bytes"], int) and point["memory_bytes"] > 0
        plan = point["plan"]
        assert plan["mesh"]["axes"]
        assert set(plan["predicted"]["breakdown"]) >= {"params", "grads", "optimizer", "activations", "buffers"}
        assert isinstance(plan["summary"], str) and plan["summary"].startswith("pp")
    assert doc["picked"] == 0  # everything fits 80 GiB, so the fastest point


def test_search_json_frontier_is_pareto_sorted(tiny_doc):
    times = [p["time_s"] for p in tiny_doc["frontier"]]
    mems = [p["memory_bytes"] for p in tiny_doc["frontier"]]
    assert all(a < b for a, b in zip(times, times[1:], strict=False)), "times must strictly increase"
    assert all(a > b for a, b in zip(mems, mems[1:], strict=False)), "memories must strictly decrease"


def test_search_json_plans_match_their_points(tiny_doc):
    for i, point in enumerate(tiny_doc["frontier"]):
        pred = point["plan"]["predicted"]
        assert pred["time_s"] == pytest.approx(point["time_s"], rel=1e-9), i
        assert pred["memory_bytes"] == point["memory_bytes"], i
        assert abs(sum(pred["breakdown"].values()) - point["memory_bytes"]) <= 4, i


def test_search_html_is_offline(tiny):
    d, _ = tiny
    html = (d / "out.html").read_text()
    assert "plotly" in html.lower()
    assert len(html.encode()) > 1_000_000, "plotly.js should be embedded"
    scripts = re.findall(r"<script\b[^>]*>", html, flags=re.I)
    assert scripts
    assert not [s for s in scripts if "src" in s.lower()], scripts  # nothing fetched: no cdn, no file


def test_dumped_graph_reproduces_frontier(tiny, tiny_doc, tmp_path, capsys):
    d, _ = tiny
    graph = json.loads((d / "g.json").read_text())
    assert graph["format"] == "paretoplan.graph/1" and len(graph["ops"]) == 31
    out = tmp_path / "again.json"
    assert main(["search", "--graph", str(d / "g.json"), "--devices", "4", "--json", str(out)]) == 0
    capsys.readouterr()
    again = json.loads(out.read_text())
    assert [p["memory_bytes"] for p in again["frontier"]] == [p["memory_bytes"] for p in tiny_doc["frontier"]]
    assert [p["time_s"] for p in again["frontier"]] == pytest.approx([p["time_s"] for p in tiny_doc["frontier"]],
                                                                     rel=1e-9)


# ---- 3. --exhaustive ------------------------------------------------------------------------------
@pytest.mark.slow  # a process of its own: ~3 s
def test_exhaustive_refuses_large_graph(tiny):
    d, _ = tiny
    proc = run_cli("search", "--graph", "g.json", "--devices", "4", "--exhaustive", cwd=d)
    assert_clean_error(proc.returncode, proc.stderr)
    assert "exhaustive" in proc.stderr


@pytest.mark.slow  # two processes, one an exhaustive search: ~7 s
def test_exhaustive_matches_search_on_small_graph(tmp_path):
    (tmp_path / "tiny.json").write_text(mlp_graph().to_json())
    # the per-op space: with ZeRO and recomputation this little MLP's frontier is two points
    common = ["search", "--graph", "tiny.json", "--devices", "4", "--all", "--zero", "0", "--no-recompute"]
    ex = run_cli(*common, "--exhaustive", "--json", "ex.json", cwd=tmp_path)
    ft = run_cli(*common, "--json", "ft.json", cwd=tmp_path)
    for proc in (ex, ft):
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    assert "search (exhaustive) took" in ex.stdout and "search (exact) took" in ft.stdout
    ex_rows, ft_rows = table_rows(ex.stdout), table_rows(ft.stdout)
    assert len(ex_rows) >= 2, ex.stdout  # a real frontier, not a single point
    assert [(r["mark"], r["idx"], r["time"], r["mem"]) for r in ex_rows] == \
           [(r["mark"], r["idx"], r["time"], r["mem"]) for r in ft_rows]
    ex_doc = json.loads((tmp_path / "ex.json").read_text())
    ft_doc = json.loads((tmp_path / "ft.json").read_text())
    assert [p["memory_bytes"] for p in ex_doc["frontier"]] == [p["memory_bytes"] for p in ft_doc["frontier"]]
    assert [p["time_s"] for p in ex_doc["frontier"]] == pytest.approx([p["time_s"] for p in ft_doc["frontier"]],
                                                                      rel=1e-9)


# ---- 4. bad input ---------------------------------------------------------------------------------
def _cycle_graph() -> dict:
    g = mlp_graph().model_dump(mode="json")
    g["ops"][0]["inputs"][0]["source"] = "fc2"  # ln reads fc2, which (through fc1) reads ln
    return g


BAD_INPUT = {
    "unknown model": ["search", "--model", "no-such-model"],
    "unknown device": [*TINY_SEARCH[:3], "--device", "no-such-device"],
    "zero devices": ["search", "--model", "gpt2-tiny", "--devices", "0"],
    "negative devices": ["search", "--model", "gpt2-tiny", "--devices", "-4"],
    "devices not a multiple of the node": ["search", "--model", "gpt2-tiny", "--devices", "12", "--device", "h100-80gb"],
    "garbage budget": ["search", "--model", "gpt2-tiny", "--devices", "4", "--memory-budget", "garbage"],
    "missing graph": ["search", "--graph", "missing.json", "--devices", "4"],
    "malformed graph": ["search", "--graph", "malformed.json", "--devices", "4"],
    "cyclic graph": ["search", "--graph", "cycle.json", "--devices", "4"],
    "missing hf config": ["search", "--hf-config", "nonexistent-config.json", "--devices", "4"],
    "zero global batch": ["search", "--model", "gpt2-tiny", "--devices", "4", "--global-batch", "0"],
    "json into missing directory": [*TINY_SEARCH, "--json", "no/such/dir/out.json"],
    "json into a directory": [*TINY_SEARCH, "--json", "outdir/"],
    "hf config with negative layers": ["search", "--hf-config", "neg-layers.json", "--devices", "2", "--device", "cpu"],
    "hf config heads not dividing the width": ["search", "--hf-config", "bad-heads.json", "--devices", "2"],
    "hf config unknown model_type": ["search", "--hf-config", "unknown-type.json", "--devices", "2"],
}

# real architectures with one field wrong (vocab and token ids consistent, so transformers warns of nothing)
GPT2_SMALL = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 128,
              "bos_token_id": 0, "eos_token_id": 0}


@pytest.fixture
def bad_files(tmp_path, monkeypatch):
    (tmp_path / "malformed.json").write_text('{"format": "paretoplan.graph/1", "ops": [')
    (tmp_path / "cycle.json").write_text(json.dumps(_cycle_graph()))
    (tmp_path / "outdir").mkdir()
    (tmp_path / "neg-layers.json").write_text(json.dumps({**GPT2_SMALL, "n_layer": -3}))
    (tmp_path / "bad-heads.json").write_text(json.dumps({**GPT2_SMALL, "n_embd": 100, "n_head": 3}))
    (tmp_path / "unknown-type.json").write_text(json.dumps({**GPT2_SMALL, "model_type": "gtp2"}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_is_one_line_exit_2(argv, bad_files, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert_clean_error(rc, err)


@pytest.mark.slow  # a process of its own: ~3 s
def test_bad_input_process_level(bad_files):
    proc = run_cli(*BAD_INPUT["cyclic graph"], cwd=bad_files)
    assert_clean_error(proc.returncode, proc.stderr)
    assert proc.stdout == ""


def test_bad_input_messages_say_what_is_wrong(bad_files, capsys):
    expect = {
        "unknown model": "no-such-model",
        "unknown device": "no-such-device",
        "devices not a multiple of the node": "node size 8",
        "garbage budget": "garbage",
        "missing graph": "missing.json",
        "malformed graph": "not valid JSON",
        "cyclic graph": "cycle",
        "missing hf config": "nonexistent-config.json",
        "zero global batch": "--global-batch",
        "json into a directory": "it is a directory",  # said before the search, not after it
        "hf config with negative layers": "n_layer must be a positive integer, got -3",
        "hf config heads not dividing the width": "n_head (3) must divide n_embd (100)",
        "hf config unknown model_type": "model_type 'gtp2' is not a model type transformers",
    }
    for name, needle in expect.items():
        assert main(BAD_INPUT[name]) == 2
        err = capsys.readouterr().err
        assert needle in err, (name, err)


def test_argparse_type_error_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--model", "gpt2-tiny", "--devices", "four"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--devices" in err


def test_argparse_type_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["search", "--model", "gpt2-tiny", "--devices", "four"])
    assert_clean_error(exc.value.code, capsys.readouterr().err)


# ---- 5. nothing fits ------------------------------------------------------------------------------
@pytest.mark.slow  # a process of its own and a search: ~6 s
def test_budget_nothing_fits(tmp_path):
    proc = run_cli(*TINY_SEARCH, "--memory-budget", "1KiB", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "leanest plan needs" in lines[0], proc.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["picked"] is None
    least = min(p["memory_bytes"] for p in doc["frontier"])
    assert lines[0].endswith(format_size(least)), (lines[0], format_size(least))
    rows = table_rows(proc.stdout)
    assert rows and all(r["mark"] == "!" for r in rows)


# ---- 6. a budget inside the frontier --------------------------------------------------------------
@pytest.mark.parametrize("where", ["between", "exact"])
def test_budget_picks_fastest_fitting(where, tiny_doc, tmp_path, capsys):
    mems = [p["memory_bytes"] for p in tiny_doc["frontier"]]
    k = len(mems) // 2
    assert 0 < k < len(mems) - 1
    budget = mems[k] if where == "exact" else (mems[k] + mems[k - 1]) // 2
    assert min(mems) <= budget < max(mems)
    out = tmp_path / "out.json"
    rc = main([*TINY_SEARCH, "--memory-budget", str(budget), "--json", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["memory_budget_bytes"] == budget
    frontier = doc["frontier"]
    picked = doc["picked"]
    assert picked == k
    fitting = [i for i, p in enumerate(frontier) if p["memory_bytes"] <= budget]
    assert picked == min(fitting, key=lambda i: frontier[i]["time_s"])
    assert frontier[picked]["memory_bytes"] <= budget
    rows = table_rows(stdout)
    starred = [r for r in rows if r["mark"] == "*"]
    assert len(starred) == 1 and int(starred[0]["idx"]) == picked
    for r in rows:
        i = int(r["idx"])
        if i != picked:
            assert r["mark"] == ("!" if frontier[i]["memory_bytes"] > budget else " "), r


@pytest.mark.parametrize("target", ["mid", "none"])
def test_time_target_picks_the_leanest_in_time(target, tiny_doc, tmp_path, capsys):
    times = [p["time_s"] for p in tiny_doc["frontier"]]
    seconds = sorted(times)[len(times) // 2] if target == "mid" else min(times) / 2
    out = tmp_path / "out.json"
    rc = main([*TINY_SEARCH, "--time-target", f"{seconds * 1e3 * (1 + 1e-9)}ms", "--json", str(out)])
    io = capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["time_target_s"] == pytest.approx(seconds, rel=1e-6)
    frontier = doc["frontier"]
    if target == "none":
        assert rc == 3 and doc["picked"] is None
        assert "runs an iteration within" in io.err and "the fastest plan within it takes" in io.err
        return
    assert rc == 0
    in_time = [i for i, p in enumerate(frontier) if p["time_s"] <= doc["time_target_s"]]
    assert doc["picked"] == min(in_time, key=lambda i: frontier[i]["memory_bytes"])
    assert "leanest within" in io.out


def test_a_time_target_that_is_no_time_is_one_line(capsys):
    rc = main([*TINY_SEARCH, "--time-target", "soon"])
    err = capsys.readouterr().err
    assert_clean_error(rc, err)
    assert "--time-target" in err and "cannot parse time 'soon'" in err


# ---- 7. the README example ------------------------------------------------------------------------
@pytest.mark.slow
def test_readme_example_gpt2_medium(tmp_path):
    proc = run_cli("search", "--model", "gpt2-medium", "--devices", "8", "--device", "h100-80gb",
                   "--global-batch", "32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "354,823,168 parameters" in proc.stdout
    rows = table_rows(proc.stdout)
    assert sum(r["mark"] == "*" for r in rows) == 1
    assert "search (exact) took" in proc.stdout


def test_baselines_beside_the_frontier(tiny, tiny_doc):
    """Baselines are listed under the table and in the JSON with full plans, each beaten (or
    matched) by the frontier at its own memory."""
    _, proc = tiny
    assert "baseline (same cost model)" in proc.stdout
    names = [b["name"] for b in tiny_doc["baselines"]]
    assert "data-parallel" in names and "fsdp" in names
    frontier = tiny_doc["frontier"]
    for b in tiny_doc["baselines"]:
        assert b["plan"]["predicted"]["time_s"] == pytest.approx(b["time_s"], rel=1e-9)
        vs = b["against_frontier"]
        assert vs["faster_point"] is not None and vs["speedup"] >= 1 - 1e-9
        p = frontier[vs["faster_point"]]
        assert p["memory_bytes"] <= b["memory_bytes"] + 2 and p["time_s"] <= b["time_s"] * (1 + 1e-9)
        assert b["name"] in proc.stdout


def test_one_default_space_and_its_opt_outs():
    """Pipelines and gradient accumulation are searched unless the user opts out; `--pipeline`
    (the old opt-in) is still accepted and changes nothing; REST takes the same defaults."""
    from paretoplan.cli import _parser, _request
    from search import SearchRequest

    def req(*flags: str) -> SearchRequest:
        return _request(_parser().parse_args([*TINY_SEARCH, *flags]))

    assert req().pipeline and req().grad_accumulation
    assert req("--pipeline").model_dump() == req().model_dump()
    assert not req("--no-pipeline").pipeline and req("--no-pipeline").grad_accumulation
    assert not req("--no-accumulation").grad_accumulation and req("--no-accumulation").pipeline
    body = SearchRequest(model="gpt2-tiny")
    assert body.pipeline and body.grad_accumulation


def test_default_search_has_accumulation_and_pipelines_in_its_stats(capsys, tmp_path):
    """A default search of a model with a stack runs the stage search (pipelines and
    accumulation); --no-pipeline keeps accumulation only."""
    out = tmp_path / "f.json"
    argv = ["search", "--model", "gpt2", "--devices", "4", "--device", "h100-80gb", "--global-batch", "8",
            "--no-baselines", "--json", str(out)]
    assert main(argv) == 0
    stats = json.loads(out.read_text())["stats"]
    assert stats["pipeline"] and stats["accumulate"] and stats["pipeline_shapes_tried"] > 0
    assert main([*argv, "--no-pipeline"]) == 0
    stats = json.loads(out.read_text())["stats"]
    assert not stats["pipeline"] and stats["accumulate"]
    capsys.readouterr()


def test_resize_against_a_service_that_is_not_there_is_one_line(capsys):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rc = main(["resize", "3", "--devices", "2", "--api", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot reach the service" in err, err
