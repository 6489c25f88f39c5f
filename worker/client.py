"""The worker's REST client of the service: the worker protocol (claim, heartbeat, result, fail;
a gang node's result, worker.gang).

It imports nothing of the service (only httpx, pydantic and the report types of `search`), so a
worker node needs no database driver: the service is all it talks to.
"""

from __future__ import annotations

import gzip
import json
import time
from types import TracebackType
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict

from search import FrontierReport, RunReport

Kind = Literal["search", "run"]
RESULT_RETRY_SECONDS = 600.0  # a result is retried this long through outages (its lease may well outlive them)


class ServiceError(RuntimeError):
    """The service answered with an error: `status` and its `detail`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class LeaseLost(ServiceError):
    """409 from the worker protocol: this claim is over (another worker has the task)."""


class Task(BaseModel):
    """A claimed task, as the service hands it out (POST /api/tasks/claim)."""

    model_config = ConfigDict(extra="ignore")
    kind: Kind
    id: int
    token: str
    attempt: int
    lease_seconds: float
    request: dict[str, Any] | None = None  # search: the SearchRequest
    plan: dict[str, Any] | None = None     # run: the Plan to execute
    steps: int | None = None               # run: training steps
    checkpoint: str | None = None          # run: the run directory an earlier claim saved checkpoints to
    checkpoint_every: int | None = None    # run: save after every N steps


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        detail = r.json().get("detail", r.text)
    except (ValueError, AttributeError):
        detail = r.text
    raise (LeaseLost if r.status_code == 409 else ServiceError)(r.status_code, str(detail))


class ServiceClient:
    def __init__(self, api: str, *, worker_token: str | None = None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {worker_token}"} if worker_token else {}
        self.api = api.rstrip("/")
        self.http = httpx.Client(base_url=self.api, timeout=timeout, headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _post(self, path: str, body: Any = None) -> httpx.Response:
        r = self.http.post(path, json=body)
        _raise_for(r)
        return r

    def claim(self, worker: str, kinds: list[Kind]) -> Task | None:
        r = self._post("/api/tasks/claim", {"worker": worker, "kinds": kinds})
        return None if r.status_code == 204 else Task.model_validate(r.json())

    def heartbeat(self, kind: Kind, task_id: int, token: str, **progress: Any) -> dict[str, Any]:
        """Renew the lease; progress (stage, fraction, message, step; a run's checkpoint, devices,
        segments and resize answer) rides along. The service's answer: a run's pending `resize`."""
        r = self._post(f"/api/tasks/{kind}/{task_id}/heartbeat",
                       {"token": token, **{k: v for k, v in progress.items() if v is not None}})
        answer: dict[str, Any] = r.json()
        return answer

    def search_result(self, task_id: int, token: str, report: FrontierReport) -> None:
        self._post_report(f"/api/tasks/search/{task_id}/result", token, report)

    def run_result(self, task_id: int, token: str, report: RunReport) -> None:
        self._post_report(f"/api/tasks/run/{task_id}/result", token, report)

    def node_result(self, run_id: int, token: str, node_rank: int, report: RunReport) -> bool:
        """One node's report of a run that spans nodes (/api/gangs); True when it was the last
        and the run is complete. Retried through outages as every result is."""
        r = self._post_report(f"/api/gangs/run/{run_id}/result", token, report, node_rank=node_rank)
        return bool(r.json()["complete"])

    def fail(self, kind: Kind, task_id: int, token: str, error: str, *, input_error: bool = False,
             retry: bool = False, handback: bool = False) -> None:
        """`handback`: the worker is stopping and returns the task unharmed (not a failed attempt)."""
        body = {"token": token, "error": error[:20000] or "failed", "input_error": input_error, "retry": retry}
        if handback:
            body["handback"] = True
        self._post(f"/api/tasks/{kind}/{task_id}/fail", body)

    def _post_report(self, path: str, token: str, report: FrontierReport | RunReport,
                     give_up_after: float = RESULT_RETRY_SECONDS, **fields: Any) -> httpx.Response:
        """Sent gzip-compressed (plans compress ~20x), and retried with backoff while the service is
        unreachable or answers 5xx (a restart, a database outage): a finished result is precious.
        Only the service's word ends it early: 409 (the claim is over) or another 4xx (not a
        valid report) is raised at once. `fields` go into the body beside the token."""
        head = json.dumps({"token": token, **fields})[:-1]  # the report is spliced in as it serialises itself
        text = head + ',"report":' + report.model_dump_json() + "}"
        body = gzip.compress(text.encode(), compresslevel=5)
        deadline = time.monotonic() + give_up_after
        delay = 0.5
        while True:
            try:
                r = self.http.post(path, content=body,
                                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
            except httpx.TransportError:
                if time.monotonic() + delay > deadline:
                    raise
            else:
                if r.status_code < 500 or time.monotonic() + delay > deadline:
                    _raise_for(r)
                    return r
                delay = max(delay, _retry_after(r))
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


def _retry_after(r: httpx.Response) -> float:
    try:
        return min(float(r.headers.get("retry-after", "0")), 60.0)
    except ValueError:
        return 0.0
