"""/api/strategies: a stored Pareto point (or baseline) with its full Plan."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.auth import READ
from service.api.deps import DB, StrategyId
from service.api.errors import StrictJSONRoute
from service.crud import strategies
from service.schemas import Error, StrategyOut

router = APIRouter(prefix="/api/strategies", tags=["strategies"], route_class=StrictJSONRoute)


@router.get("/{strategy_id}", dependencies=[READ], response_model=StrategyOut, responses={404: {"model": Error}},
            summary="A strategy with its full Plan")
def get_strategy(strategy_id: StrategyId, db: DB) -> StrategyOut:
    with db.session() as s:
        return strategies.out(strategies.get(s, strategy_id))
