"""Collective timing: all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and send/recv over each
group size a mesh axis uses, for a sweep of message sizes, with torch.distributed (gloo between
CPU processes, NCCL between GPUs), fitted to alpha + beta * bytes.

One process per device is spawned (torch.multiprocessing) and joined over a free local port. For
a group size g the world is split into world/g groups of consecutive ranks that run the
collective *at the same time*, as every group along a mesh axis does in training (on a CPU host
the groups share the cores, which a lone group would not see). Each repeat starts after a
barrier; its time is the slowest rank's, and the median over repeats is kept.

Byte counts follow the cost model (search/prices/costmodel.py): the tensor as if unsharded on the axis.
all_reduce: the tensor each rank holds; all_gather: the gathered output; reduce_scatter: the
input; all_to_all: the whole tensor, each rank holding 1/g of it; broadcast: the message; send_recv:
the message (timed as half a ping-pong between rank pairs).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from search import InputError
from search.prices.profile import COLLECTIVE_KINDS, CollectiveFit

DEFAULT_SIZES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB
PROCESSES_PER_CORE = 4  # gloo ranks this machine will host per CPU core (the held-out bench runs 4 on 2 cores)


class CollectiveBenchmarkError(RuntimeError):
    """A rank of the benchmark failed (not the user's input)."""


def host_capacity(backend: str) -> int:
    """How many ranks this machine can host: one per GPU for NCCL; for gloo on CPU a few per
    core (more would time the scheduler, not the collective)."""
    if backend == "nccl":
        import torch

        return torch.cuda.device_count()
    return PROCESSES_PER_CORE * (os.cpu_count() or 1)


def check_capacity(devices: int, backend: str) -> None:
    cap = host_capacity(backend)
    if devices > cap:
        what = "GPUs" if backend == "nccl" else f"gloo processes ({PROCESSES_PER_CORE} per CPU core)"
        raise InputError(f"--devices {devices}: this machine can host at most {cap} {what} for the "
                         f"collective benchmark; profile on a machine with {devices} devices, or ask for fewer")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile_collectives(world: int, group_sizes: list[int], sizes: tuple[int, ...] = DEFAULT_SIZES,
                        repeats: int = 5, backend: str = "gloo", kinds: tuple[str, ...] = COLLECTIVE_KINDS,
                        timeout_s: float = 600.0) -> tuple[list[CollectiveFit], float]:
    """Fits per (kind, group size) from `world` spawned ranks, and the seconds it took."""
    from profiler.fit import collective_fit

    groups = sorted({g for g in group_sizes if 2 <= g <= world and world % g == 0})
    if world < 2 or not (groups or "send_recv" in kinds):
        return [], 0.0
    check_capacity(world, backend)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="paretoplan-coll-") as tmp:
        out = Path(tmp) / "result.json"
        spec = {"backend": backend, "groups": groups, "sizes": list(sizes), "repeats": repeats,
                "kinds": list(kinds), "out": str(out), "timeout_s": timeout_s}
        _spawn(world, spec)
        rows = json.loads(out.read_text())
    fits = []
    by_key: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for kind, g, nbytes, t in rows:
        by_key.setdefault((kind, g), []).append((nbytes, t))
    for (kind, g), pts in sorted(by_key.items()):
        pts.sort()
        fits.append(collective_fit(kind, g, [p[0] for p in pts], [p[1] for p in pts]))
    return fits, time.perf_counter() - start


