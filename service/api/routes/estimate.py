"""/api/estimate: price one plan written in Megatron-LM's terms, and place it against a job's frontier."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from search import Estimate, InputError, estimate
from search.plans.estimate import same_job
from service.api.auth import SUBMIT
from service.api.deps import DB
from service.api.errors import StrictJSONRoute
from service.crud import jobs, profiles
from service.limits import check_request
from service.schemas import Error, EstimateIn

router = APIRouter(prefix="/api/estimate", tags=["estimate"], route_class=StrictJSONRoute)
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": Error}, 409: {"model": Error}, 422: {"model": Error}}


@router.post("", dependencies=[SUBMIT], response_model=Estimate, responses=ERRORS,
             summary="Price a plan given as tp, pp, micro-batch, ZeRO, recomputation (Megatron-LM style)")
def post_estimate(body: EstimateIn, db: DB) -> Estimate:
    """The model, cluster and job as for `POST /api/jobs`, plus the plan: `{"model": "gpt2", "devices": 8,
    "global_batch": 16, "tp": 2, "pp": 2, "micro_batch": 2}`. Answers with the predicted time, memory,
    MFU, the Plan (the format frontiers store), whether the executor runs it and, with `job_id`,
    which point of that job's frontier dominates it. Synchronous: capturing a large model takes
    seconds (a plain `def` route: FastAPI runs it in its thread pool)."""
    check_request(body)  # the estimate captures the model here, in the service: bounded first
    profile = None
    with db.session() as s:
        if body.profile_id is not None:
            if body.profile is not None:
                raise InputError("give either profile or profile_id, not both")
            profile = profiles.document(s, body.profile_id)
        frontier = jobs.frontier(s, body.job_id) if body.job_id is not None else None
    est = estimate(body.estimate_request(profile), frontier.frontier if frontier is not None else None, via="api")
    if frontier is not None:
        same_job(frontier, est.plan, f"job {body.job_id}'s frontier")
    return est
