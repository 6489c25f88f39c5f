"""The hostile inputs of issue 20, each as it was reproduced: every one is now a 4xx within seconds,
stores nothing, and leaves the service serving (on SQLite and PostgreSQL)."""

from __future__ import annotations

import gzip
import json

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from service.db import make_engine
from tests.service.svchelp import count_rows
from tests.service.test_api import TINY, app_client, submit


@pytest.fixture
def client(databases, backend):
    with app_client(databases, backend) as c:
        yield c


LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}


def _post_raw(c, body: bytes, **headers):
    return c.post("/api/jobs", content=body, headers={"Content-Type": "application/json", **headers})


def test_a_lone_surrogate_is_a_422_and_nothing_is_stored(client):
    """Failure 1: "\\udfff" in hf_config was a 500 after the job was stored, and GET /api/jobs a
    500 for everyone on PostgreSQL from then on."""
    submit(client)  # one good job, so the listing has something to serialise
    for where in ('"hf_config": {"model_type": "llama", "name_or_path": "\\udfff"}',
                  '"model": "gpt2-tiny", "name": "x\\ud800y"', '"model": "gpt2-tiny", "\\udfff": 1'):
        body = ('{"device": "cpu", "devices": 2, ' + where + "}").encode()
        r = _post_raw(client, body)
        assert r.status_code == 422, r.text
        assert "surrogate" in r.json()["detail"]
    raw_bytes = b'{"model": "gpt2-tiny", "device": "cpu", "devices": 2, "name": "\xed\xbf\xbf"}'
    assert _post_raw(client, raw_bytes).status_code in (400, 422)
    assert count_rows(client.db_url)["jobs"] == 1
    assert client.get("/api/jobs").status_code == 200
    pair = '{"model": "gpt2-tiny", "device": "cpu", "devices": 2, "name": "\\ud83d\\ude00"}'  # a valid pair
    assert _post_raw(client, pair.encode()).status_code == 201


