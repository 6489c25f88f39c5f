"""Regenerates docs/dashboard.png, the README's screenshot: a real `paretoplan serve` (SQLite in a
temporary directory, one worker) searches gpt2-medium on 8 and 16 H100s, and Debian's Chromium
(`/usr/bin/chromium`, or PARETOPLAN_CHROMIUM) photographs the job with its fastest fitting plan open.

    python docs/make_screenshot.py [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
JOB = {"model": "gpt2-medium", "device": "h100-80gb", "devices": 8, "global_batch": 32, "device_counts": [16]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chromium() -> str:
    for candidate in (os.environ.get("PARETOPLAN_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("no Chromium: apt-get install -y chromium, or set PARETOPLAN_CHROMIUM")


def wait_done(client: httpx.Client, job_id: int, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        alternates_done = all(a["status"] == "done" for a in job["alternates"])
        if job["status"] == "done" and alternates_done:
            return job
        if job["status"] == "failed":
            sys.exit(f"the search failed: {job['error']}")
        time.sleep(0.5)
    sys.exit(f"job {job_id} not done after {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "dashboard.png")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen([sys.executable, "-m", "paretoplan", "serve", "--port", str(port),
                                   "--db", f"sqlite:///{tmp}/shot.db"], cwd=tmp)
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                for _ in range(240):
                    try:
                        if client.get("/api/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.25)
                job = client.post("/api/jobs", json=JOB).json()
                job = wait_done(client, job["id"])
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{url}/?job={job['id']}&point={job['picked_strategy_id']}")
                page.wait_for_selector("#chart .scatterlayer .point")
                # the form's zoo and catalog lists have loaded
                page.wait_for_function("document.querySelectorAll('#f-device option:not([disabled])').length > 0 && "
                                       "document.querySelectorAll('#f-model option:not([disabled])').length > 0")
                page.wait_for_selector("#panel:not([hidden]) #panel-summary")  # the plan opened beside the chart
                page.wait_for_timeout(1500)  # the chart settles at its new width and places its labels again
                page.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
