"""How sure a prediction is: whether it was priced from the device catalog or a measured
profile, and the error band the last held-out accuracy check found for that kind of pricing.

The figures live in `accuracy.json` beside this module (shipped as package data), written by the
held-out accuracy benchmark (`python bench/cost_model_accuracy.py --held-out`): per pricing, the
median absolute relative error of the predicted iteration time and peak memory over the plans it
ran, how many, on what machine, and when. A figure not measured yet is null and is said so.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PricedFrom = Literal["catalog", "profile"]
ACCURACY_FILE = "accuracy.json"


class HeldOut(BaseModel):
    """The last held-out check of one kind of pricing (null figures: not measured yet)."""

    model_config = ConfigDict(extra="allow")
    time: float | None = Field(default=None, ge=0.0, description="median |measured - predicted| / predicted, time")
    memory: float | None = Field(default=None, ge=0.0, description="the same for peak memory per device")
    plans: int | None = Field(default=None, ge=0, description="plans run for the check")
    machine: str | None = None
    command: str | None = None
    date: str | None = None
    source: str | None = None


class Accuracy(BaseModel):
    model_config = ConfigDict(extra="allow")
    catalog: HeldOut = Field(default_factory=HeldOut)
    profile: HeldOut = Field(default_factory=HeldOut)


class Confidence(BaseModel):
    """What a prediction says about itself: its pricing and that pricing's held-out error band."""

    priced_from: PricedFrom
    time_error: float | None = Field(default=None, description="held-out median relative error of time (0.1 = ±10%)")
    memory_error: float | None = Field(default=None, description="the same for memory")
    checked: str | None = Field(default=None, description="what the held-out check ran: plans, machine, date")
    message: str = Field(description="one line for people")


@cache
def load_accuracy() -> Accuracy:
    """The committed `accuracy.json` (read once per process)."""
    text = resources.files("search.prices").joinpath(ACCURACY_FILE).read_text(encoding="utf-8")
    return Accuracy.model_validate(json.loads(text))


def _pct(x: float) -> str:
    return f"±{100 * x:.0f}%" if x >= 0.095 else f"±{100 * x:.1f}%"


def profile_hint(model: str | None = None, devices: int | None = None, via: Literal["cli", "api"] = "cli") -> str:
    """How to get a profile of the target machine: the real `paretoplan profile` flags."""
    if via == "api":
        return ("measure one with `paretoplan profile` on the target machine, upload it (POST /api/profiles) and "
                "submit with its profile_id")
    cmd = "paretoplan profile" + (f" --model {model}" if model else " --model MODEL") + \
        (f" --devices {devices}" if devices else " --devices N") + " --out P.json"
    return f"run `{cmd}` on the target machine and pass --profile P.json"


def confidence(priced_from: PricedFrom, model: str | None = None, devices: int | None = None,
               via: Literal["cli", "api"] = "cli", accuracy: Accuracy | None = None) -> Confidence:
    """The pricing of a prediction and the error band of its last held-out check, in words."""
    acc = accuracy if accuracy is not None else load_accuracy()
    held = acc.profile if priced_from == "profile" else acc.catalog
    checked = None
    if held.time is not None or held.memory is not None:
        bits = [f"{held.plans} plans" if held.plans is not None else None, held.machine, held.date]
        checked = ", ".join(b for b in bits if b) or None
        figures = [f"{_pct(x)} {what}" for x, what in ((held.time, "time"), (held.memory, "memory")) if x is not None]
        unchecked = [what for x, what in ((held.time, "time"), (held.memory, "memory")) if x is None]
        band = (f"held-out error median {', '.join(figures)}" + (f" ({checked})" if checked else "")
                + (f"; {' and '.join(unchecked)} not checked" if unchecked else ""))
    else:
        band = "held-out error not measured yet"
    if priced_from == "profile":
        message = f"priced from a profile: {band}"
    else:
        message = (f"priced from the catalog (no profile of this machine; {band}): "
                   f"{profile_hint(model, devices, via)}")
    return Confidence(priced_from=priced_from, time_error=held.time, memory_error=held.memory, checked=checked,
                      message=message)
