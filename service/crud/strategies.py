"""Strategies: the stored Pareto points (and baselines) with their Plans."""

from __future__ import annotations

from sqlalchemy.orm import Session, undefer

from service.crud.errors import get_or_404
from service.models import Strategy
from service.schemas import StrategyOut


def get(s: Session, strategy_id: int, *, with_plan: bool = True) -> Strategy:
    return get_or_404(s, Strategy, strategy_id, "strategy", options=[undefer(Strategy.plan)] if with_plan else [])


def out(st: Strategy) -> StrategyOut:
    from service.host import launch_blocker

    blocker = launch_blocker(st.plan or {})
    return StrategyOut(id=st.id, search_id=st.search_id, kind=st.kind, index=st.idx, name=st.name,
                       description=st.description, time_s=st.time_s, memory_bytes=st.memory_bytes,
                       summary=st.summary, against_frontier=st.against_frontier, plan=st.plan,
                       launchable_here=blocker is None, not_launchable_reason=blocker)
