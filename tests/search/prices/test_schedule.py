"""Pipeline schedule costs, worked by hand."""

from __future__ import annotations

import pytest

from search.errors import InputError
from search.prices.schedule import (
    StageCosts,
    bubble_fraction,
    check_schedule,
    in_flight,
    iteration_time,
    peak_memory,
    stage_memory,
    weight_copies,
)


@pytest.mark.parametrize("p,m,expected", [(4, 8, 3 / 11), (4, 1, 3 / 4), (1, 8, 0.0), (8, 32, 7 / 39)])
def test_bubble_fraction_gpipe_and_1f1b(p, m, expected):
    # (p - 1) idle slots out of m + p - 1
    assert bubble_fraction(p, m, "gpipe") == pytest.approx(expected)
    assert bubble_fraction(p, m, "1f1b") == pytest.approx(expected)
    assert bubble_fraction(p, m, "2bw") == 0.0


def test_in_flight_activations_per_stage():
    # 1F1B with p = 4, m = 8: stage s warms up with p - s forwards before its first backward
    assert [in_flight(s, 4, 8, "1f1b") for s in range(4)] == [4, 3, 2, 1]
    # fewer micro-batches than stages: nobody holds more than m
    assert [in_flight(s, 4, 2, "1f1b") for s in range(4)] == [2, 2, 2, 1]
    # GPipe keeps every micro-batch until the backward pass starts
    assert [in_flight(s, 4, 8, "gpipe") for s in range(4)] == [8, 8, 8, 8]
    assert [in_flight(s, 4, 8, "2bw") for s in range(4)] == [4, 3, 2, 1]


def test_2bw_keeps_two_weight_versions():
    # a model of |W| = 1200 bytes of weights in p = 4 stages: 300 per stage, 2BW holds 600 = 2|W|/p
    w = 1200.0
    stage = StageCosts(forward_s=1, backward_s=2, p2p_s=0, sync_s=0, optimizer_s=0,
                       weights_bytes=w / 4, grads_bytes=0, optimizer_bytes=0, activations_bytes=0)
    assert weight_copies("2bw") == 2 and weight_copies("1f1b") == 1
    assert stage_memory(0, stage, 4, 8, "2bw") == pytest.approx(2 * w / 4)
    assert stage_memory(0, stage, 4, 8, "1f1b") == pytest.approx(w / 4)


def test_iteration_time_and_peak_memory():
    # 4 equal stages, 8 micro-batches: 11 slots of (1 + 2 + 2*0.5) s, then 0.25 s sync + 0.25 s step
    s = StageCosts(forward_s=1, backward_s=2, p2p_s=0.5, sync_s=0.25, optimizer_s=0.25,
                   weights_bytes=100, grads_bytes=100, optimizer_bytes=600, activations_bytes=10)
    assert iteration_time([s] * 4, 8, "1f1b") == pytest.approx(11 * 4 + 0.5)
    assert iteration_time([s] * 4, 8, "gpipe") == pytest.approx(11 * 4 + 0.5)
    assert iteration_time([s] * 4, 8, "2bw") == pytest.approx(8 * 4 + 0.5)
    # the first stage peaks: 800 static + 4 micro-batches x 10 (1F1B), 8 x 10 (GPipe)
    assert peak_memory([s] * 4, 8, "1f1b") == pytest.approx(840)
    assert peak_memory([s] * 4, 8, "gpipe") == pytest.approx(880)
    assert peak_memory([s] * 4, 8, "2bw") == pytest.approx(940)


def test_2bw_needs_opt_in():
    assert check_schedule("1f1b") == "1f1b"
    assert check_schedule("2bw", allow_async=True) == "2bw"
    with pytest.raises(InputError, match="allow-async-pipeline"):
        check_schedule("2bw")
    with pytest.raises(InputError, match="unknown pipeline schedule"):
        check_schedule("zero-bubble")