@pytest.mark.parametrize("body", [
    {"model": "gpt2-tiny", "devices": 10**12},
    {"model": "gpt2-tiny", "cluster": {"device": "h100-80gb", "devices": 10**12, "devices_per_node": 10**12}},
    {"model": "gpt2-tiny", "cluster": {"device": "h100-80gb", "devices": 10**12}},
    {"model": "gpt2-tiny", "devices": 8, "device_counts": [10**12]},
], ids=["devices", "cluster-node", "cluster", "device-counts"])
def test_a_trillion_devices_is_a_422(client, body):
    """Failure 3: a cluster of 10^12 devices sent a thread into a loop that never ended."""
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 422, r.text
    r = client.post("/api/estimate", json={**body, "tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8})
    assert r.status_code == 422, r.text
    assert count_rows(client.db_url)["jobs"] == 0
    assert client.get("/api/health").status_code == 200


def test_a_gzip_bomb_is_a_413(client):
    """Failure 3: a gzip body inflated 512 MiB on the event loop; now at most the inflated limit,
    in a worker thread."""
    bomb = gzip.compress(b"{" + b" " * (200 * 1024 * 1024) + b"}", compresslevel=9)
    assert len(bomb) < 1024 * 1024  # under the body limit: only inflating finds it out
    r = _post_raw(client, bomb, **{"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "inflates" in r.json()["detail"]
    assert _post_raw(client, b"\x1f\x8b not gzip", **{"Content-Encoding": "gzip"}).status_code == 400
    assert client.get("/api/jobs").status_code == 200


def test_huge_graphs_and_hf_configs_are_refused_before_parsing(client):
    """Failure 3: a 10^6-op graph cost 7 GB and 212 s; a Llama config of hidden size 10^9 tied up a worker."""
    op = {"name": "x", "kind": "matmul", "inputs": []}
    graph = {"format": "paretoplan.opgraph/1", "ops": [{**op, "name": f"op{i}"} for i in range(20_001)]}
    r = client.post("/api/jobs", json={"graph": graph, "devices": 2, "device": "cpu"})
    assert r.status_code == 422 and "20,000" in r.json()["detail"]
    for key, value in (("hidden_size", 10**9), ("num_hidden_layers", 10**6), ("vocab_size", 10**9),
                       ("intermediate_size", 10**7)):
        r = client.post("/api/jobs", json={"hf_config": {**LLAMA, key: value}, "devices": 2, "device": "cpu"})
        assert r.status_code == 422 and key in r.json()["detail"], r.text
    many = {**LLAMA, "hidden_size": 200_000, "intermediate_size": 200_000, "num_hidden_layers": 1000}
    r = client.post("/api/jobs", json={"hf_config": many, "devices": 2, "device": "cpu"})
    assert r.status_code == 422 and "parameters" in r.json()["detail"]
    nested = {"model_type": "llava", "text_config": {**LLAMA, "hidden_size": 10**9}}
    r = client.post("/api/jobs", json={"hf_config": nested, "devices": 2, "device": "cpu"})
    assert r.status_code == 422 and "text_config.hidden_size" in r.json()["detail"]
    assert count_rows(client.db_url)["jobs"] == 0


@pytest.mark.parametrize("field,value", [("devices", True), ("global_batch", True), ("zero_stages", [True, 1]),
                                         ("device_counts", [True])])
def test_true_is_not_a_number(client, field, value):
    """Failure 7: `devices: true` was accepted as 1."""
    r = client.post("/api/jobs", json={**TINY, field: value})
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    r = client.post("/api/jobs/1/launch", json={"steps": True})
    assert r.status_code == 422


def test_an_event_stream_past_the_cap_is_a_503(client):
    """Failure 7: 300 idle SSE clients kept a core busy; now a cap, and idle streams poll ever less often."""
    job = submit(client)
    client.app.state.sse_clients = client.app.state.settings.max_sse_clients
    try:
        r = client.get(f"/api/jobs/{job['id']}/events")
        assert r.status_code == 503 and "Retry-After" in r.headers
    finally:
        client.app.state.sse_clients = 0


def test_a_statement_past_its_timeout_is_cancelled(databases, backend):
    """Failure 4: a hung database hung every endpoint; a statement now has a deadline on both dialects."""
    engine = make_engine(databases.fresh(backend), statement_timeout=0.5)
    slow = ("SELECT pg_sleep(5)" if backend == "postgresql" else
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r")
    try:
        with engine.connect() as c, pytest.raises(OperationalError):
            c.execute(text(slow))
        with engine.connect() as c:  # and the connection serves the next statement
            assert c.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_an_unreachable_database_is_a_503_with_retry_after(tmp_path):
    """Failure 4: database errors were 500s; an unreachable database answers 503 and Retry-After,
    within the connect timeout."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from tests.service.svchelp import AUTH_SETTINGS, TokenAuth

    dead = "postgresql+psycopg://postgres@127.0.0.1:9/nothing"  # port 9 (discard): nothing listens
    app = create_app(Settings(database_url=dead, allowed_hosts=["testserver"], **AUTH_SETTINGS), migrate=False)
    with TestClient(app) as c:
        c.auth = TokenAuth()
        r = c.get("/api/jobs")
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        r = c.post("/api/jobs", json=TINY)
        assert r.status_code == 503
        r = c.get("/api/jobs", headers={"Authorization": "Bearer ppt_a-stored-token-needs-the-database"})
        assert r.status_code == 503


def test_nothing_of_a_refused_result_is_stored(client, tiny_report):
    """Failure 4: a report value out of what a column holds (a baseline's memory of 1.3e32 bytes)
    is a 422 before anything is stored, not a 500."""
    from tests.service.test_api import claim, post_result

    submit(client)
    task = claim(client, "w")
    report = json.loads(tiny_report)
    if report["baselines"]:
        report["baselines"][0]["memory_bytes"] = int(1.3e32)
    else:
        report["frontier"][0]["memory_bytes"] = int(1.3e32)
    r = post_result(client, task, json.dumps(report))
    assert r.status_code == 422, r.text
    assert count_rows(client.db_url)["strategies"] == 0
    assert client.get("/api/jobs").json()["items"][0]["status"] == "running"


def test_a_worker_report_is_typed_where_the_dashboard_shows_it(client, tiny_report):
    """Failure 2: a worker result carried HTML where a point index belongs (`faster_point`), which
    the dashboard inserted; the report is typed now (and the page escapes whatever it shows)."""
    from tests.service.test_api import claim, post_result

    submit(client)
    task = claim(client, "w")
    report = json.loads(tiny_report)
    assert report["baselines"], "gpt2-tiny's search has baselines"
    report["baselines"][0]["against_frontier"]["faster_point"] = '<img src=x onerror="alert(1)">'
    r = post_result(client, task, json.dumps(report))
    assert r.status_code == 422 and "faster_point" in r.text
    report["baselines"][0]["against_frontier"]["faster_point"] = len(report["frontier"])  # no such point
    r = post_result(client, task, json.dumps(report))
    assert r.status_code == 422 and "not a point" in r.json()["detail"]
    assert count_rows(client.db_url)["strategies"] == 0


@pytest.mark.processes
def test_a_slow_request_head_is_cut_off(databases, tmp_path):
    """Failure 7: there was no header timeout (800 slow connections held the server); a head that
    has not arrived within PARETOPLAN_HEADER_TIMEOUT_SECONDS is disconnected, and others are served."""
    import socket
    import time
    from urllib.parse import urlsplit

    from tests.service.svchelp import api_client, start_server

    server = start_server(databases.fresh("sqlite"), tmp_path, PARETOPLAN_HEADER_TIMEOUT_SECONDS="1")
    try:
        where = urlsplit(server.url)
        with socket.create_connection((where.hostname, where.port)) as slow:
            slow.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            slow.settimeout(30)
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server, with no answer
            waited = time.monotonic() - started
        assert waited < 25
        with api_client(server.url) as c:
            assert c.get("/api/jobs").status_code == 200
    finally:
        server.stop()