def _spawn(world: int, spec: dict) -> None:
    """Start `world` rank processes (`python -m profiler.collectives`, so nothing depends on how
    the caller's own __main__ was started) and wait for all; a failing rank stops the others."""
    import subprocess
    import sys

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    spec_path = Path(spec["out"]).with_name("spec.json")
    spec_path.write_text(json.dumps(spec))
    procs = [subprocess.Popen([sys.executable, "-m", "profiler.collectives", str(r), str(world), str(port),
                               str(spec_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    deadline = time.monotonic() + spec["timeout_s"] + 60
    failed: str | None = None
    try:
        while any(p.poll() is None for p in procs):
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                err = [ln for ln in (p.stderr.read() if p.stderr else "").strip().splitlines() if ln.strip()]
                failed = f"rank {r} exited with {p.returncode}: {err[-1] if err else 'no message'}"
                break
        else:
            if any(p.poll() is None for p in procs):
                failed = f"timed out after {spec['timeout_s']:.0f} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stderr:
                p.stderr.close()
    if failed:
        raise CollectiveBenchmarkError(f"collective benchmark failed: {failed}")


# ---- inside each rank ----------------------------------------------------------------------------
def _rank_main(rank: int, world: int, port: int, spec: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = spec["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=spec["timeout_s"]))
    try:
        rows = []
        kinds = [k for k in spec["kinds"] if k != "send_recv"]
        for g in spec["groups"]:
            group = dist.new_subgroups(group_size=g)[0] if g < world else dist.group.WORLD
            for kind in kinds:
                for nbytes in spec["sizes"]:
                    x, t = _time_collective(kind, nbytes, g, group, dev, spec["repeats"])
                    rows.append((kind, g, x, t))
        if "send_recv" in spec["kinds"] and world >= 2:
            for nbytes in spec["sizes"]:
                x, t = _time_collective("send_recv", nbytes, 2, None, dev, spec["repeats"])
                rows.append(("send_recv", 2, x, t))
        dist.barrier()
        if rank == 0:
            Path(spec["out"]).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def _time_collective(kind: str, nbytes: int, g: int, group, dev, repeats: int) -> tuple[float, float]:
    """(bytes in the cost model's convention, median seconds of the slowest rank)."""
    import torch
    import torch.distributed as dist

    unit = g * g  # all_to_all needs each rank's share divisible by g
    numel = max(unit, (nbytes // 4) // unit * unit)
    rank = dist.get_rank()
    world = dist.get_world_size()
    ones = lambda n: torch.ones(n, device=dev)  # noqa: E731
    if kind == "all_reduce":
        buf = ones(numel)
        run = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif kind == "all_gather":
        inp, out = ones(numel // g), torch.empty(numel, device=dev)
        run = lambda: dist.all_gather_single(out, inp, group=group)  # noqa: E731
    elif kind == "reduce_scatter":
        inp, out = ones(numel), torch.empty(numel // g, device=dev)
        run = lambda: dist.reduce_scatter_single(out, inp, group=group)  # noqa: E731
    elif kind == "all_to_all":
        inp, out = ones(numel // g), torch.empty(numel // g, device=dev)
        run = lambda: dist.all_to_all_single(out, inp, group=group)  # noqa: E731
    elif kind == "broadcast":  # from the group's first rank, as ZeroRedundancyOptimizer's owners do
        buf = ones(numel)
        src = dist.get_global_rank(group, 0) if group is not None else 0
        run = lambda: dist.broadcast(buf, src=src, group=group)  # noqa: E731
    elif kind == "send_recv":
        buf = ones(numel)
        peer = rank ^ 1
        active = peer < world

        def run() -> None:  # one ping-pong between pairs (0,1), (2,3), ...
            if not active:
                return
            if rank % 2 == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
    else:
        raise ValueError(f"unknown collective {kind!r}")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    run()  # warm-up: connections and buffers set up
    sync()
    # back-to-back calls per repeat, as many as fill ~10 ms (the same count on every rank), so
    # that the ranks' start skew after a barrier - milliseconds when processes share cores -
    # is spread over many calls instead of landing on one
    dist.barrier()
    t0 = time.perf_counter()
    run()
    sync()
    warm = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    calls = int(min(50, max(1, 0.01 // max(float(warm.item()), 1e-6))))
    times = []
    for _ in range(repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    slowest = torch.tensor(times, dtype=torch.float64, device=dev)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    s = sorted(slowest.cpu().tolist())
    med = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
    if kind == "send_recv":
        med /= 2.0
    return float(numel * 4), float(med)


if __name__ == "__main__":  # one rank, started by _spawn
    import sys

    _r, _w, _port, _spec = sys.argv[1:5]
    _rank_main(int(_r), int(_w), int(_port), json.loads(Path(_spec).read_text()))
