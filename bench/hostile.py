"""Hostile inputs against a real service: what each is answered with, how fast, and whether the
service still serves afterwards.

    python bench/hostile.py                          # SQLite, then PostgreSQL if reachable
    python bench/hostile.py --backends sqlite

For each database: a fresh database and a real `paretoplan serve --no-worker` with auth on; then
each attack of issue 20 is tried once, and after each a GET /api/jobs with a valid token must
answer 200. The table has one row per attack and database: the status, the seconds to the
answer, and the check after it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_load import USER, WORKER, fresh_db, pg_reachable, start_server  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}
JOB = {"model": "gpt2-tiny", "device": "cpu", "devices": 2}
JSON = {"Content-Type": "application/json"}
HEADER_TIMEOUT = 2.0


def read_token(db_url: str) -> str:
    out = subprocess.run([sys.executable, "-m", "paretoplan", "token", "create", "--db", db_url, "--scopes", "read"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def slowloris(url: str) -> int:
    """Send a request's head one byte a second: the status is 0 once the server has closed the
    connection (before the head was complete)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.settimeout(1.0)
        for byte in b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1) == b"":
                    return 0
            except TimeoutError:
                continue
            except OSError:
                return 0
        return -1  # still open after a minute: the old behaviour


def attacks(url: str, reader: str) -> list[tuple[str, Callable[[httpx.Client], int]]]:
    def post(c: httpx.Client, body: bytes, **headers: str) -> int:
        return c.post("/api/jobs", content=body, headers={**JSON, **USER, **headers}).status_code

    bomb = gzip.compress(b"{" + b" " * (256 * 1024 * 1024) + b"}", 9)  # 256 MiB of spaces, ~250 kB of gzip
    graph = {"format": "paretoplan.opgraph/1",
             "ops": [{"name": f"op{i}", "kind": "matmul", "inputs": []} for i in range(100_000)]}
    return [
        ("no token", lambda c: c.get("/api/jobs").status_code),
        ("a wrong token", lambda c: c.get("/api/jobs", headers={"Authorization": "Bearer ppt_guessed-guessed-guessed"}
                                          ).status_code),
        ("a read token submits", lambda c: c.post("/api/jobs", json=JOB,
                                                  headers={"Authorization": f"Bearer {reader}"}).status_code),
        ("a user token claims a task", lambda c: c.post("/api/tasks/claim", json={"worker": "x"}, headers=USER
                                                        ).status_code),
        ("a worker token reads jobs", lambda c: c.get("/api/jobs", headers=WORKER).status_code),
        ("a text/plain form post (CSRF)", lambda c: post(c, json.dumps(JOB).encode(), **{"Content-Type": "text/plain"})),
        ("a cross-origin POST", lambda c: post(c, json.dumps(JOB).encode(), Origin="http://attacker.example")),
        ("a foreign Host (DNS rebinding)", lambda c: c.get("/api/jobs", headers={**USER, "Host": "attacker.example"}
                                                           ).status_code),
        ('a lone surrogate "\\udfff" in hf_config',
         lambda c: post(c, b'{"hf_config": {"model_type": "llama", "x": "\\udfff"}, "devices": 2, "device": "cpu"}')),
        ("10^12 devices", lambda c: post(c, json.dumps({**JOB, "devices": 10**12}).encode())),
        ("a cluster of 10^12 devices per node", lambda c: post(c, json.dumps({
            "model": "gpt2-tiny", "cluster": {"device": "h100-80gb", "devices": 10**12, "devices_per_node": 10**12}}
        ).encode())),
        ("devices: true", lambda c: post(c, json.dumps({**JOB, "devices": True}).encode())),
        (f"a gzip bomb ({len(bomb) / 1e6:.1f} MB inflating to 256 MiB)",
         lambda c: post(c, bomb, **{"Content-Encoding": "gzip"})),
        ("a body of 33 MiB (the limit is 32)", lambda c: post(c, b"x" * (33 * 1024 * 1024))),
        ("a graph of 10^5 ops", lambda c: post(c, json.dumps({"graph": graph, "devices": 2, "device": "cpu"}).encode())),
        ("an HF config of hidden size 10^9",
         lambda c: post(c, json.dumps({"hf_config": {**LLAMA, "hidden_size": 10**9}, "devices": 2, "device": "cpu"}
                                      ).encode())),
        ("an HF config of 10^15 parameters",
         lambda c: post(c, json.dumps({"hf_config": {**LLAMA, "hidden_size": 200_000, "intermediate_size": 200_000,
                                                     "num_hidden_layers": 1000}, "devices": 2, "device": "cpu"}).encode())),
        (f"a request head sent 1 byte/s (header timeout {HEADER_TIMEOUT:.0f} s)", lambda c: slowloris(url)),
    ]


def run_backend(backend: str, tmp: Path) -> list[dict]:
    db_url, drop = fresh_db(backend, tmp)
    reader = read_token(db_url)
    proc, url = start_server(db_url, tmp, PARETOPLAN_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT))
    rows = []
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            for name, attack in attacks(url, reader):
                t = time.perf_counter()
                try:
                    status = attack(c)
                except httpx.HTTPError as e:
                    status = f"connection closed ({type(e).__name__})"  # type: ignore[assignment]
                took = time.perf_counter() - t
                after = c.get("/api/jobs", headers=USER).status_code
                rows.append({"backend": backend, "attack": name, "status": status, "seconds": took, "after": after})
                print(f"{backend}: {name}: {status} in {took:.2f} s; then GET /api/jobs {after}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        drop()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=None, help="sqlite,postgresql (default: sqlite, and postgresql if reachable)")
    args = p.parse_args()
    backends = args.backends.split(",") if args.backends else ["sqlite"] + (["postgresql"] if pg_reachable() else [])
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="paretoplan-hostile-") as tmp:
        for b in backends:
            rows += run_backend(b, Path(tmp))
    names = list(dict.fromkeys(r["attack"] for r in rows))
    print("| hostile input | " + " | ".join(f"{b}: answer (s)" for b in backends) + " | serving after |")
    print("|---|" + "---:|" * len(backends) + "---|")
    for name in names:
        cells = []
        ok = True
        for b in backends:
            r = next(x for x in rows if x["attack"] == name and x["backend"] == b)
            status = "closed" if r["status"] == 0 else r["status"]
            cells.append(f"{status} ({r['seconds']:.2f})")
            ok = ok and r["after"] == 200
        print(f"| {name} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
