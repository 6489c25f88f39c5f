"""Where a plan's model comes from, so whoever launches the plan can rebuild the model.

A Plan names its model (``plan.model``) for people; the worker needs more than a name to build
it. `ModelSource` says how: a zoo (or test) model by its name, a HuggingFace config by its
contents (rebuilt with transformers, randomly initialised under the run's seed; nothing is
downloaded), or an uploaded OpGraph, which prices but cannot be rebuilt (a graph holds no
forward to run), and is refused at launch saying so.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from search.errors import InputError


class ModelSource(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["zoo", "hf_config", "graph"]
    name: str = Field(description="zoo: the model's zoo name; hf_config: the label it was submitted under; "
                                  "graph: the graph's name")
    config: dict[str, Any] | None = Field(default=None, description="hf_config: the config.json's contents")
    params: int | None = Field(default=None, ge=0, description="parameters of the model (the launcher's host check "
                                                               "reads it without building the model)")

    @model_validator(mode="after")
    def _config_for_hf(self) -> ModelSource:
        if (self.kind == "hf_config") != (self.config is not None):
            raise ValueError("an hf_config source carries its config, and only it does")
        return self

    def fingerprint(self) -> str:
        """Identifies the model this source builds (two configs under one label differ here)."""
        body = json.dumps(self.model_dump(mode="json", exclude={"params"}), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def zoo_source(name: str) -> ModelSource:
    return ModelSource(kind="zoo", name=name)


def hf_source(config: dict[str, Any], label: str, params: int | None = None) -> ModelSource:
    return ModelSource(kind="hf_config", name=label, config=config, params=params)


def graph_source(name: str, params: int | None = None) -> ModelSource:
    return ModelSource(kind="graph", name=name, params=params)


NOT_REBUILDABLE = ("its model is an uploaded OpGraph, which prices a plan but cannot run one: a graph holds no "
                   "forward to execute; search the model from its zoo name or HF config to launch its plans")


def source_spec(source: ModelSource):
    """The ModelSpec that rebuilds a source's model (InputError for a graph, or a name the zoo lacks)."""
    from search.models.zoo import TEST_MODELS, ZOO, spec_from_hf_config

    if source.kind == "zoo":
        spec = ZOO.get(source.name) or TEST_MODELS.get(source.name)
        if spec is None:
            raise InputError(f"model {source.name!r} is not in the zoo (known: {', '.join([*ZOO, *TEST_MODELS])})")
        return spec
    if source.kind == "hf_config":
        assert source.config is not None  # the validator's rule
        return spec_from_hf_config(source.config, source.name, origin=source.name)
    raise InputError(f"model {source.name!r} cannot be launched: {NOT_REBUILDABLE}")
