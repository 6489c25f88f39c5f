"""One profiling run: what the search will ask about a model on a cluster, measured on this
machine and merged into a DeviceProfile (on top of a base profile, whose measurements are kept
and not repeated).

The model, cluster and job are resolved exactly as a search resolves them (search.plans.api.resolve,
same defaults for the global batch and sequence length), so the signatures timed are the ones
the search will look up.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from profiler.collectives import DEFAULT_SIZES, check_capacity, profile_collectives
from search import DeviceSpec, InputError, get_device
from search.prices.mesh import mesh_candidates
from search.prices.profile import COLLECTIVE_KINDS, DeviceProfile, HostInfo, ProfiledModel


@dataclass
class Target:
    """Where the measurements are taken: a catalog device and how to drive it here."""

    spec: DeviceSpec
    backend: str        # "cpu" or "cuda"
    dist_backend: str   # "gloo" or "nccl"
    torch_device: str   # "cpu" or "cuda"


def detect_target(device: str | None) -> Target:
    """The device to profile: the one named (which must be at hand) or this machine's own -
    its CUDA GPU when there is one, else the CPU."""
    import torch

    cuda = torch.cuda.is_available()
    if device is None:
        if not cuda:
            return Target(get_device("cpu"), "cpu", "gloo", "cpu")
        name = torch.cuda.get_device_name(0)
        spec = _match_gpu(name)
        if spec is None:
            raise InputError(f"this machine's GPU {name!r} is not in the device catalog; name the catalog "
                             f"entry to record it as with --device (see `paretoplan devices`)")
        return Target(spec, "cuda", "nccl", "cuda")
    spec = get_device(device)  # unknown: InputError listing the catalog
    if spec.name == "cpu":
        return Target(spec, "cpu", "gloo", "cpu")
    if not cuda:
        raise InputError(f"cannot profile {spec.name!r} here: this machine has no CUDA device (run the "
                         f"profiler on the device itself, or profile this machine with --device cpu)")
    return Target(spec, "cuda", "nccl", "cuda")


def _match_gpu(name: str) -> DeviceSpec | None:
    from search import CATALOG

    low = name.lower().replace("-", " ")
    best = None
    for spec in CATALOG.values():
        if spec.name == "cpu":
            continue
        words = spec.name.split("-")
        if words[0] in low and all(w.replace("gb", "") in low for w in words[1:]):
            if best is None or len(spec.name) > len(best.name):
                best = spec
    return best


def default_threads(devices: int, target: Target) -> int:
    """Torch threads per rank as the worker runs ranks on a CPU host: the cores shared evenly."""
    if target.backend != "cpu":
        return 1
    return max(1, (os.cpu_count() or 1) // max(devices, 1))


def host_info(threads: int, target: Target) -> HostInfo:
    import torch

    acc = torch.cuda.get_device_name(0) if target.backend == "cuda" else None
    return HostInfo(hostname=socket.gethostname(), platform=platform.platform(), processor=_cpu_name(),
                    cpu_count=os.cpu_count() or 0, threads=threads, torch=torch.__version__, accelerator=acc)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


@dataclass
class Summary:
    model: str | None
    devices: int
    signatures: int = 0        # distinct op signatures the search will look up
    instances: int = 0         # (op, mesh, configuration) triples they stand for
    timed: int = 0
    reused: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    collective_fits: int = 0
    collectives_reused: int = 0
    optimizer_timed: bool = False
    op_seconds: float = 0.0
    collective_seconds: float = 0.0
    seconds: float = 0.0

    def line(self) -> str:
        parts = []
        if self.model:
            parts.append(f"{self.signatures} distinct op signatures (standing for {self.instances:,} op "
                         f"configurations): {self.timed} timed, {self.reused} reused from the base profile"
                         + (f", {len(self.failed)} left to the roofline" if self.failed else "")
                         + f" ({self.op_seconds:.1f} s)")
        parts.append(f"{self.collective_fits} collective fits measured, {self.collectives_reused} reused"
                     f" ({self.collective_seconds:.1f} s)")
        return "; ".join(parts) + f"; {self.seconds:.1f} s in all"


def run_profile(model: str | None, devices: int, device: str | None = None, devices_per_node: int | None = None,
                global_batch: int | None = None, seq_len: int | None = None, precision: str = "bf16",
                base: DeviceProfile | None = None, collectives_only: bool = False, repeats: int = 10,
                threads: int | None = None, sizes: tuple[int, ...] = DEFAULT_SIZES, collective_repeats: int = 5,
                budget_s: float = 0.2, progress: bool = True, pipelines: bool = True) -> tuple[DeviceProfile, Summary]:
    """Profile what a search of `model` on `devices` devices needs, on this machine (with
    `pipelines`, also the micro-batch shapes the pipeline search prices on stage sub-meshes)."""
    from profiler.ops import enumerate_signatures, pipeline_graphs, profile_ops, time_optimizer, torch_threads
    from search import SearchRequest, make_cluster, resolve

    start = time.perf_counter()
    if devices < 1:
        raise InputError(f"--devices must be at least 1, got {devices}")
    if repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {repeats}")
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}")
    if model is None and not collectives_only:
        raise InputError("give --model to profile its ops (or --collectives-only)")
    target = detect_target(device)
    if base is not None and base.device != target.spec.name:
        raise InputError(f"the base profile was measured on {base.device!r}, not {target.spec.name!r}")
    cluster = make_cluster(target.spec, devices, devices_per_node)
    group_sizes = sorted({ax.size for mesh in mesh_candidates(cluster) for ax in mesh.axes if ax.size > 1})
    have = {(f.kind, f.group_size) for f in base.collectives} if base is not None else set()
    need = [g for g in group_sizes if any((k, g) not in have for k in (*COLLECTIVE_KINDS[:4], "broadcast"))]
    need_p2p = devices >= 2 and ("send_recv", 2) not in have
    if need or need_p2p:
        check_capacity(devices, target.dist_backend)  # before anything long
    threads = threads if threads is not None else default_threads(devices, target)
    prof = base.model_copy(deep=True) if base is not None else DeviceProfile(
        device=target.spec.name, backend=target.backend, dist_backend=target.dist_backend)
    prof.host = host_info(threads, target)
    prof.created = datetime.now(UTC).isoformat(timespec="seconds")
    summary = Summary(model=None if collectives_only else model, devices=devices)

    if not collectives_only:
        req = SearchRequest(model=model, device=target.spec.name, devices=devices, devices_per_node=devices_per_node,
                            global_batch=global_batch, seq_len=seq_len, precision=precision)
        graph, cluster, job, _ = resolve(req)
        pipes = pipeline_graphs(graph, cluster, job) if pipelines else []
        sigs = enumerate_signatures(graph, cluster, job.precision, pipelines=pipes)
        res = profile_ops(sigs, job.precision, prof.ops, device=target.torch_device, repeats=repeats, threads=threads,
                          budget_s=budget_s, progress=progress)
        prof.ops.update(res.entries)
        summary.signatures, summary.instances = res.total, sigs.instances
        summary.timed, summary.reused, summary.failed = res.timed, res.reused, res.failed
        summary.op_seconds = res.seconds
        if job.precision not in prof.optimizer:
            prof.optimizer[job.precision] = time_optimizer(job.precision, target.torch_device, threads=threads)
            summary.optimizer_timed = True
        if prof.overheads is None and target.backend == "cpu":
            from profiler.overheads import time_overheads

            with torch_threads(threads):
                prof.overheads = time_overheads()
        prof.models = [m for m in prof.models if not (m.model == model and m.devices == devices
                                                      and m.devices_per_node == cluster.devices_per_node
                                                      and m.global_batch == job.global_batch
                                                      and m.seq_len == job.seq_len and m.precision == job.precision)]
        prof.models.append(ProfiledModel(model=model, devices=devices, devices_per_node=cluster.devices_per_node,
                                         global_batch=job.global_batch, seq_len=job.seq_len, precision=job.precision,
                                         signatures=res.total))

    if need or need_p2p:
        kinds = tuple(k for k in COLLECTIVE_KINDS if k != "send_recv") + (("send_recv",) if need_p2p else ())
        fits, secs = profile_collectives(devices, need, sizes=sizes, repeats=collective_repeats,
                                         backend=target.dist_backend, kinds=kinds)
        fresh = {(f.kind, f.group_size) for f in fits}
        prof.collectives = [f for f in prof.collectives if (f.kind, f.group_size) not in fresh] + fits
        summary.collective_fits, summary.collective_seconds = len(fits), secs
    summary.collectives_reused = (sum(1 for g in group_sizes for k in COLLECTIVE_KINDS[:4] if (k, g) in have)
                                  + (1 if devices >= 2 and not need_p2p else 0))
    summary.seconds = time.perf_counter() - start
    prof.seconds += summary.seconds
    return prof, summary
