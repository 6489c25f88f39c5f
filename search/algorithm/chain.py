"""The block stack: the repeated layers (transformer blocks) that FT solves once.

A graph's first block stack is the unit of two choices the search makes per layer: whether the
layer's activations are recomputed (one 0/1 variable per layer, `recompute_var`), and - when
its wiring lets one template stand for every layer (`find_chain`) - block reuse: the template
layer is solved once and n layers are combined by doubling (ft.py, step 4). The pipeline stage
search cuts the same stack into stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.models.graph import Op, OpGraph


@dataclass
class Chain:
    """Block reuse on one graph: layers[0] is solved with the rest of the graph, layers[1] is the
    template, layers[1:] are covered by the chain factor."""

    layers: list[tuple[str, ...]]

    @property
    def template(self) -> tuple[str, ...]:
        return self.layers[1]

    @property
    def boundary(self) -> str:
        """The first layer's output op: its variable stands for every layer boundary."""
        return self.layers[0][-1]

    def layer_maps(self) -> list[dict[str, str]]:
        """Per layer 1.., the template's variable names -> that layer's op names."""
        maps = []
        for i in range(1, len(self.layers)):
            m = dict(zip(self.template, self.layers[i], strict=True))
            m[self.boundary] = self.layers[i - 1][-1]
            m[recompute_var(1)] = recompute_var(i)
            maps.append(m)
        return maps


def recompute_var(layer: int) -> str:
    """The variable choosing whether layer `layer` of the block stack is recomputed (0 or 1)."""
    return f"recompute@{layer}"


def layer_index(graph: OpGraph) -> dict[str, int]:
    """op name -> its layer in the block stack (the unit of activation recomputation)."""
    return {name: i for b in graph.blocks[:1] for i, layer in enumerate(b.layers) for name in layer}


def layer_outputs(graph: OpGraph) -> set[str]:
    """The last op of every layer: its output is kept even when its layer is recomputed."""
    return {layer[-1] for b in graph.blocks[:1] for layer in b.layers}


def _signature(op: Op) -> tuple[object, ...]:
    """What two ops must share for one to be priced with the other's tables."""
    return (op.kind, op.output.shape, op.flops, len(op.inputs), len(op.splittable))


def find_chain(graph: OpGraph, min_layers: int = 3) -> Chain | None:
    """The graph's block stack, if its wiring lets one template stand for every layer: layer i
    reads only its own ops, the previous layer's output op and graph inputs; only its output op
    is read from outside it (by the next layer, or after the stack by the ops that follow).
    Block reuse needs at least 3 layers; a pipeline of one given plan can cut 2 (`min_layers`)."""
    if not graph.blocks:
        return None
    layers = list(graph.blocks[0].layers)
    n = len(layers)
    if n < max(min_layers, 2):
        return None
    consumers = graph.consumers()
    member = {name: i for i, layer in enumerate(layers) for name in layer}
    template = [_signature(graph.op(x)) for x in layers[1]]
    for i, layer in enumerate(layers):
        if [_signature(graph.op(x)) for x in layer] != template:
            return None
        for name in layer:
            for t in graph.op(name).inputs:
                if t.source is None or member.get(t.source) == i:
                    continue
                if i > 0 and t.source != layers[i - 1][-1]:
                    return None
            for c, _ in consumers[name]:
                if member.get(c) == i:
                    continue
                if name != layer[-1]:
                    return None
                if i < n - 1 and member.get(c) != i + 1:
                    return None
                if i == n - 1 and c in member:
                    return None
    return Chain(layers=layers)


def after_stack(graph: OpGraph, chain: Chain) -> set[str]:
    """The ops after the block stack: those reading, directly or not, the last layer's output."""
    consumers = graph.consumers()
    out: set[str] = set()
    todo = [c for c, _ in consumers[chain.layers[-1][-1]]]
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(c for c, _ in consumers[name])
    return out
