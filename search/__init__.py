"""paretoplan's search: a library first, usable from Python with no server running.

Four jobs, one sub-package each, imported in this direction only:

- `search.models`: models in (the OpGraph IR, capture from torch and HF configs, the zoo);
- `search.prices`: what a plan costs (cluster and device catalog, DeviceProfile format, the
  per-op strategy space, the cost model);
- `search.algorithm`: FT frontier tracking, the pipeline stage search and the exhaustive
  reference;
- `search.plans`: what comes out (the Plan format, typed reports, baseline planners and
  `run_search`, the entry point).

The names below are the ones `profiler/`, `service/` and `worker/` import. The torch-heavy parts
(`search.models.capture`, `search.models.zoo`) are not imported here, so importing `search` costs
numpy and pydantic only.
"""

from search.errors import InputError, NoFeasiblePlan, read_json
from search.plans.api import JobRequest, SearchRequest, request_cluster, resized, resolve, run_search
from search.plans.estimate import Estimate, EstimateRequest, estimate
from search.plans.plan import PLAN_VERSION, Plan, build_plans, pick
from search.plans.reports import (
    BaselineEntry,
    Errors,
    FrontierEntry,
    FrontierReport,
    Measured,
    Predicted,
    RankMeasure,
    ResizeTimes,
    RunReport,
    SearchSummary,
    Segment,
    rel_error,
)
from search.prices.accuracy import Confidence, confidence
from search.prices.cluster import CATALOG, Cluster, DeviceSpec, format_size, get_device, make_cluster, parse_duration, parse_size
from search.prices.costmodel import TrainingJob
from search.prices.profile import DeviceProfile, ProfileLookup, load_profile, parse_profile

__all__ = [
    "CATALOG",
    "PLAN_VERSION",
    "BaselineEntry",
    "Cluster",
    "Confidence",
    "DeviceProfile",
    "DeviceSpec",
    "Errors",
    "Estimate",
    "EstimateRequest",
    "FrontierEntry",
    "FrontierReport",
    "InputError",
    "JobRequest",
    "Measured",
    "NoFeasiblePlan",
    "Plan",
    "Predicted",
    "ProfileLookup",
    "RankMeasure",
    "ResizeTimes",
    "RunReport",
    "SearchRequest",
    "SearchSummary",
    "Segment",
    "TrainingJob",
    "build_plans",
    "confidence",
    "estimate",
    "format_size",
    "get_device",
    "load_profile",
    "make_cluster",
    "parse_profile",
    "parse_duration",
    "parse_size",
    "pick",
    "read_json",
    "rel_error",
    "request_cluster",
    "resized",
    "resolve",
    "run_search",
]
