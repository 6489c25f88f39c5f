"""Segment reuse: a periodic stack's repeated sub-layers eliminated once.

A periodic stack's layer is p module layers (search/models/capture.py: Jamba's period of 8
holds only 3 kinds of them, Qwen3-Next's of 4 two), so eliminating a layer's ops repeats the
same work for every module layer of a kind. Here the factors of one elimination are grouped by
the module layer of the op that made them (a segment); a segment whose own variables (those no
factor outside it touches, and not kept) exist is eliminated down to its interface (the
variables it shares with the rest: typically the previous module layer's output and its own),
and a segment whose factors are those of one already eliminated - the same tables, the same
domains, wired alike with names replaced by positions - takes that one's factor under its own
names (`frontier.renamed`), read back through the renaming: in one elimination, and across the
eliminations of one mesh (the template layer, the rest of the graph, each ZeRO stage, each
recomputation case: `JoinMemo.kinds`). Exact: variable elimination is
exact in any order, and equal factors under a bijection of names eliminate to equal factors
under it; only the order of the sums (and so which of two tied plans survives) may differ
from eliminating everything at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from search.algorithm.frontier import Factor, Stats, add_stats

# a segment sharing more variables than this with the rest is left to the whole elimination:
# its factor over them could outgrow what eliminating everything at once would make
MAX_INTERFACE = 3


@dataclass
class Segment:
    """The factors made by the ops of one module layer, its own variables (`internal`) and those
    it shares (`interface`), each in the order the factors first name them."""

    factors: list[Factor]
    internal: tuple[str, ...]
    interface: tuple[str, ...]

    def spelling(self, domain: dict[str, int]) -> Hashable:
        """What the elimination reads, with names replaced by positions: two segments spelled
        alike eliminate to the same factor under the map between their names."""
        pos = {v: ("i", k) for k, v in enumerate(self.interface)}
        pos.update({v: ("x", k) for k, v in enumerate(self.internal)})
        return tuple((tuple(pos[v] for v in f.scope), tuple(domain[v] for v in f.scope), f.keys.dtype.str,
                      f.keys.shape, f.keys.tobytes(), f.t.tobytes(), f.m.tobytes(),
                      None if f.m2 is None else f.m2.tobytes()) for f in self.factors)


def find_segments(factors: list[Factor], owners: list[str], segment_of: Callable[[str], int | None],
                  keep: tuple[str, ...]) -> tuple[list[Segment], list[Factor]]:
    """The segments among `factors` (`owners[i]`: the op that made factors[i]; `segment_of`: its
    module layer, None outside the stack) and the factors left, in their order."""
    groups: dict[int, list[int]] = {}
    touched: dict[str, set[int | None]] = {}
    for i, (f, owner) in enumerate(zip(factors, owners, strict=True)):
        g = segment_of(owner)
        if g is not None:
            groups.setdefault(g, []).append(i)
        for v in f.scope:
            touched.setdefault(v, set()).add(g)
    kept = set(keep)
    segments: list[Segment] = []
    taken: set[int] = set()
    for g, idx in groups.items():
        names = list(dict.fromkeys(v for i in idx for v in factors[i].scope))
        internal = tuple(v for v in names if touched[v] == {g} and v not in kept)
        interface = tuple(v for v in names if v not in internal)
        # leaves only: a renamed view reads back through the renaming alone
        if not internal or len(interface) > MAX_INTERFACE or any(factors[i].parents for i in idx):
            continue
        segments.append(Segment([factors[i] for i in idx], internal, interface))
        taken.update(idx)
    return segments, [f for i, f in enumerate(factors) if i not in taken]


@dataclass
class Solved:
    """A kind's elimination: the segment eliminated, its factor, and what that counted."""

    first: Segment
    factor: Factor
    stats: Stats


def solve_segments(segments: list[Segment], domain: dict[str, int],
                   eliminate: Callable[[list[Factor], tuple[str, ...], Stats], Factor],
                   share: Callable[[Factor, dict[str, str]], Factor], shared: dict[Hashable, Solved] | None,
                   stats: Stats | None) -> list[Factor]:
    """Per segment a factor over its interface: the first of each kind eliminated
    (`eliminate(factors, keep, stats)`), the others that one's under their own names
    (`share(f, names)`, names: the first's variables -> the segment's). `shared`: kinds solved
    by other eliminations with the same domains and eps (a mesh's problems: `JoinMemo`); what
    one of them counted is counted again here, as though eliminated here (as `JoinMemo` does)."""
    here: dict[Hashable, Solved] = {}
    out: list[Factor] = []
    for seg in segments:
        key = seg.spelling(domain)
        hit = here.get(key)
        if hit is None:
            hit = shared.get(key) if shared is not None else None
            if hit is None:
                own = Stats()
                hit = Solved(seg, eliminate(seg.factors, seg.interface, own), own)
                if shared is not None:
                    shared[key] = hit
            if stats is not None:
                add_stats(stats, hit.stats)
            here[key] = hit
        if hit.first is seg:
            out.append(hit.factor)
            continue
        first = hit.first
        out.append(share(hit.factor, dict(zip(first.internal + first.interface, seg.internal + seg.interface,
                                              strict=True))))
    return out
