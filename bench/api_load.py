"""Load on the service: job submissions per second, and GET frontier latency with stored jobs.

    python bench/api_load.py                                  # SQLite, then PostgreSQL if reachable
    python bench/api_load.py --backends sqlite --jobs 200     # quicker
    TEST_DATABASE_URL=postgresql+psycopg://user@host/db python bench/api_load.py

For each database: a fresh database, a real `paretoplan serve --no-worker` (one uvicorn process)
with auth on (an admin token for the user calls, the worker token for the worker protocol, as
a deployment has them), then, from `--clients` concurrent HTTP clients (threads, keep-alive):
1. submit `--jobs` distinct jobs (POST /api/jobs: validation, hashing, the search row, the job row);
2. give every job its frontier through the worker protocol (claim, then the gzip result) - the
   result is one real FrontierReport (gpt2-tiny on 2 cpu devices: 28 points and 9 baselines with
   their Plans) computed once here, so the numbers measure the service, not the search;
3. GET /api/jobs/{id}/frontier `--requests` times on random jobs: p50 and p99 latency.
Clients and server share the machine's cores: the numbers are for the whole box.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


ADMIN_TOKEN = "ppt_bench-admin-" + uuid.uuid4().hex
WORKER_TOKEN = "ppt_bench-worker-" + uuid.uuid4().hex
USER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}


def start_server(db_url: str, tmp: Path, **env: str) -> tuple[subprocess.Popen, str]:
    out = tmp / f"serve-{uuid.uuid4().hex[:6]}.out"
    proc = subprocess.Popen([sys.executable, "-m", "paretoplan", "serve", "--port", "0", "--no-worker", "--db", db_url],
                            stdout=out.open("w"), stderr=subprocess.STDOUT, cwd=tmp,
                            env={**os.environ, "PARETOPLAN_ADMIN_TOKEN": ADMIN_TOKEN,
                                 "PARETOPLAN_WORKER_TOKEN": WORKER_TOKEN, **env})
    end = time.monotonic() + 120
    while time.monotonic() < end:
        m = re.search(r"serving on (http://\S+) ", out.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"paretoplan serve exited:\n{out.read_text()}")
        time.sleep(0.1)
    raise SystemExit("paretoplan serve did not start")


def fresh_db(backend: str, tmp: Path) -> tuple[str, Callable[[], None]]:
    if backend == "sqlite":
        return f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:6]}.db", lambda: None
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.pool import NullPool

    from service.settings import normalise_database_url

    admin_url = normalise_database_url(os.environ.get("TEST_DATABASE_URL", PG_DEFAULT))
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"paretoplan_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


def pg_reachable() -> bool:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from service.settings import normalise_database_url

    try:
        eng = create_engine(normalise_database_url(os.environ.get("TEST_DATABASE_URL", PG_DEFAULT)), poolclass=NullPool,
                            connect_args={"connect_timeout": 3})
        with eng.connect() as c:
            c.execute(text("SELECT 1"))
        return True
    except Exception:  # noqa: BLE001
        return False


class Clients:
    """One keep-alive httpx client per thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.local = threading.local()
        self.all: list[httpx.Client] = []

    def get(self) -> httpx.Client:
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = httpx.Client(base_url=self.url, timeout=120)
            self.all.append(c)
        return c

    def close(self) -> None:
        for c in self.all:
            c.close()


