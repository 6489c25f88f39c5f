"""A self-contained interactive chart of a frontier (plotly.js embedded: opens offline)."""

from __future__ import annotations

import plotly.graph_objects as go

from search import Plan, format_size
from search.algorithm.results import FrontierPoint, SearchResult
from search.plans.flops import format_mfu as _mfu

GIB = 2**30


def frontier_html(result: SearchResult, plans: list[Plan], budget: float, best: FrontierPoint | None,
                  baselines: list | None = None) -> str:
    fig = go.Figure()
    by_mesh: dict[str, list[int]] = {}
    for i, plan in enumerate(plans):
        by_mesh.setdefault(plan.mesh.shape, []).append(i)
    for mesh, idxs in by_mesh.items():
        fig.add_trace(go.Scatter(
            x=[result.points[i].memory_bytes / GIB for i in idxs],
            y=[result.points[i].time_s * 1e3 for i in idxs],
            mode="markers", name=mesh,
            text=[f"#{i}: {plans[i].summary}<br>params {format_size(plans[i].predicted.breakdown.params)}, "
                  f"activations {format_size(plans[i].predicted.breakdown.activations)}, MFU {_mfu(plans[i].predicted.mfu)}"
                  for i in idxs],
            hovertemplate="%{y:.2f} ms, %{x:.2f} GiB<br>%{text}<extra></extra>",
        ))
    for b in baselines or []:
        fig.add_trace(go.Scatter(x=[b.memory_bytes / GIB], y=[b.time_s * 1e3], mode="markers+text", name=b.name,
                                 text=[b.name], textposition="top center", marker=dict(symbol="x", size=11),
                                 hovertemplate=f"{b.name}: %{{y:.2f}} ms, %{{x:.2f}} GiB<br>{b.description}"
                                               "<extra></extra>"))
    if best is not None:
        fig.add_trace(go.Scatter(x=[best.memory_bytes / GIB], y=[best.time_s * 1e3], mode="markers",
                                 name="fastest that fits", marker=dict(symbol="star", size=16, color="black")))
    mems = [p.memory_bytes / GIB for p in result.points] + [b.memory_bytes / GIB for b in baselines or []] or [0.0]
    lo, hi = min(mems), max(mems)
    pad = max((hi - lo) * 0.08, hi * 0.01, 1e-3)
    title = f"{result.graph.name} on {result.cluster.describe()}: {len(result.points)} Pareto-optimal plans"
    if budget / GIB <= hi + pad:  # draw the budget where it cuts the frontier; don't squash the chart for it
        fig.add_vline(x=budget / GIB, line_dash="dash", annotation_text=f"budget {format_size(int(budget))}")
        hi = max(hi, budget / GIB)
    else:
        title += f" (all within the {format_size(int(budget))} budget)"
    fig.update_xaxes(range=[max(lo - pad, 0.0), hi + pad])
    fig.update_layout(
        title=title,
        xaxis_title="peak memory per device (GiB)", yaxis_title="iteration time (ms)", template="plotly_white",
    )
    return fig.to_html(include_plotlyjs=True, full_html=True)
