"""Device profiles: DeviceProfile documents (search.prices.profile) stored under a name."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, undefer

from search import InputError
from service.crud.errors import NotFound, get_or_404
from service.models import Profile
from service.schemas import ProfileIn


def check(body: ProfileIn):
    """The DeviceProfile parsed; InputError (422) when it is not a valid one."""
    from search import parse_profile

    return parse_profile(body.profile, origin="profile")


def create(s: Session, body: ProfileIn, prof) -> Profile:
    p = Profile(name=body.name, device=prof.device, backend=prof.backend, ops=len(prof.ops),
                collectives=len(prof.collectives), document=prof.model_dump(mode="json"))
    s.add(p)
    s.flush()
    return p


def get(s: Session, profile_id: int, *, with_document: bool = False) -> Profile:
    return get_or_404(s, Profile, profile_id, "profile", options=[undefer(Profile.document)] if with_document else [])


def listing(s: Session, limit: int, offset: int) -> tuple[int, list[Profile]]:
    total = s.execute(select(func.count()).select_from(Profile)).scalar_one()
    return total, list(s.scalars(select(Profile).order_by(Profile.id.desc()).limit(limit).offset(offset)))


def document(s: Session, profile_id: int) -> dict:
    """The DeviceProfile a job naming `profile_id` is priced with (InputError when there is none)."""
    try:
        return get(s, profile_id, with_document=True).document
    except NotFound:
        raise InputError(f"profile_id {profile_id}: no such profile (see GET /api/profiles)") from None
