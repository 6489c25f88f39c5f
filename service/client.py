"""A small REST client of the service: the worker protocol, and the user's calls for scripts and tests.

It imports nothing of the service's database side (only httpx and the standard library), so a
worker node needs no database driver: the service is all it talks to.
"""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

import httpx


class ServiceError(RuntimeError):
    """The service answered with an error: `status` and its `detail`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class LeaseLost(ServiceError):
    """409 from the worker protocol: this claim is over (another worker has the task)."""


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
        headers = {"X-Worker-Token": worker_token} if worker_token else {}
        self.api = api.rstrip("/")
        self.http = httpx.Client(base_url=self.api, timeout=timeout, headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, path: str, body: Any = None, **kw) -> httpx.Response:
        r = self.http.post(path, json=body, **kw)
        _raise_for(r)
        return r

    def _get(self, path: str, **kw) -> Any:
        r = self.http.get(path, **kw)
        _raise_for(r)
        return r.json()

    # ---- the worker protocol -----------------------------------------------------------------
    def claim(self, worker: str, kinds: list[str]) -> dict | None:
        r = self._post("/api/tasks/claim", {"worker": worker, "kinds": kinds})
        return None if r.status_code == 204 else r.json()

    def heartbeat(self, kind: str, task_id: int, token: str, **progress: Any) -> dict:
        body = {"token": token, **{k: v for k, v in progress.items() if v is not None}}
        return self._post(f"/api/tasks/{kind}/{task_id}/heartbeat", body).json()

    def search_result(self, task_id: int, token: str, report_json: str) -> None:
        """The FrontierReport as JSON text; sent gzip-compressed (plans compress ~20x)."""
        body = '{"token":' + json.dumps(token) + ',"report":' + report_json + "}"
        self._post_gzip(f"/api/tasks/search/{task_id}/result", body)

    def run_result(self, task_id: int, token: str, report: dict) -> None:
        self._post_gzip(f"/api/tasks/run/{task_id}/result", json.dumps({"token": token, "report": report}))

    def fail(self, kind: str, task_id: int, token: str, error: str, *, input_error: bool = False,
             retry: bool = False) -> None:
        self._post(f"/api/tasks/{kind}/{task_id}/fail",
                   {"token": token, "error": error[:20000] or "failed", "input_error": input_error, "retry": retry})

    def _post_gzip(self, path: str, text: str, attempts: int = 5) -> None:
        """Results are precious: retried while the service is unreachable (a restart, say)."""
        body = gzip.compress(text.encode(), compresslevel=5)
        for i in range(attempts):
            try:
                r = self.http.post(path, content=body,
                                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
                break
            except httpx.TransportError:
                if i == attempts - 1:
                    raise
                time.sleep(min(2**i, 10))
        _raise_for(r)

    # ---- the user's side ---------------------------------------------------------------------
    def health(self) -> dict:
        return self._get("/api/health")

    def submit(self, body: dict) -> dict:
        return self._post("/api/jobs", body).json()

    def job(self, job_id: int) -> dict:
        return self._get(f"/api/jobs/{job_id}")

    def frontier(self, job_id: int) -> dict:
        return self._get(f"/api/jobs/{job_id}/frontier")

    def strategy(self, strategy_id: int) -> dict:
        return self._get(f"/api/strategies/{strategy_id}")

    def run(self, run_id: int) -> dict:
        return self._get(f"/api/runs/{run_id}")

    def wait(self, job_id: int, timeout: float = 300.0, poll: float = 0.2) -> dict:
        """Poll until the job is done or failed (TimeoutError after `timeout` seconds)."""
        end = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in ("done", "failed"):
                return job
            if time.monotonic() > end:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(poll)

    def wait_run(self, run_id: int, timeout: float = 600.0, poll: float = 0.5) -> dict:
        end = time.monotonic() + timeout
        while True:
            run = self.run(run_id)
            if run["status"] in ("done", "failed"):
                return run
            if time.monotonic() > end:
                raise TimeoutError(f"run {run_id} still {run['status']} after {timeout} s")
            time.sleep(poll)
