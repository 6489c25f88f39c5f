"""Compare the collectives one executed step performed (CommDebugMode, per module) with the
collectives the Plan's cost model prices on the tensor axis (ExecSpec.expected_comms).

Counts are compared per *unit* - a block layer ('blocks.0') or a top-level module ('lm_head';
'' for ops of the root module itself) - and per phase and kind: CommDebugMode attributes a
collective to the module running at the time, which inside a unit depends on hook order, while
the unit is what both sides agree on. Collectives that run outside any module's forward or
backward (the optimizer step) are reported under the unit 'optimizer'.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from worker.spec import ExpectedComm

Key = tuple[str, str, str]  # unit, phase, kind


def expected_counts(expected: list[ExpectedComm], cpu: bool = False) -> Counter[Key]:
    """Per (unit, phase, kind); on a CPU mesh (`cpu`) a DTensor all-to-all is counted as the
    all-gather DTensor runs in its place (torch.distributed.tensor._collective_utils.shard_dim_alltoall)."""
    return Counter((e.unit, e.phase, _kind(e, cpu)) for e in expected)


def _kind(e: ExpectedComm, cpu: bool) -> str:
    return "all_gather" if cpu and e.dtensor and e.kind == "all_to_all" else e.kind


def measured_counts(comm: dict[str, dict[str, dict[str, int]]], units: set[str]) -> Counter[Key]:
    """Per unit from CommDebugMode's per-module counts (a module's count includes its children's);
    what no unit claims (the root's own ops, the optimizer step) goes to '' resp. 'optimizer'."""
    out: Counter[Key] = Counter()
    claimed: Counter[tuple[str, str]] = Counter()
    for unit in units:
        if unit == "":
            continue
        # a unit holding other units (a HF model's top-level 'model' around its layers) keeps
        # only what runs outside them: theirs are theirs
        inner = [v for v in units if v.startswith(unit + ".")]
        for phase, kinds in comm.get(unit, {}).items():
            for kind, n in kinds.items():
                n -= sum(comm.get(v, {}).get(phase, {}).get(kind, 0) for v in inner)
                out[(unit, phase, kind)] += n
                claimed[(phase, kind)] += n
    # the root module's own count covers everything during forward/backward; 'Global' also
    # covers what ran outside the model (the optimizer step)
    root = comm.get("", {})
    glob = comm.get("Global", {})
    for phase in ("forward", "backward"):
        for kind in set(root.get(phase, {})) | set(glob.get(phase, {})):
            in_root = root.get(phase, {}).get(kind, 0)
            rest = in_root - claimed[(phase, kind)]
            if rest:
                out[("", phase, kind)] += rest
            outside = glob.get(phase, {}).get(kind, 0) - in_root
            if outside:
                out[("optimizer", phase, kind)] += outside
    return out


def mismatches(expected: list[ExpectedComm], comm: dict, cpu: bool = True) -> list[str]:
    """One line per (unit, phase, kind) whose counts differ, naming the plan edges involved (on a
    CPU mesh unless `cpu` is False: see expected_counts)."""
    exp = expected_counts(expected, cpu)
    units = {e.unit for e in expected} | {k for k in comm if k not in ("Global",) and "." not in k} | {
        ".".join(k.split(".")[:2]) for k in comm if k.count(".") >= 1 and k.split(".")[1].isdigit()}
    got = measured_counts(comm, units)
    lines = []
    for key in sorted(set(exp) | set(got)):
        if exp[key] != got[key]:
            unit, phase, kind = key
            sources = sorted({e.source for e in expected if (e.unit, e.phase, _kind(e, cpu)) == key})
            lines.append(f"{unit or '(root)'} {phase} {kind}: plan {exp[key]}, executed {got[key]}"
                         + (f" (plan: {'; '.join(sources[:4])}{' ...' if len(sources) > 4 else ''})" if sources else ""))
    return lines


class P2PCount(TorchDispatchMode):
    """Counts the point-to-point sends and receives one step performs (c10d's send and recv ops,
    as torch.distributed.pipelining issues them through batch_isend_irecv). CommDebugMode is not
    usable under a pipeline schedule (its module tracker refuses the schedule's autograd.grad),
    and these ops reach the dispatcher like any other."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func)
        if name.startswith("c10d.send"):
            self.counts["send"] += 1
        elif name.startswith("c10d.recv"):
            self.counts["recv"] += 1
        return func(*args, **(kwargs or {}))
