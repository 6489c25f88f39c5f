"""Dependencies of the routes: the database and the settings the app was made with."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request

from service.db import Database
from service.settings import Settings

MAX_ID = 2**31 - 1


def get_db(request: Request) -> Database:
    return request.app.state.db


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def worker_auth(request: Request, x_worker_token: Annotated[str | None, Header()] = None) -> None:
    """Workers prove who they are with a shared token when the service is configured with one."""
    expected = request.app.state.settings.worker_token
    if expected and x_worker_token != expected:
        raise HTTPException(401, "missing or wrong X-Worker-Token")


DB = Annotated[Database, Depends(get_db)]
Config = Annotated[Settings, Depends(get_settings)]


def Id(what: str):  # noqa: N802 - reads like a type
    return Annotated[int, Path(ge=1, le=MAX_ID, description=f"{what} id")]
