"""Dependencies of the routes: the database, the settings and the clock the app was made with, and
the path ids."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from service.db import Database
from service.models import Clock
from service.settings import Settings

MAX_ID = 2**31 - 1


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_clock(request: Request) -> Clock:
    clock: Clock = request.app.state.clock
    return clock


DB = Annotated[Database, Depends(get_db)]
Config = Annotated[Settings, Depends(get_settings)]
AppClock = Annotated[Clock, Depends(get_clock)]

# ids in paths: positive and within an INTEGER column (422 otherwise, not a database error)
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="run id")]
StrategyId = Annotated[int, Path(ge=1, le=MAX_ID, description="strategy id")]
ProfileId = Annotated[int, Path(ge=1, le=MAX_ID, description="profile id")]
ResizeId = Annotated[int, Path(ge=1, le=MAX_ID, description="resize id")]
TaskId = Annotated[int, Path(ge=1, le=MAX_ID, description="task id")]
