"""Fixtures of the service suite: fresh databases (SQLite and PostgreSQL), the app in process, and
real `paretoplan serve` / `paretoplan worker` processes.

PostgreSQL: TEST_DATABASE_URL names a server where the tests may create databases (default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres). Without one the PostgreSQL half of the
suite is skipped with a message saying so, or fails when PARETOPLAN_REQUIRE_POSTGRES=1 (CI).
"""

from __future__ import annotations

import pytest

from tests.service.svchelp import BACKENDS, Databases, Live, api_client, start_server, start_worker


@pytest.fixture(scope="session")
def databases(tmp_path_factory):
    dbs = Databases(tmp_path_factory.mktemp("databases"))
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session", params=[pytest.param(b, marks=pytest.mark.postgres) if b == "postgresql" else b
                                        for b in BACKENDS])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def live(backend, databases, tmp_path_factory):
    db_url = databases.fresh(backend)
    tmp = tmp_path_factory.mktemp(f"live-{backend}")
    server = start_server(db_url, tmp)
    worker = None
    try:
        worker = start_worker(server.url, f"live-{backend}", tmp)
        yield Live(backend, db_url, server.url, server, worker)
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


@pytest.fixture
def http(live):
    with api_client(live.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def tiny_report() -> str:
    """A real FrontierReport (gpt2-tiny on 2 cpu devices), as JSON, for tests that play the worker."""
    from search.plans.api import SearchRequest, run_search

    return run_search(SearchRequest(model="gpt2-tiny", device="cpu", devices=2)).report.model_dump_json()
