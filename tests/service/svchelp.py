"""Helpers of the service suite (imported by its conftest and tests as `svchelp`)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from search import Errors, Measured, Predicted, RankMeasure, RunReport, rel_error
from service.api.auth import is_worker_route
from service.models import utcnow
from service.settings import normalise_database_url

ADMIN_TOKEN = "ppt_test-admin-" + uuid.uuid4().hex  # the tokens every test service is started with
WORKER_TOKEN = "ppt_test-worker-" + uuid.uuid4().hex
AUTH_SETTINGS = {"admin_token": ADMIN_TOKEN, "worker_token": WORKER_TOKEN}


class TokenAuth:
    """A test client that plays both sides: the worker token on the worker protocol (/api/tasks,
    /api/gangs), the admin token everywhere else, as a worker and a user would send them. A callable, which
    both httpx and the TestClient's httpx take as `auth`; a request that names its own
    Authorization keeps it."""

    def __init__(self, user: str = ADMIN_TOKEN, worker: str = WORKER_TOKEN) -> None:
        self.user, self.worker = user, worker

    def __call__(self, request):
        if "authorization" not in request.headers:
            token = self.worker if is_worker_route(request.url.path) else self.user
            request.headers["Authorization"] = f"Bearer {token}"
        return request


def api_client(url: str, timeout: float = 120.0) -> httpx.Client:
    """An httpx client of a service started by `start_server`, sending the tokens it was started with."""
    return httpx.Client(base_url=url, timeout=timeout, auth=TokenAuth())


PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", "postgresql"]
TABLES = ["profiles", "searches", "strategies", "jobs", "runs", "resizes", "events"]


def _pg_admin() -> tuple[Engine | None, str, str | None]:
    url = normalise_database_url(os.environ.get("TEST_DATABASE_URL", PG_DEFAULT))
    engine = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
    except OperationalError as e:
        return None, url, str(e).splitlines()[0]
    return engine, url, None


class Databases:
    """Fresh databases on demand; the PostgreSQL ones are dropped at the end of the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counter = itertools.count()
        self.created: list[str] = []
        self._admin: tuple[Engine | None, str, str | None] | None = None  # (engine, url, error), on first use

    def fresh(self, backend: str) -> str:
        n = next(self.counter)
        if backend == "sqlite":
            return f"sqlite:///{self.root}/db{n}.sqlite"
        if self._admin is None:
            self._admin = _pg_admin()
        engine, url, err = self._admin
        if engine is None:
            msg = (f"PostgreSQL is not reachable at {make_url(url).render_as_string(hide_password=True)} ({err}); "
                   "set TEST_DATABASE_URL=postgresql+psycopg://USER@HOST:PORT/DB to a server where the tests may "
                   "create databases (.ci/run starts the local one)")
            if os.environ.get("PARETOPLAN_REQUIRE_POSTGRES") == "1":
                pytest.fail(msg)
            pytest.skip(msg)
        name = f"paretoplan_test_{os.getpid()}_{uuid.uuid4().hex[:8]}_{n}"
        with engine.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        self.created.append(name)
        return make_url(url).set(database=name).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        if not self.created or self._admin is None or self._admin[0] is None:
            return
        with self._admin[0].connect() as c:
            for name in self.created:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def count_rows(db_url: str) -> dict[str, int]:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as c:
            return {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
    finally:
        engine.dispose()


def query(db_url: str, sql: str, **params) -> list[tuple]:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(sql), params).all()]
    finally:
        engine.dispose()


