"""The DeviceProfile format (search/prices/profile.py): JSON round trip, one-line errors for bad input,
and op signatures derived by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from search.errors import InputError
from search.models.capture import capture_model
from search.models.graph import Op, ParamRef, TensorRef
from search.models.zoo import get_model
from search.prices.mesh import Mesh, MeshAxis, op_configs
from search.prices.profile import (
    PROFILE_FORMAT,
    Calibration,
    CollectiveFit,
    DeviceProfile,
    LinearFit,
    OpEntry,
    Stat,
    load_profile,
    op_signature,
    parse_profile,
)


def sample_profile() -> DeviceProfile:
    st = Stat(median=2e-4, lo=1.5e-4, hi=3e-4)
    return DeviceProfile(
        device="cpu", ops={"linear:linear|4x16:bf16|8x16:bf16|4x8:bf16|-": OpEntry(kind="linear", fwd=st, bwd=st, samples=5)},
        collectives=[CollectiveFit(kind="all_reduce", group_size=2, alpha=1e-4, beta=1e-9, residual=0.1,
                                   sizes=[4096.0, 65536.0], times=[1.04e-4, 1.6e-4])],
        optimizer={"bf16": LinearFit(alpha=1e-5, beta=2e-9)},
        calibration=Calibration(compute={"linear": 1.3}, comm={"dp": 0.9}, memory_overhead_bytes=1 << 20, reports=2))


def test_round_trip(tmp_path: Path) -> None:
    prof = sample_profile()
    path = tmp_path / "p.json"
    prof.dump(path)
    assert json.loads(path.read_text())["format"] == PROFILE_FORMAT
    assert load_profile(path) == prof


def _one_line_error(data_or_path, match: str) -> None:
    with pytest.raises(InputError) as e:
        if isinstance(data_or_path, Path):
            load_profile(data_or_path)
        else:
            parse_profile(data_or_path, origin="p.json")
    msg = str(e.value)
    assert "\n" not in msg
    assert match in msg, msg


def test_missing_file(tmp_path: Path) -> None:
    _one_line_error(tmp_path / "nope.json", "cannot read profile")


def test_corrupt_json(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text(sample_profile().to_json()[:-40])
    _one_line_error(p, "not valid JSON")


def test_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    _one_line_error(p, "not valid JSON")


def test_another_version() -> None:
    data = json.loads(sample_profile().to_json())
    data["format"] = "paretoplan.profile/2"
    _one_line_error(data, "'paretoplan.profile/2' is not supported")


@pytest.mark.parametrize("data,match", [
    ([1, 2], "not a paretoplan profile"),
    ({"device": "cpu"}, "no 'format' key"),
])
def test_not_a_profile(data, match: str) -> None:
    _one_line_error(data, match)


def _bad(path: list, value) -> dict:
    data = json.loads(sample_profile().to_json())
    d = data
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return data


SIG = "linear:linear|4x16:bf16|8x16:bf16|4x8:bf16|-"


@pytest.mark.parametrize("path,value,match", [
    (["ops", SIG, "fwd", "median"], -1.0, "invalid profile at ops"),
    (["ops", SIG, "fwd", "lo"], 1.0, "lo <= median <= hi"),
    (["ops", SIG, "samples"], 0, "invalid profile at ops"),
    (["collectives", 0, "beta"], float("inf"), "finite"),
    (["collectives", 0, "group_size"], 1, "invalid profile at collectives"),
    (["collectives", 0, "kind"], "scatter", "invalid profile at collectives"),
    (["calibration", "compute", "linear"], 0.0, "positive"),
    (["device"], "tpu-v9", "unknown device"),
    (["surprise"], 1, "invalid profile"),
])
def test_bad_values(path: list, value, match: str) -> None:
    _one_line_error(_bad(path, value), match)


def test_duplicate_collective_fit() -> None:
    data = json.loads(sample_profile().to_json())
    data["collectives"].append(dict(data["collectives"][0]))
    _one_line_error(data, "two fits for all_reduce over 2 ranks")


def test_device_alias_is_canonical() -> None:
    data = json.loads(sample_profile().to_json())
    data["device"] = "H100"
    assert parse_profile(data).device == "h100-80gb"


# ---- signatures ---------------------------------------------------------------------------------
# One Linear, x [B=8, S=4, K=16] (batch, seq, k) @ W [N=32, K=16]^T, on a dp2 x tp2 mesh.
X = TensorRef(source="prev", shape=(8, 4, 16), dims=("batch", "seq", "k"))
LIN = Op(name="fc", kind="linear", target="aten.linear.default", inputs=(X,),
         output=TensorRef(shape=(8, 4, 32), dims=("batch", "seq", "n")),
         params=(ParamRef(name="fc.weight", shape=(32, 16), dims=("n", "k")),),
         splittable=("batch", "n", "k"), flops=2.0 * 8 * 4 * 32 * 16)
MESH = Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("tp", 2, 1, "tensor")))


@pytest.mark.parametrize("cfg,expected", [
    ((None, None), "linear:linear|8x4x16:bf16|32x16:bf16|8x4x32:bf16|-"),
    # data parallel on dp, column parallel on tp: x halves its batch, W and the output their n
    (("batch", "n"), "linear:linear|4x4x16:bf16|16x16:bf16|4x4x16:bf16|-"),
    # row parallel on tp: x and W halve k; the output is Partial, so full-size on each device
    (("batch", "k"), "linear:linear|4x4x8:bf16|32x8:bf16|4x4x32:bf16|-"),
    # both axes on the batch: a quarter of it
    (("batch", "batch"), "linear:linear|2x4x16:bf16|32x16:bf16|2x4x32:bf16|-"),
])
def test_linear_signature_by_hand(cfg, expected: str) -> None:
    assert op_signature(LIN, MESH, cfg, "bf16") == expected


def test_signature_carries_precision_and_causality() -> None:
    assert op_signature(LIN, MESH, (None, None), "fp32").split("|")[1] == "8x4x16:fp32"
    g = capture_model(get_model("gpt2-tiny"), 8, None)
    attn = next(op for op in g.ops if op.kind == "attention")
    assert op_signature(attn, MESH, (None, None), "bf16").endswith("|causal")  # GPT-2 attends causally
    ids = next(op for op in g.ops if op.kind == "embedding" and op.inputs)
    assert op_signature(ids, MESH, (None, None), "bf16").split("|")[1] == "8x64:i64"  # token ids stay integers


def test_repeated_layers_share_signatures() -> None:
    """Every layer of gpt2-tiny's stack has the same signature set on every mesh, and q, k and
    v (equal shapes) share theirs: what makes the profile's size independent of depth."""
    g = capture_model(get_model("gpt2-tiny"), 8, None)
    layers = g.blocks[0].layers
    for mesh in (MESH, Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))):
        per_layer = [[[op_signature(g.op(n), mesh, c, "bf16") for c in op_configs(g.op(n), mesh)] for n in layer]
                     for layer in layers]
        assert all(sigs == per_layer[0] for sigs in per_layer)
        q, k, v = (next(i for i, n in enumerate(layers[0]) if n.endswith(f"attn.{w}:linear")) for w in "qkv")
        assert per_layer[0][q] == per_layer[0][k] == per_layer[0][v]
