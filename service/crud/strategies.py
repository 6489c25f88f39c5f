"""Strategies: the stored Pareto points (and baselines) with their Plans."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from service.crud.errors import NotFound
from service.models import Strategy
from service.schemas import StrategyOut


def get(s: Session, strategy_id: int, *, with_plan: bool = True) -> Strategy:
    q = select(Strategy).where(Strategy.id == strategy_id)
    if with_plan:
        q = q.options(undefer(Strategy.plan))
    found = s.scalars(q).first()
    if found is None:
        raise NotFound(f"no strategy {strategy_id}")
    return found


def out(st: Strategy) -> StrategyOut:
    return StrategyOut(id=st.id, search_id=st.search_id, kind=st.kind, index=st.idx, name=st.name,
                       description=st.description, time_s=st.time_s, memory_bytes=st.memory_bytes,
                       summary=st.summary, against_frontier=st.against_frontier, plan=st.plan)
