"""A worker's search runs in a child under a deadline and a memory limit, and each task's
temporary files go when it ends (issue 20: no limit bounded a search; runs left temporary
directories behind)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from search import InputError, SearchRequest, run_search
from worker.bounded import LimitExceeded, Limits, bounded_search, task_tmpdir

TINY = SearchRequest(model="gpt2-tiny", device="cpu", devices=2)


def test_a_bounded_search_is_the_search_and_relays_its_progress():
    seen: list[str] = []
    report = bounded_search(TINY, lambda stage, fraction, message=None: seen.append(stage), Limits())
    direct = run_search(TINY).report
    assert [p.plan for p in report.frontier] == [p.plan for p in direct.frontier]
    assert "search" in seen or len(seen) > 1


def test_a_search_past_its_deadline_is_killed_and_says_so():
    with pytest.raises(LimitExceeded, match="time limit"):
        bounded_search(TINY, lambda *a, **k: None, Limits(search_seconds=0.001))


def test_a_search_past_its_memory_is_stopped_and_says_so():
    """In a fresh process, as a worker is: the limit counts memory beyond the parent's own, and a
    test process full of freed memory from earlier tests would lend the child room to search in."""
    code = ("from search import SearchRequest\n"
            "from worker.bounded import Limits, LimitExceeded, bounded_search\n"
            "try:\n"
            "    bounded_search(SearchRequest(model='gpt2', devices=8), lambda *a, **k: None,\n"
            "                   Limits(search_memory_bytes=1024 * 1024))\n"
            "except LimitExceeded as e:\n"
            "    print('LimitExceeded:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert "LimitExceeded:" in out.stdout and "memory limit of 1 MiB" in out.stdout, out.stdout + out.stderr


def test_an_input_error_of_the_search_stays_one():
    bad = SearchRequest(model="gpt2-tiny", device="cpu", devices=2, global_batch=3)
    with pytest.raises(InputError) as e:
        bounded_search(bad, lambda *a, **k: None, Limits())
    assert not isinstance(e.value, LimitExceeded)


def test_a_failing_progress_callback_kills_the_child():
    class LeaseGone(Exception):
        pass

    def progress(*_a, **_k):
        raise LeaseGone

    with pytest.raises(LeaseGone):
        bounded_search(TINY, progress, Limits())


def test_a_tasks_temporary_files_are_removed_however_it_ends():
    before = os.environ.get("TMPDIR")
    with pytest.raises(RuntimeError), task_tmpdir("paretoplan-test-") as where:
        made = Path(tempfile.mkdtemp(prefix="paretoplan-run-"))
        assert made.parent == Path(where) and os.environ["TMPDIR"] == where
        (made / "torchrun.log").write_text("a failed launch keeps its log here")
        raise RuntimeError("the launch failed")
    assert not Path(where).exists()
    assert os.environ.get("TMPDIR") == before



@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_killed_mid_search_leaves_no_search_behind():
    """SIGKILL runs no finally: the search child must die with its parent, not compute on
    orphaned (it used to, blocked forever on a pipe whose reading end it held itself)."""
    import signal
    import time

    from worker.launch import _alive, _children  # the launcher's own /proc readers

    script = ("from search import SearchRequest\nfrom worker.bounded import Limits, bounded_search\n"
              "bounded_search(SearchRequest(model='gpt3-175b', device='a100-80gb', devices=1024), "
              "lambda *a, **k: None, Limits(search_seconds=600))\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    kids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not kids and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            kids = _children().get(parent.pid, [])
        assert kids, "the search child never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(k) for k in kids), f"search child {kids} outlived its killed parent"
    finally:
        for k in {*kids, *_children().get(parent.pid, []), parent.pid}:  # a failure leaves nothing behind either
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