def run_backend(backend: str, args, report_json: str, tmp: Path) -> dict:
    db_url, drop = fresh_db(backend, tmp)
    proc, url = start_server(db_url, tmp)
    clients = Clients(url)
    try:
        # distinct requests: even global batches (an odd one does not split over 2 devices: a 422)
        bodies = [{"model": "gpt2-tiny", "device": "cpu", "devices": 2, "global_batch": 2 * b}
                  for b in range(1, args.jobs + 1)]

        def submit(body: dict) -> float:
            t = time.perf_counter()
            r = clients.get().post("/api/jobs", json=body, headers=USER)
            assert r.status_code == 201, r.text
            return time.perf_counter() - t

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            submit_lat = list(pool.map(submit, bodies))
        submit_s = time.perf_counter() - t0

        gz_cache: dict[str, bytes] = {}

        def complete(_i: int) -> bool:
            c = clients.get()
            r = c.post("/api/tasks/claim", json={"worker": f"bench-{threading.get_ident()}", "kinds": ["search"]},
                       headers=WORKER)
            if r.status_code == 204:
                return False
            task = r.json()
            body = f'{{"token": {json.dumps(task["token"])}, "report": {report_json}}}'
            r = c.post(f"/api/tasks/search/{task['id']}/result", content=gzip.compress(body.encode(), 5),
                       headers={"Content-Type": "application/json", "Content-Encoding": "gzip", **WORKER})
            assert r.status_code == 200, r.text
            return True

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            done = sum(pool.map(complete, range(args.jobs)))
        complete_s = time.perf_counter() - t0
        assert done == args.jobs, f"{done} of {args.jobs} completed"
        del gz_cache

        total = clients.get().get("/api/jobs", params={"status": "done", "limit": 1}, headers=USER).json()["total"]
        assert total == args.jobs, total
        rng = random.Random(0)
        ids = [rng.randint(1, args.jobs) for _ in range(args.requests)]

        def frontier(job_id: int) -> float:
            t = time.perf_counter()
            r = clients.get().get(f"/api/jobs/{job_id}/frontier", headers=USER)
            assert r.status_code == 200 and r.json()["frontier"], r.text[:200]
            return time.perf_counter() - t

        with ThreadPoolExecutor(args.clients) as pool:  # warm-up
            list(pool.map(frontier, ids[:50]))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            get_lat = list(pool.map(frontier, ids))
        get_s = time.perf_counter() - t0
        return {"backend": backend, "jobs": args.jobs, "submit_per_s": args.jobs / submit_s,
                "submit_p50": pct(submit_lat, 50), "submit_p99": pct(submit_lat, 99),
                "complete_per_s": args.jobs / complete_s, "get_per_s": args.requests / get_s,
                "get_p50": pct(get_lat, 50), "get_p99": pct(get_lat, 99), "get_mean": statistics.mean(get_lat)}
    finally:
        clients.close()
        proc.terminate()
        proc.wait(timeout=30)
        drop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=None, help="sqlite,postgresql (default: sqlite, and postgresql if reachable)")
    p.add_argument("--jobs", type=int, default=1000, help="jobs to submit and store (default 1000)")
    p.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (default 8)")
    p.add_argument("--requests", type=int, default=2000, help="GET frontier requests to time (default 2000)")
    p.add_argument("--json", dest="json_out", help="also write the rows as JSON")
    args = p.parse_args()
    backends = args.backends.split(",") if args.backends else ["sqlite"] + (["postgresql"] if pg_reachable() else [])

    from search.plans.api import SearchRequest, run_search

    report = run_search(SearchRequest(model="gpt2-tiny", device="cpu", devices=2)).report
    report_json = report.model_dump_json()
    print(f"frontier stored per job: {len(report.frontier)} points + {len(report.baselines)} baselines, "
          f"{len(report_json) / 1e3:.0f} kB of Plans; {args.clients} clients; {os.cpu_count()} CPU cores shared "
          f"by clients and server", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="paretoplan-bench-") as tmp:
        for b in backends:
            print(f"{b}: ...", file=sys.stderr)
            rows.append(run_backend(b, args, report_json, Path(tmp)))
    print("| database | stored jobs | submissions/s | submit p50 | submit p99 | frontiers stored/s "
          "| GET frontier/s | GET frontier p50 | GET frontier p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['jobs']:,} | {r['submit_per_s']:.0f} | {r['submit_p50'] * 1e3:.1f} ms "
              f"| {r['submit_p99'] * 1e3:.1f} ms | {r['complete_per_s']:.0f} | {r['get_per_s']:.0f} "
              f"| {r['get_p50'] * 1e3:.1f} ms | {r['get_p99'] * 1e3:.1f} ms |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
