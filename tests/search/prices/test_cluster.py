"""Tests for search.prices.cluster: the device catalog, size parsing and cluster validation.

The planner trusts these numbers blindly, so the tests pin down the user-facing contract:
every bad input is an InputError (exit code 2, one-line message), never a crash.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from search.errors import InputError
from search.prices.cluster import (
    CATALOG,
    Cluster,
    DeviceSpec,
    format_size,
    get_device,
    load_cluster,
    make_cluster,
    parse_size,
)

GiB = 2**30


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40GiB", 40 * GiB),
        ("40 GiB", 40 * GiB),
        ("40gib", 40 * GiB),
        ("80GB", 80 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5TiB", 3 * 2**39),
        ("1024", 1024),
        ("1024B", 1024),
        (" 2 KiB ", 2048),
        ("40Gi", 40 * GiB),
        ("1e9", 10**9),
        (".5KiB", 512),
        (4096, 4096),
        (8e10, 80_000_000_000),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "GiB", "forty GiB", "40 GiBs", "40 XB", "1.2.3GB", "40 Gi B", "0", "0GiB",
     "-1GiB", "-5", 0, -1, True, 1.5, float("nan"), None, [40]],
)
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(InputError):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "n", [1, 512, 1024, 40 * GiB, 80 * GiB, 141 * GiB, 512 * 2**20, 3 * 2**39, 256 * GiB]
)
def test_size_round_trip(n: int) -> None:
    # one decimal is exact for these, so text -> bytes -> text -> bytes is stable
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1024, "1.0 KiB"),
        (40 * GiB, "40.0 GiB"),
        (3 * 2**39, "1.5 TiB"),
        (1024 * GiB - 1, "1.0 TiB"),  # never "1024.0 GiB"
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


# ---------------------------------------------------------------- catalog


REQUIRED = {"h100-80gb", "h100-pcie", "h200", "a100-80gb", "a100-40gb", "v100-32gb",
            "v100-16gb", "l4", "cpu"}


def test_catalog_has_required_entries() -> None:
    assert REQUIRED <= set(CATALOG)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_entry_is_sane(name: str) -> None:
    spec = CATALOG[name]
    assert spec.name == name
    assert spec.source.strip() and "http" in spec.source
    assert spec.vendor_name.strip()
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        assert dtype in spec.peak_flops
    assert spec.peak_flops["bf16"] >= spec.peak_flops["fp32"]
    for value in (spec.memory_bytes, spec.memory_bandwidth, spec.intra_node_bandwidth,
                  spec.inter_node_bandwidth, spec.intra_node_latency, spec.inter_node_latency,
                  spec.devices_per_node, *spec.peak_flops.values()):
        assert value > 0 and math.isfinite(value)
    # a node's internal fabric is never slower than its network, and latencies are small
    assert spec.intra_node_bandwidth >= spec.inter_node_bandwidth
    assert spec.intra_node_latency <= spec.inter_node_latency < 1e-3


def test_catalog_spot_values() -> None:
    """A few datasheet figures, so an accidental edit to the catalog is noticed."""
    h100 = CATALOG["h100-80gb"]
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.memory_bandwidth == pytest.approx(3.35e12)
    assert h100.intra_node_bandwidth == pytest.approx(450e9)
    assert h100.inter_node_bandwidth == pytest.approx(50e9)
    assert CATALOG["h200"].peak_flops == h100.peak_flops
    assert CATALOG["h200"].memory_bandwidth == pytest.approx(4.8e12)
    assert CATALOG["a100-80gb"].peak_flops["bf16"] == pytest.approx(312e12)
    assert "fp8" not in CATALOG["a100-80gb"].peak_flops
    assert CATALOG["l4"].peak_flops["bf16"] == pytest.approx(121e12)


def test_get_device_case_insensitive_and_aliases() -> None:
    assert get_device("H100-80GB") is CATALOG["h100-80gb"]
    assert get_device(" a100_80gb ") is CATALOG["a100-80gb"]
    assert get_device("h200-141gb") is CATALOG["h200"]


def test_get_device_unknown_lists_known() -> None:
    with pytest.raises(InputError, match=r"unknown device 'tpu-v9'; known: .*h100-80gb"):
        get_device("tpu-v9")


def test_peak_unknown_dtype_is_input_error() -> None:
    assert CATALOG["h100-80gb"].peak("BF16") == pytest.approx(989.4e12)
    with pytest.raises(InputError, match="fp8"):
        CATALOG["a100-80gb"].peak("fp8")


def test_specs_are_frozen() -> None:
    with pytest.raises(ValidationError):
        CATALOG["h100-80gb"].memory_bytes = 1  # type: ignore[misc]


# ---------------------------------------------------------------- make_cluster


def test_make_cluster_defaults() -> None:
    c = make_cluster("h100-80gb", 1024)
    assert c.devices_per_node == 8 and c.nodes == 128
    assert c.memory_per_device == 80 * GiB
    assert c.inter_node_bandwidth == CATALOG["h100-80gb"].inter_node_bandwidth
    assert c.describe() == "128 nodes x 8 h100-80gb (80 GiB)"


@pytest.mark.parametrize("n", [0, -1, -8])
def test_make_cluster_rejects_non_positive_devices(n: int) -> None:
    with pytest.raises(InputError, match="--devices must be at least 1"):
        make_cluster("h100-80gb", n)


def test_make_cluster_rejects_non_multiple_of_node() -> None:
    with pytest.raises(
        InputError,
        match=r"--devices 12 is not a multiple of the node size 8 \(use --devices-per-node\)",
    ):
        make_cluster("h100-80gb", 12)


def test_make_cluster_partial_node() -> None:
    c = make_cluster("h100-80gb", 4)
    assert (c.num_devices, c.devices_per_node, c.nodes) == (4, 4, 1)
    assert c.describe() == "1 node x 4 h100-80gb (80 GiB)"
    assert c.link(4, 1)[0] == c.intra_node_bandwidth * c.device.intra_node_efficiency


def test_make_cluster_explicit_node_size_and_memory() -> None:
    c = make_cluster("a100-40gb", 12, devices_per_node=4, memory_per_device="30GiB")
    assert (c.nodes, c.devices_per_node, c.memory_per_device) == (3, 4, 30 * GiB)
    assert make_cluster("l4", 8, memory_per_device=20 * GiB).memory_per_device == 20 * GiB


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"devices_per_node": 0}, "--devices-per-node must be at least 1"),
        ({"devices_per_node": -2}, "--devices-per-node must be at least 1"),
        ({"memory_per_device": 0}, "size must be positive"),
        ({"memory_per_device": -5}, "size must be positive"),
        ({"memory_per_device": "lots"}, "cannot parse size"),
        ({"inter_node_bandwidth": 0.0}, "inter_node_bandwidth"),
        ({"intra_node_latency": float("nan")}, "intra_node_latency"),
    ],
)
def test_make_cluster_rejects(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        make_cluster("h100-80gb", 16, **kwargs)  # type: ignore[arg-type]


def test_make_cluster_rejects_non_integer_count() -> None:
    with pytest.raises(InputError, match="whole number"):
        make_cluster("h100-80gb", 8.5)  # type: ignore[arg-type]


def test_make_cluster_unknown_device() -> None:
    with pytest.raises(InputError, match="unknown device"):
        make_cluster("b9000", 8)


def test_cluster_direct_construction_fills_defaults_and_validates() -> None:
    c = Cluster(device=CATALOG["v100-32gb"], num_devices=16, devices_per_node=8)
    assert c.memory_per_device == 32 * GiB and c.intra_node_latency > 0
    with pytest.raises(ValidationError):
        Cluster(device=CATALOG["v100-32gb"], num_devices=12, devices_per_node=8)


# ---------------------------------------------------------------- link


def _intra(c) -> float:
    return c.intra_node_bandwidth * c.device.intra_node_efficiency


def _nic(c) -> float:
    return c.inter_node_bandwidth * c.device.inter_node_efficiency


def test_link_tp_group_in_node_is_intra() -> None:
    c = make_cluster("h100-80gb", 16)
    assert c.link(8, 1) == (_intra(c), c.intra_node_latency)
    assert c.link(4, 2) == (_intra(c), c.intra_node_latency)


def test_link_dp_group_across_nodes_is_inter() -> None:
    # one member per node (stride 8): each crossing goes through that member's one NIC
    c = make_cluster("h100-80gb", 128)
    assert c.link(16, 8) == (_nic(c), c.inter_node_latency)


def test_link_pair_with_node_stride_is_inter() -> None:
    c = make_cluster("h100-80gb", 16)
    assert c.link(2, 8) == (_nic(c), c.inter_node_latency)


def test_link_group_that_does_not_tile_a_node_is_inter() -> None:
    # stride 3 x 2 = span 6: the group {6, 9} straddles the node boundary, 2 members a node
    c = make_cluster("h100-80gb", 16)
    assert c.link(2, 3)[0] == 2 * _nic(c)
    # a tp group larger than a node crosses nodes too


def test_link_crosses_nodes_through_every_members_nic() -> None:
    """NCCL runs a ring per NIC: 8 members a node cross through 8 NICs, up to the NVLink rate."""
    c = make_cluster("a100-80gb", 32)
    assert c.link(32, 1)[0] == min(_intra(c), 8 * _nic(c))
    assert c.link(16, 2)[0] == min(_intra(c), 4 * _nic(c))
    assert c.link(4, 8)[0] == _nic(c)


def test_link_single_member_group_is_finite() -> None:
    c = make_cluster("h100-80gb", 16)
    bandwidth, latency = c.link(1, 8)
    assert math.isfinite(bandwidth) and math.isfinite(latency)


@pytest.mark.parametrize(("size", "stride"), [(0, 1), (2, 0), (3, 8)])
def test_link_rejects_bad_groups(size: int, stride: int) -> None:
    c = make_cluster("h100-80gb", 16)
    with pytest.raises(ValueError):
        c.link(size, stride)


def test_link_uses_overrides() -> None:
    c = make_cluster("h100-80gb", 16, inter_node_bandwidth=12.5e9)
    assert c.link(2, 8)[0] == 12.5e9 * c.device.inter_node_efficiency


# ---------------------------------------------------------------- load_cluster


def _write(tmp_path: Path, payload: object) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def test_load_cluster_with_overrides(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "device": "H100-80GB",
        "devices": 16,
        "devices_per_node": 8,
        "memory_per_device": "40GiB",
        "inter_node_bandwidth": 25e9,
        "intra_node_latency": 5e-6,
    })
    c = load_cluster(path)
    assert (c.num_devices, c.nodes, c.devices_per_node) == (16, 2, 8)
    assert c.memory_per_device == 40 * GiB
    assert c.inter_node_bandwidth == 25e9
    assert c.intra_node_latency == 5e-6
    assert c.intra_node_bandwidth == CATALOG["h100-80gb"].intra_node_bandwidth
    assert c.describe() == "2 nodes x 8 h100-80gb (40 GiB)"
    assert load_cluster(str(path)) == c


def test_load_cluster_integer_memory(tmp_path: Path) -> None:
    c = load_cluster(_write(tmp_path, {"device": "a100-80gb", "devices": 8,
                                       "memory_per_device": 42949672960}))
    assert c.memory_per_device == 40 * GiB


def test_load_cluster_inline_device(tmp_path: Path) -> None:
    device = {
        "name": "my-npu",
        "vendor_name": "Example NPU 64GB",
        "memory_bytes": "64GiB",
        "memory_bandwidth": 1.6e12,
        "peak_flops": {"fp32": 50e12, "bf16": 400e12},
        "intra_node_bandwidth": 200e9,
        "inter_node_bandwidth": 25e9,
        "intra_node_latency": 4e-6,
        "inter_node_latency": 12e-6,
        "devices_per_node": 4,
    }
    c = load_cluster(_write(tmp_path, {"device": device, "devices": 8}))
    assert c.device.name == "my-npu"
    assert c.device.memory_bytes == 64 * GiB
    assert (c.nodes, c.devices_per_node) == (2, 4)
    # efficiencies not given: the defaults apply (a custom part states only what it knows)
    assert c.link(4, 1) == (200e9 * c.device.intra_node_efficiency, 4e-6)
    assert c.link(2, 4) == (25e9 * c.device.inter_node_efficiency, 12e-6)
    assert "cluster.json" in c.device.source  # defaulted source names the file


def test_load_cluster_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_cluster(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ('{"device": "h100-80gb", "devices": 16,', "invalid JSON"),
        ('{"device": "h100-80gb", "devices": NaN}', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"device": "h100-80gb", "devices": 16, "gpus_per_node": 8}, "unknown key.*gpus_per_node"),
        ({"devices": 16}, "missing required key 'device'"),
        ({"device": "h100-80gb"}, "missing required key 'devices'"),
        ({"device": "h100-80gb", "devices": "16"}, '"devices" must be a whole number'),
        ({"device": "h100-80gb", "devices": True}, '"devices" must be a whole number'),
        ({"device": "h100-80gb", "devices": 12}, 'not a multiple of the node size 8 '
                                                 r'\(use "devices_per_node"\)'),
        ({"device": "h100-80gb", "devices": 16, "inter_node_bandwidth": "fast"}, "number"),
        ({"device": "h100-80gb", "devices": 16, "inter_node_bandwidth": -1}, "positive"),
        ({"device": "h100-80gb", "devices": 16, "memory_per_device": "big"}, "cannot parse"),
        ({"device": "h100-80gb", "devices": 16, "memory_per_device": [1]}, "size string"),
        ({"device": "tpu", "devices": 16}, "unknown device"),
        ({"device": 7, "devices": 16}, "catalog name or a device object"),
        ({"device": {"name": "x"}, "devices": 16}, "device at vendor_name: Field required; at memory_bytes: Field required"),
    ],
)
def test_load_cluster_rejects(tmp_path: Path, payload: object, match: str) -> None:
    path = _write(tmp_path, payload)
    with pytest.raises(InputError, match=match) as info:
        load_cluster(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message


def test_load_cluster_inline_device_bad_fields(tmp_path: Path) -> None:
    good = dict(CATALOG["l4"].model_dump())
    for bad in (
        {**good, "colour": "green"},  # unknown key
        {**good, "devices_per_node": "8"},  # wrong type, not coerced
        {**good, "peak_flops": {"bf17": 1e12}},  # unknown dtype
        {**good, "memory_bandwidth": 0},  # non-positive
    ):
        with pytest.raises(InputError):
            load_cluster(_write(tmp_path, {"device": bad, "devices": 8}))
    # the dumped catalog entry itself loads back unchanged
    assert load_cluster(_write(tmp_path, {"device": good, "devices": 8})).device == CATALOG["l4"]


def test_device_spec_round_trips_through_json() -> None:
    spec = CATALOG["h100-80gb"]
    assert DeviceSpec.model_validate_json(spec.model_dump_json()) == spec
