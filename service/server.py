"""`paretoplan serve`: the API under uvicorn, and local worker processes beside it.

The workers are `paretoplan worker --api URL` processes, started once the server listens (so a
`--port 0` server tells them the port it got) and stopped with it; each exits by itself if this
process disappears. The line `paretoplan: serving on URL` on stdout says where it listens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import uvicorn

from service.app import create_app
from service.settings import Settings


def _url(server: uvicorn.Server, host: str) -> str:
    port = server.servers[0].sockets[0].getsockname()[1]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, which would kill this process
    before it stops its workers; here the signal only asks for the shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def connection_limits(settings: Settings) -> dict[str, Any]:
    """What keeps slow or idle connections from holding the server: h11 gives up on a request
    whose headers have not arrived within `header_timeout_seconds` (uvicorn's keep-alive timeout
    covers the wait for the next request's first byte), at most `max_connections` at once (503
    beyond), and an idle keep-alive connection closes after 5 seconds."""
    from service.connection import protocol

    return {"http": protocol(settings.header_timeout_seconds), "timeout_keep_alive": 5,
            "limit_concurrency": settings.max_connections, "h11_max_incomplete_event_size": 64 * 1024}


def serve(settings: Settings, *, workers: int = 1, log_level: str = "warning") -> int:
    from service.api.auth import new_secret

    # as Jupyter does: without configured tokens, this start makes its own (kept in memory only) --
    # the admin token for the login link it prints, the worker token for the workers it starts
    made = {k: new_secret() for k in ("admin_token", "worker_token") if getattr(settings, k) is None}
    settings = settings.model_copy(update=made)
    app = create_app(settings)  # migrates before listening
    import search.models.zoo  # noqa: F401 - the first submission validates against the zoo: import torch now, not then
    server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                    timeout_graceful_shutdown=5, **connection_limits(settings)))
    procs: list[subprocess.Popen] = []

    def start_workers() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.05)
        url = _url(server, settings.host)
        for i in range(workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "paretoplan", "worker", "--api", url,
                                           "--exit-with-parent", "--name", f"local-{os.getpid()}-{i}"],
                                          env={**os.environ, "PARETOPLAN_WORKER_TOKEN": settings.worker_token or ""}))
        pids = ", ".join(str(p.pid) for p in procs)
        db = app.state.db.engine.url.render_as_string(hide_password=True)
        print(f"paretoplan: serving on {url} (database {db}; "
              f"{f'{workers} local worker(s): pid {pids}' if procs else 'no local worker'}); docs at {url}/docs",
              flush=True)
        if settings.auth:
            print(f"paretoplan: log in to the dashboard at {url}/login?token={settings.admin_token} "
                  f"(this token reads, submits and administers: send it as 'Authorization: Bearer ...')", flush=True)
        else:
            print("paretoplan: authentication is off (--no-auth): anyone on this machine can use the service",
                  flush=True)

    starter = threading.Thread(target=start_workers, daemon=True)
    starter.start()
    try:
        server.run()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return 0
