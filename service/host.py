"""Whether this machine (the one `paretoplan serve` runs on and starts its workers on) can run a plan,
so the dashboard can say why before a launch, not after a run fails in the worker.

The CPU host rule is the worker's own, shared through search.plans.capacity; the rest restates
what worker/launch.py (`check_capacity`) and worker/analyze.py refuse, which the service may not
import. A worker on another machine may host what this one cannot; the answer is about this
machine and says so.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from search.models.pipelines import decoder_refusal, seq2seq_refusal
from search.models.seq2seq import SEQ2SEQ_KIND
from search.plans.capacity import cpu_host_blocker, cuda_devices

gpus = cache(cuda_devices)  # asked on every plan the dashboard opens; the answer does not change


@cache
def zoo_params() -> dict[str, int]:
    """Parameter counts of the models the worker can build by name: the zoo (from its index) and
    the small test models (built here, they are tiny)."""
    from search.models import zoo_index
    from search.models.zoo import TEST_MODELS

    return {**{n: s.param_count() for n, s in TEST_MODELS.items()}, **{m["name"]: int(m["params"]) for m in zoo_index.load()}}


@cache
def zoo_kinds() -> dict[str, str]:
    """The kind (lm, mlm, vision, seq2seq) of every model the worker can build by name."""
    from search.models import zoo_index
    from search.models.zoo import TEST_MODELS

    return {**{n: s.kind for n, s in TEST_MODELS.items()}, **{m["name"]: str(m["kind"]) for m in zoo_index.load()}}


@cache
def zoo_families() -> dict[str, str]:
    """The family (the HF model type of the zoo's encoder-decoders: t5, bart) of every model the
    worker can build by name."""
    from search.models import zoo_index
    from search.models.zoo import TEST_MODELS

    return {**{n: s.family for n, s in TEST_MODELS.items()}, **{m["name"]: str(m["family"]) for m in zoo_index.load()}}


def _pipeline_refusal(plan: dict[str, Any], model: str, source: dict[str, Any]) -> str | None:
    """Why a pipeline of this HF model does not launch (None: it does, or the zoo's class has its
    own split). A plan of an encoder-decoder has its two stacks' block plans (seq2seq.is_encoder_decoder)."""
    config = source.get("config") if source.get("kind") == "hf_config" else None
    if isinstance(config, dict):
        model_type = str(config.get("model_type"))
        return seq2seq_refusal(model_type) if len(plan.get("blocks") or []) >= 2 else decoder_refusal(model_type)
    if zoo_kinds().get(model) != SEQ2SEQ_KIND:
        return None
    return seq2seq_refusal(zoo_families().get(model, ""))


def launch_blocker(plan: dict[str, Any]) -> str | None:
    """Why this machine cannot run `plan` (a stored Plan's JSON), or None when it can."""
    model = plan.get("model")
    source = plan.get("source") or {}
    if source.get("kind") == "graph":
        from search.models.source import NOT_REBUILDABLE

        return f"model {model!r} cannot be launched: {NOT_REBUILDABLE}"
    params = source.get("params") if source.get("kind") == "hf_config" else zoo_params().get(str(model))
    if not isinstance(params, int):
        return (f"model {model!r} is not in the zoo and its plan carries no source to rebuild it from (plans of HF "
                "configs searched now record theirs)")
    pipeline = plan.get("pipeline") or {}
    if int(pipeline.get("stages") or 1) > 1:
        refusal = _pipeline_refusal(plan, str(model), source)
        if refusal:
            return refusal  # worker/analyze.py refuses it likewise
    n = int(plan.get("num_devices") or 1)
    need = int((plan.get("predicted") or {}).get("memory_bytes") or 0)
    have_gpus = gpus()
    if have_gpus:
        if n > have_gpus:
            return f"the plan needs {n} GPUs; this machine has {have_gpus}"
        return None
    return cpu_host_blocker(n, need, params)
