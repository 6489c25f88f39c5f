"""A real 2-process gloo benchmark of every collective (profiler/collectives.py)."""

from __future__ import annotations

import pytest

from profiler.collectives import check_capacity, host_capacity, profile_collectives
from search.errors import InputError
from search.prices.profile import COLLECTIVE_KINDS

# far apart (x2048, x16): the ends' order survives a busy shared CPU (load 7 on 2 cores was seen
# while other suites ran); the middle one's may not (a 4 KiB broadcast once took 3.5 ms against
# 2.8 ms for 8 MiB at load 10), so the test orders the ends and the fit, not every neighbour
SIZES = (4096, 8 << 20, 128 << 20)


@pytest.mark.processes
def test_two_gloo_processes_positive_monotone_costs() -> None:
    fits, seconds = profile_collectives(2, [2], sizes=SIZES, repeats=5)
    assert seconds > 0
    assert sorted((f.kind, f.group_size) for f in fits) == sorted((k, 2) for k in COLLECTIVE_KINDS)
    for f in fits:
        assert len(f.times) == len(SIZES), f.kind
        assert all(t > 0 for t in f.times), (f.kind, f.times)
        assert f.times[0] < f.times[-1], (f.kind, f.times)  # 32768x the bytes costs more
        # the bytes follow the cost model's convention: the whole tensor, rounded to the group
        assert f.sizes == [float(s) for s in SIZES]
        assert f.alpha >= 0 and f.beta > 0, (f.kind, f.alpha, f.beta)
        assert f(SIZES[-1]) > f(SIZES[0]) > 0


def test_more_ranks_than_the_machine_hosts_is_an_input_error() -> None:
    cap = host_capacity("gloo")
    check_capacity(cap, "gloo")  # at capacity: fine
    with pytest.raises(InputError, match=f"at most {cap} gloo processes"):
        check_capacity(cap + 1, "gloo")
    with pytest.raises(InputError, match="at most"):
        profile_collectives(cap + 2, [2], sizes=(4096,), repeats=1)
