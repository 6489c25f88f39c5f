"""Errors the operations raise; the app turns each into its HTTP status with {"detail": message}.
And `get_or_404`, the one lookup by id that raises NotFound."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from sqlalchemy import inspect, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.interfaces import ORMOption

from search import InputError
from service.models import Base

Row = TypeVar("Row", bound=Base)


class NotFound(LookupError):
    """404: no such job, strategy, run or profile."""


class FieldError(InputError):
    """422 about one field of the request body: the answer carries its `loc` as pydantic's errors do,
    so a form can show the message beside that field instead of guessing from the words."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Conflict(RuntimeError):
    """409: the state does not allow it (a lease lost, a job not searched yet)."""


def get_or_404(s: Session, model: type[Row], row_id: int, what: str, *, options: Sequence[ORMOption] = ()) -> Row:
    """The `model` row with primary key `row_id` (loaded with `options`, e.g. undefer a column);
    NotFound "no {what} {row_id}" when there is none. A query, not Session.get: an object already
    in the session gets the columns `options` undefer loaded too."""
    key = inspect(model).primary_key[0]
    found = s.scalars(select(model).where(key == row_id).options(*options)).first()
    if found is None:
        raise NotFound(f"no {what} {row_id}")
    return found
