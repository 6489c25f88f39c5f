"""/api/profiles: DeviceProfiles (measured op and collective costs of one device type)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.auth import READ, SUBMIT
from service.api.deps import DB, ProfileId
from service.api.errors import StrictJSONRoute
from service.crud import profiles
from service.schemas import Error, ProfileDetail, ProfileIn, ProfileOut

router = APIRouter(prefix="/api/profiles", tags=["profiles"], route_class=StrictJSONRoute)


def _out(p, cls=ProfileOut, **extra):
    return cls(id=p.id, name=p.name, device=p.device, backend=p.backend, ops=p.ops, collectives=p.collectives,
               created_at=p.created_at, **extra)


@router.get("", dependencies=[READ], response_model=list[ProfileOut], summary="Stored device profiles, newest first")
def list_profiles(db: DB, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                  offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> list[ProfileOut]:
    with db.session() as s:
        _, items = profiles.listing(s, limit, offset)
        return [_out(p) for p in items]


@router.post("", dependencies=[SUBMIT], status_code=201, response_model=ProfileOut, responses={422: {"model": Error}},
             summary="Upload a DeviceProfile (paretoplan profile's output); jobs use it with profile_id")
def create_profile(body: ProfileIn, db: DB) -> ProfileOut:
    prof = profiles.check(body)
    with db.write_session() as s:
        return _out(profiles.create(s, body, prof))


@router.get("/{profile_id}", dependencies=[READ], response_model=ProfileDetail, responses={404: {"model": Error}},
            summary="A profile with its document")
def get_profile(profile_id: ProfileId, db: DB) -> ProfileDetail:
    with db.session() as s:
        p = profiles.get(s, profile_id, with_document=True)
        return _out(p, ProfileDetail, profile=p.document)