class Clock:
    """The queue's clock in tests that play with leases: it starts at the real time and moves only
    when a test advances it (past a lease, instead of sleeping through it)."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def run_report(plan: dict[str, Any], steps: int, *, time_s: float = 0.012, memory_bytes: int = 123456) -> dict[str, Any]:
    """The RunReport (as JSON) a worker would post for `steps` steps of `plan` on one CPU process
    per device, measuring `time_s` per step and `memory_bytes` at peak."""
    pred = Predicted(time_s=plan["predicted"]["time_s"], memory_bytes=plan["predicted"]["memory_bytes"])
    n = plan["num_devices"]
    now = datetime.now(UTC)
    measured = Measured(time_s=time_s, time_spread=0.0, memory_bytes=memory_bytes, memory_method="profiler",
                        timed_steps=list(range(1, steps)), step_times_s=[time_s] * steps,
                        per_rank=[RankMeasure(rank=r, time_s=time_s, memory_bytes=memory_bytes) for r in range(n)])
    return RunReport(
        model=plan["model"], plan_summary=plan["summary"], num_devices=n, device=f"cpu ({n} processes)",
        backend="gloo", steps=steps, seed=0, losses=[2.0 - 0.1 * i for i in range(steps)], predicted=pred,
        measured=measured, errors=Errors(time=rel_error(time_s, pred.time_s), memory=rel_error(memory_bytes, pred.memory_bytes)),
        plan=plan, started=now, finished=now).model_dump(mode="json")


# ---- processes -------------------------------------------------------------------------------

@dataclass
class Proc:
    popen: subprocess.Popen
    out: Path
    err: Path
    url: str = ""

    def log(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


def _env(**extra: str) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PARETOPLAN_ADMIN_TOKEN": ADMIN_TOKEN,
            "PARETOPLAN_WORKER_TOKEN": WORKER_TOKEN, **extra}


def _wait_for(proc: Proc, pattern: str, what: str, timeout: float = 120.0) -> re.Match:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = re.search(pattern, proc.log())
        if m:
            return m
        if proc.popen.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.popen.returncode}:\n{proc.log()[-4000:]}")
        time.sleep(0.1)
    raise AssertionError(f"{what} did not get ready in {timeout} s:\n{proc.log()[-4000:]}")


def start_server(db_url: str | None, tmp: Path, *, lease: float = 30.0, workers: int = 0, **env: str) -> Proc:
    """`paretoplan serve` on any free port; db_url None: the database comes from the environment."""
    tmp.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    out, err = tmp / f"serve-{tag}.out", tmp / f"serve-{tag}.err"
    cmd = [sys.executable, "-m", "paretoplan", "serve", "--port", "0", "--lease", str(lease)]
    cmd += ["--db", db_url] if db_url else []
    cmd += ["--workers", str(workers)] if workers else ["--no-worker"]
    popen = subprocess.Popen(cmd, stdout=out.open("w"), stderr=err.open("w"), cwd=tmp, env=_env(**env))
    proc = Proc(popen, out, err)
    proc.url = _wait_for(proc, r"serving on (http://\S+) ", "paretoplan serve").group(1)
    return proc


def start_worker(url: str, name: str, tmp: Path, *, kinds: str = "search", poll: float = 0.2,
                 wait: bool = True) -> Proc:
    tmp.mkdir(parents=True, exist_ok=True)
    out, err = tmp / f"worker-{name}.out", tmp / f"worker-{name}.err"
    cmd = [sys.executable, "-m", "paretoplan", "worker", "--api", url, "--name", name, "--kinds", kinds,
           "--poll", str(poll)]
    popen = subprocess.Popen(cmd, stdout=out.open("w"), stderr=err.open("w"), cwd=tmp,
                             env=_env(PARETOPLAN_LOG_LEVEL="INFO"))
    proc = Proc(popen, out, err)
    proc.url = name
    if wait:
        wait_ready(proc)
    return proc


def wait_ready(worker: Proc) -> None:
    _wait_for(worker, rf"worker {re.escape(worker.url)} claiming", f"worker {worker.url}")


@dataclass
class Live:
    """A real `paretoplan serve` on a fresh database, and one real worker claiming searches."""

    backend: str
    db_url: str
    url: str
    server: Proc
    worker: Proc


def wait_job(http: httpx.Client, job_id: int, timeout: float = 180.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        job = http.get(f"/api/jobs/{job_id}").json()
        if job["status"] in ("done", "failed"):
            return job
        if time.monotonic() > end:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s: {job}")
        time.sleep(0.1)
