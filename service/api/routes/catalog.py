"""/api/models and /api/devices: what a job may name (the zoo, the device catalog)."""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import APIRouter

from service.api.auth import READ
from service.api.errors import StrictJSONRoute
from service.schemas import ModelOut

router = APIRouter(prefix="/api", tags=["catalog"], route_class=StrictJSONRoute)


@cache
def _models() -> list[ModelOut]:
    # the committed index, read once: counting the zoo's parameters builds every model (seconds)
    from search.models import zoo_index

    return [ModelOut.model_validate(m) for m in zoo_index.load()]


@router.get("/models", dependencies=[READ], response_model=list[ModelOut], summary="The model zoo with parameter counts")
def list_models() -> list[ModelOut]:
    return _models()


@router.get("/devices", dependencies=[READ], response_model=list[dict[str, Any]], summary="The device catalog")
def list_devices() -> list[dict[str, Any]]:
    from search import CATALOG

    return [d.model_dump(mode="json") for d in CATALOG.values()]
