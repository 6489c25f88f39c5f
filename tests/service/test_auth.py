"""Who gets in (issue 20, failure 6): tokens with scopes on every route, the worker protocol for
worker tokens only, JSON-only state changes, Host and Origin checks, the dashboard's login cookie,
and `--no-auth` on loopback only."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from service.api.auth import create_token, digest
from service.app import create_app
from service.db import Database
from service.settings import Settings
from tests.service.svchelp import ADMIN_TOKEN, AUTH_SETTINGS, WORKER_TOKEN, count_rows, query
from tests.service.test_api import TINY

JOB = {"model": "gpt2-tiny", "device": "cpu", "devices": 2}


@pytest.fixture
def plain(databases, backend):
    """The app with auth on (the default), and a client that sends no token of its own."""
    url = databases.fresh(backend)
    app = create_app(Settings(database_url=url, allowed_hosts=["testserver"], **AUTH_SETTINGS))
    with TestClient(app) as c:
        c.db_url = url
        yield c


def tokens(url: str, *scopes: str) -> str:
    db = Database(url)
    try:
        with db.write_session() as s:
            _, secret = create_token(s, "test", list(scopes))  # type: ignore[arg-type]
        return secret
    finally:
        db.dispose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_every_api_route_needs_a_token(plain):
    schema = plain.get("/openapi.json").json()
    for path, ops in schema["paths"].items():
        if path == "/api/health":
            continue
        concrete = path.replace("{kind}", "search")
        for part in ("job_id", "run_id", "strategy_id", "profile_id", "resize_id", "task_id"):
            concrete = concrete.replace("{" + part + "}", "1")
        for method in ops:
            r = plain.request(method.upper(), concrete, json={})
            assert r.status_code == 401, f"{method.upper()} {path}: {r.status_code} {r.text[:200]}"
            assert r.headers["www-authenticate"].startswith("Bearer")
    assert plain.get("/api/health").status_code == 200  # liveness for load balancers, says nothing
    r = plain.get("/api/jobs", headers=bearer("ppt_not-a-token-anybody-made-000000"))
    assert r.status_code == 401 and "not valid" in r.json()["detail"]


def test_scopes_read_submit_admin(plain):
    reader = tokens(plain.db_url, "read")
    submitter = tokens(plain.db_url, "read", "submit")
    assert plain.get("/api/jobs", headers=bearer(reader)).status_code == 200
    r = plain.post("/api/jobs", json=JOB, headers=bearer(reader))
    assert r.status_code == 403 and "submit" in r.json()["detail"]
    assert count_rows(plain.db_url)["jobs"] == 0
    r = plain.post("/api/jobs", json=JOB, headers=bearer(submitter))
    assert r.status_code == 201, r.text
    run_resize = plain.post("/api/runs/1/resize", json={"devices": 2}, headers=bearer(reader))
    assert run_resize.status_code == 403
    r = plain.post("/api/admin/tasks/search/1/requeue", headers=bearer(submitter))
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    # only the hash is stored
    stored = [row[0] for row in query(plain.db_url, "SELECT secret_sha256 FROM api_tokens")]
    assert digest(reader) in stored and reader not in stored


def test_the_worker_protocol_takes_worker_tokens_only(plain):
    assert plain.post("/api/jobs", json=JOB, headers=bearer(ADMIN_TOKEN)).status_code == 201
    claim = {"worker": "w"}
    r = plain.post("/api/tasks/claim", json=claim, headers=bearer(ADMIN_TOKEN))
    assert r.status_code == 403 and "worker token" in r.json()["detail"]  # not even an admin's
    assert plain.post("/api/tasks/claim", json=claim).status_code == 401
    stored_worker = tokens(plain.db_url, "worker")
    r = plain.post("/api/tasks/claim", json=claim, headers=bearer(stored_worker))
    assert r.status_code == 200 and r.json()["kind"] == "search"
    # and a worker token reads nothing and submits nothing
    assert plain.get("/api/jobs", headers=bearer(WORKER_TOKEN)).status_code == 403
    assert plain.post("/api/jobs", json=JOB, headers=bearer(WORKER_TOKEN)).status_code == 403


def test_a_revoked_token_is_refused(plain):
    from service.api import auth as auth_mod

    reader = tokens(plain.db_url, "read")
    assert plain.get("/api/jobs", headers=bearer(reader)).status_code == 200
    db = Database(plain.db_url)
    try:
        with db.write_session() as s:
            token_id = s.execute(auth_mod.select(auth_mod.ApiToken.id)).scalars().all()[-1]
            assert auth_mod.revoke_token(s, token_id)
    finally:
        db.dispose()
    plain.app.state.auth._cache.clear()  # the cache holds an answer CACHE_SECONDS; the table is the truth
    assert plain.get("/api/jobs", headers=bearer(reader)).status_code == 401


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"])
def test_a_form_post_cannot_change_state(plain, content_type):
    """An HTML form on any site can post these without a preflight: 415, whatever the token."""
    r = plain.post("/api/jobs", content=b'{"model": "gpt2-tiny", "device": "cpu", "devices": 2}',
                   headers={"Content-Type": content_type, **bearer(ADMIN_TOKEN)})
    assert r.status_code == 415, r.text
    assert count_rows(plain.db_url)["jobs"] == 0


def test_host_and_origin_are_checked(plain):
    r = plain.get("/api/jobs", headers={"Host": "attacker.example", **bearer(ADMIN_TOKEN)})
    assert r.status_code == 400 and "Host" in r.json()["detail"]  # DNS rebinding
    r = plain.post("/api/jobs", json=TINY, headers={"Origin": "http://attacker.example", **bearer(ADMIN_TOKEN)})
    assert r.status_code == 403 and "cross-origin" in r.json()["detail"]
    r = plain.post("/api/jobs", json=TINY, headers={"Origin": "http://testserver", **bearer(ADMIN_TOKEN)})
    assert r.status_code == 201


def test_the_login_link_sets_an_httponly_strict_cookie(plain):
    r = plain.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert plain.get("/login?token=ppt_wrong-wrong-wrong-wrong-wrong").status_code == 401
    assert plain.get(f"/login?token={WORKER_TOKEN}").status_code == 401  # a worker token is no login
    r = plain.get(f"/login?token={ADMIN_TOKEN}", follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = plain.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert plain.get("/api/jobs").status_code == 200  # the cookie is the token
    r = plain.post("/api/jobs", json=TINY, headers={"Origin": "http://attacker.example"})
    assert r.status_code == 403  # and no other site can spend it
    assert plain.get("/logout", follow_redirects=False).status_code == 303


def test_no_auth_is_refused_off_loopback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "paretoplan", "serve", "--host", "0.0.0.0", "--no-auth",
                        "--db", f"sqlite:///{tmp_path}/x.db", "--no-worker"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "loopback" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ValueError):
        Settings(host="::", auth=False)
    assert Settings(host="127.0.0.1", auth=False).auth is False


def test_no_auth_on_loopback_opens_user_routes_not_the_worker_protocol(databases, backend):
    url = databases.fresh(backend)
    app = create_app(Settings(database_url=url, auth=False, allowed_hosts=["testserver"], **AUTH_SETTINGS))
    with TestClient(app) as c:
        assert c.post("/api/jobs", json=JOB).status_code == 201
        assert c.post("/api/tasks/claim", json={"worker": "w"}).status_code == 401


def test_token_cli_creates_lists_and_revokes(tmp_path):
    db = f"sqlite:///{tmp_path}/tokens.db"
    made = subprocess.run([sys.executable, "-m", "paretoplan", "token", "create", "--db", db, "--scopes",
                           "read,submit"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("ppt_") and len(secret) > 40
    bad = subprocess.run([sys.executable, "-m", "paretoplan", "token", "create", "--db", db, "--scopes", "root"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "scopes" in bad.stderr and "Traceback" not in bad.stderr
    listed = subprocess.run([sys.executable, "-m", "paretoplan", "token", "list", "--db", db],
                            capture_output=True, text=True, timeout=120)
    assert "read,submit" in listed.stdout and secret not in listed.stdout
    app = create_app(Settings(database_url=db, allowed_hosts=["testserver"]))
    with TestClient(app) as c:
        assert c.get("/api/jobs", headers=bearer(secret)).status_code == 200


def test_the_resize_cli_sends_its_token(databases, capsys, monkeypatch):
    """`paretoplan resize` sends --token (or PARETOPLAN_TOKEN) as a Bearer token; without one the
    service's 401 is its one line."""
    import threading
    import time

    import uvicorn

    from paretoplan.cli import main

    app = create_app(Settings(database_url=databases.fresh("sqlite"), **AUTH_SETTINGS))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    api = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        monkeypatch.delenv("PARETOPLAN_TOKEN", raising=False)
        assert main(["resize", "7", "--devices", "2", "--api", api]) == 2
        err = capsys.readouterr().err
        assert "authentication required" in err and "(401)" in err and len(err.strip().splitlines()) == 1
        assert main(["resize", "7", "--devices", "2", "--api", api, "--token", ADMIN_TOKEN]) == 2
        assert "no run 7 (404)" in capsys.readouterr().err  # past the token: the run is unknown
        monkeypatch.setenv("PARETOPLAN_TOKEN", ADMIN_TOKEN)
        assert main(["resize", "7", "--devices", "2", "--api", api]) == 2
        assert "no run 7 (404)" in capsys.readouterr().err
    finally:
        server.should_exit = True
        thread.join(10)
