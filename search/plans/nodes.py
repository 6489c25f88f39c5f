"""How a Plan's mesh lies on nodes (machines of `devices_per_node` devices each).

A Plan numbers its devices in mesh order: pp outermost, then its axes by decreasing stride, so the
tensor axis (stride 1) is the fastest-varying. Node k holds devices k*K .. k*K + K - 1, and a
launch gives device d the global rank d (torchrun numbers node k's processes the same way), so
each rank's mesh coordinates are the Plan's. Which axes then stay inside a node and which cross
nodes follows from the strides: the search keeps tensor parallelism inside a node (its groups
talk every layer) and lets pipeline and data parallelism cross nodes (they talk once per stage
boundary or per step).
"""

from __future__ import annotations

from itertools import product
from typing import Literal

from search.plans.plan import Plan

Span = Literal["inside", "across", "mixed"]


def axis_groups(plan: Plan) -> dict[str, list[list[int]]]:
    """Per mesh axis (pp included when > 1), its groups: the devices that differ only along it."""
    n = plan.num_devices
    sizes = {"pp": plan.mesh.pp, **{a.name: a.size for a in plan.mesh.axes}}
    strides = {"pp": n // plan.mesh.pp, **{a.name: a.stride for a in plan.mesh.axes}}
    names = [k for k in sizes if sizes[k] > 1]
    out: dict[str, list[list[int]]] = {}
    for name in names:
        others = [k for k in names if k != name]
        groups = []
        for idx in product(*(range(sizes[k]) for k in others)):
            base = sum(i * strides[k] for i, k in zip(idx, others, strict=True))
            groups.append([base + j * strides[name] for j in range(sizes[name])])
        out[name] = groups
    return out


def node_ranks(num_devices: int, nodes: int) -> list[list[int]]:
    """The global ranks each node runs: node k the k-th block of num_devices / nodes."""
    if nodes < 1 or num_devices % nodes:
        raise ValueError(f"{num_devices} devices do not split evenly over {nodes} nodes")
    k = num_devices // nodes
    return [list(range(i * k, (i + 1) * k)) for i in range(nodes)]


def node_map(plan: Plan, nodes: int | None = None) -> dict[str, Span]:
    """Per mesh axis: 'inside' (each group on one node), 'across' (each group's members on
    distinct nodes) or 'mixed'. `nodes`: the node count of a launch (default: the plan's own,
    num_devices / devices_per_node)."""
    per_node = plan.devices_per_node if nodes is None else plan.num_devices // nodes
    out: dict[str, Span] = {}
    for name, groups in axis_groups(plan).items():
        homes = [[d // per_node for d in g] for g in groups]
        if all(len(set(h)) == 1 for h in homes):
            out[name] = "inside"
        elif all(len(set(h)) == len(h) for h in homes):
            out[name] = "across"
        else:
            out[name] = "mixed"
    return out


def nodes_blocker(plan: Plan, nodes: int) -> str | None:
    """Why `plan` should not run on `nodes` nodes, or None: the devices must split evenly, and a
    tensor axis (a collective in every layer, priced at the links inside a node) must not leave a
    node."""
    if nodes < 1:
        return f"a run needs at least one node, not {nodes}"
    if plan.num_devices % nodes:
        return f"{plan.num_devices} devices do not split evenly over {nodes} nodes"
    per_node = plan.num_devices // nodes
    spans = node_map(plan, nodes)
    for ax in plan.mesh.axes:
        if ax.role == "tensor" and spans.get(ax.name, "inside") != "inside":
            return (f"the plan's tensor axis {ax.name}{ax.size} would span nodes of {per_node} devices: tensor "
                    f"parallelism runs inside a node (search with {per_node} devices per node)")
    return None


def describe(plan: Plan, nodes: int) -> str:
    """One line: how the mesh lies on the nodes, e.g. 'tp2 inside a node, dp2 across 2 nodes'."""
    spans = node_map(plan, nodes)
    words = {"inside": "inside a node", "across": f"across {nodes} nodes", "mixed": "inside and across nodes"}
    sizes = {"pp": plan.mesh.pp, **{a.name: a.size for a in plan.mesh.axes}}
    return ", ".join(f"{name}{sizes[name]} {words[span]}" for name, span in spans.items()) or "one device"
