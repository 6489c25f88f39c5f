"""Limits on one task's work: a search runs in a child process with a memory limit and a deadline,
a run with a deadline, and every task in a temporary directory of its own that is removed after it.

The service bounds what a request may name (service/limits.py), but a request within those
bounds can still search for long (a large HF config on many devices). A worker that searched it
in its own process would be tied up as long as it took and could be killed by the kernel for its
memory; here the child is killed at the limit, and the task fails with a message saying which
limit it passed (final: the same request would pass it again).

    PARETOPLAN_SEARCH_MAX_SECONDS   a search's wall time (default 900)
    PARETOPLAN_SEARCH_MAX_MEMORY    memory a search may take beyond the worker's own (default 8GiB)
    PARETOPLAN_RUN_MAX_SECONDS      a run's wall time (default 86400)
    PARETOPLAN_RUN_MAX_MEMORY       a run's resident memory, all its ranks together (worker/memwatch.py)
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from search import FrontierReport, InputError, SearchRequest, run_search
from worker.lifeline import die_with_parent

GiB = 1024**3


class LimitExceeded(InputError):
    """A task passed one of its limits: final (retrying the same request passes it again)."""


@dataclass(frozen=True)
class Limits:
    search_seconds: float = 900.0
    search_memory_bytes: int = 8 * GiB
    run_seconds: float | None = 86400.0

    @classmethod
    def from_env(cls) -> Limits:
        from search.prices.cluster import parse_size

        env = os.environ
        try:
            return cls(search_seconds=float(env.get("PARETOPLAN_SEARCH_MAX_SECONDS", cls.search_seconds)),
                       search_memory_bytes=parse_size(env.get("PARETOPLAN_SEARCH_MAX_MEMORY", str(cls.search_memory_bytes))),
                       run_seconds=float(env.get("PARETOPLAN_RUN_MAX_SECONDS", 86400.0)))
        except ValueError as e:
            raise InputError(f"a worker limit (PARETOPLAN_SEARCH_MAX_*, PARETOPLAN_RUN_MAX_SECONDS) is not valid: {e}") \
                from None


Progress = Callable[..., None]


def _vm(field: str = "VmSize") -> int:
    """This process's virtual memory (what RLIMIT_AS counts; VmPeak: its most), from /proc; 0 where
    there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child(request: dict[str, Any], conn: Connection, parents_end: Connection, parent: int, memory: int) -> None:
    """The search, in the forked child: messages ("progress", stage, fraction, message),
    ("done", report JSON), ("input"|"memory"|"error", text)."""
    # the fork copied the parent's reading end too: closed here, the pipe has no reader once the
    # parent is gone, and a send fails instead of blocking on a full pipe forever
    parents_end.close()
    # a worker killed mid-search (SIGKILL, no finally) must not leave its search computing on
    die_with_parent(signal.SIGKILL, parent)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handlers are the parent's
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    cap = _vm() + memory
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

        def progress(stage: str, fraction: float, message: str | None = None) -> None:
            conn.send(("progress", stage, fraction, message))

        outcome = run_search(SearchRequest.model_validate(request), progress=progress)
        conn.send(("done", outcome.report.model_dump_json()))
    except InputError as e:
        conn.send(("input", str(e)))
    except MemoryError:
        conn.send(("memory", ""))
    except BaseException as e:  # noqa: BLE001 - whatever it was, the parent reports it
        try:
            # out of address space, CPython and its extensions fail in many ways (SystemError, an
            # ImportError that cannot map a library, OSError ENOMEM): a peak at the cap says why
            if _vm("VmPeak") >= cap - min(memory // 4, 64 * 2**20):
                conn.send(("memory", f"{type(e).__name__}: {e}"))
                return
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"))
        except BaseException:  # noqa: BLE001 - the pipe is gone: the exit code says it
            code = 1
    finally:
        conn.close()
        os._exit(code)  # no atexit handlers of the parent's (its HTTP client, its logging)


def _import_search_stack() -> None:
    import search.algorithm.ft  # noqa: F401
    import search.models.capture  # noqa: F401
    import search.models.zoo  # noqa: F401
    import search.plans.api  # noqa: F401


def bounded_search(req: SearchRequest, progress: Progress, limits: Limits) -> FrontierReport:
    """run_search(req) in a forked child under `limits`; its progress relayed to `progress` (which
    may raise, e.g. when the lease is lost: the child is killed then too)."""
    _import_search_stack()  # the child inherits it: its limit counts the search's memory, not torch's
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(req.model_dump(mode="json"), send, receive, os.getpid(),
                                             limits.search_memory_bytes),
                        daemon=True, name="paretoplan-search")
    child.start()
    send.close()
    deadline = time.monotonic() + limits.search_seconds
    memory = (f"{limits.search_memory_bytes / GiB:.1f} GiB" if limits.search_memory_bytes >= GiB
              else f"{limits.search_memory_bytes / 2**20:.0f} MiB")
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LimitExceeded(f"the search ran past its time limit of {limits.search_seconds:.0f} s "
                                    "(PARETOPLAN_SEARCH_MAX_SECONDS): ask for fewer devices or a smaller model")
            if not receive.poll(min(left, 1.0)):
                continue
            try:
                msg = receive.recv()
            except EOFError:
                child.join(5)
                raise LimitExceeded(f"the search process died (exit code {child.exitcode}), most likely past its memory "
                                    f"limit of {memory} (PARETOPLAN_SEARCH_MAX_MEMORY)") from None
            kind = msg[0]
            if kind == "progress":
                progress(msg[1], msg[2], msg[3])
            elif kind == "done":
                return FrontierReport.model_validate_json(msg[1])
            elif kind == "input":
                raise InputError(msg[1])
            elif kind == "memory":
                raise LimitExceeded(f"the search ran past its memory limit of {memory} (PARETOPLAN_SEARCH_MAX_MEMORY)")
            else:
                raise RuntimeError(f"the search failed: {msg[1]}")
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()


@contextmanager
def task_tmpdir(prefix: str) -> Iterator[str]:
    """Every temporary file and directory of one task (this process's and its children's: torchrun,
    the ranks) goes into one directory, removed when the task ends however it ends; a failed
    launch left its directory behind before."""
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as where:
        os.environ["TMPDIR"] = tempfile.tempdir = where
        try:
            yield where
        finally:
            tempfile.tempdir = saved_tempdir
            if saved_env is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_env
