"""The per-rank training program that torchrun starts: ``python -m worker.executor --jobs J --out D``.

Every rank reads the same list of jobs (an ExecSpec and RunSettings each) and runs them one after
the other in the same process group, so several plans share one start-up. Per job a rank builds
the model on the meta device (only its pipeline stage), applies the plan (worker.parallelize),
materialises its shards from the seeded reference initialisation, trains on synthetic data and
records its step times and peak memory; the ranks gather their figures, each node's first rank
writes its node's into ``D/<job>/result.json`` (one node: all of them; worker.nodes joins the
nodes'), and rank 0 prints one progress line per step (``@@paretoplan {json}``) for the launcher.

A rank that raises writes ``D/error-rank<r>.json`` and exits non-zero; torchrun then stops the
others, and the launcher reports this rank's error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from worker import measure
from worker.analyze import model_spec
from worker.checkpoint import Checkpointer
from worker.commcheck import P2PCount
from worker.context import Ring, context_parallel
from worker.data import global_batch, local_batch
from worker.experts import expert_rows, shard_experts
from worker.lifeline import die_with_parent
from worker.nodes import COLLECTIVE_TIMEOUT_ENV
from worker.parallelize import (
    DTYPES,
    apply_data_parallel,
    apply_recompute,
    apply_tensor_parallel,
    canonical,
    make_optimizer,
    retie,
    wrap_ddp,
)
from worker.spec import PROGRESS, ExecSpec, Job
from worker.stages import Pipe, pipe_of
from worker.stale import TwoVersions


class InjectedFailure(RuntimeError):
    """Raised on purpose (RunSettings.fail_rank) to test that a crashing rank ends the run."""


# ---- model ------------------------------------------------------------------------------------
def reference_model(name: str, seed: int) -> nn.Module:
    """The single-process model every run starts from: built on the CPU under a fixed seed
    (the zoo initialises in __init__)."""
    torch.manual_seed(seed)
    return model_spec(name).build()


def materialize(module: nn.Module, name: str, seed: int, device: torch.device, ties: list[list[str]],
                rows: dict[str, tuple[int, int]] | None = None) -> None:
    """Allocate this rank's shards and fill them from the reference initialisation.

    DTensor's random initialisation is not offset-based on CPU, so initialising shards in place
    would not reproduce the single-process model; instead the host builds the reference once and
    ``set_model_state_dict`` (torch.distributed.checkpoint) copies each rank's shard of every
    parameter. The device only ever holds this rank's shards. `rows`: the rows of the reference's
    stacked expert weights each expert-parallel parameter holds (worker/experts.py)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    module.to_empty(device=device)
    retie(module, ties)
    reference = reference_model(name, seed)
    ref = reference.state_dict()
    wanted = module.state_dict().keys()
    rows = rows or {}
    full = {k: ref[canonical(k)] for k in wanted}
    for k in wanted:
        if canonical(k) in rows:
            first, end = rows[canonical(k)]
            full[k] = full[k][first:end]
    strided = _load_strided_shards(module, full)
    set_model_state_dict(module, {k: v for k, v in full.items() if k not in strided},
                         options=StateDictOptions(full_state_dict=True, strict=not strided))
    _copy_transient_buffers(module, reference)


def _load_strided_shards(module: nn.Module, full: dict[str, torch.Tensor]) -> set[str]:
    """Copy this rank's part of every parameter that FSDP shards along a dimension tensor
    parallelism already split (a _StridedShard placement), from `full`; the keys loaded.
    torch's distribute_tensor pads such a split and then asserts equal pieces, which an uneven one
    (ViT's classifier, 2 labels over tp2 x dp2) does not give; the local shape and offset DTensor
    computes for the rank are the same slice, without the padding."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    done: set[str] = set()
    with torch.no_grad():
        for k, v in module.state_dict().items():
            if not isinstance(v, DTensor) or not any(isinstance(p, _StridedShard) for p in v.placements):
                continue
            shape, offset = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
            part = full[k][tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
            v.to_local().copy_(part.to(dtype=v.dtype))
            done.add(k)
    return done


def _has_transient_buffers(module: nn.Module) -> bool:
    persistent = set(module.state_dict())
    return any(n not in persistent for n, _ in module.named_buffers())


@torch.no_grad()
def _copy_transient_buffers(module: nn.Module, reference: nn.Module) -> None:
    """Non-persistent buffers (rotary frequencies, Gemma's embedding scale) are in no state dict,
    and `to_empty` left them uninitialised: copy them from the reference by name (no parallel
    style distributes a buffer)."""
    ref = {canonical(n): b for n, b in reference.named_buffers()}
    persistent = {canonical(k) for k in module.state_dict()}
    for n, b in module.named_buffers():
        key = canonical(n)
        if key not in persistent and key in ref and ref[key].shape == b.shape:
            b.copy_(ref[key])


def _made(mesh: DeviceMesh | None) -> DeviceMesh:
    """The device mesh, which the Runner makes whenever the ExecSpec has a mesh dimension (every
    parallel role has one), so wherever a role is used."""
    assert mesh is not None, "the ExecSpec uses a mesh dimension but no device mesh was made"
    return mesh


def build(spec: ExecSpec, mesh: DeviceMesh | None, device: torch.device, seed: int, initialise: bool = True
          ) -> tuple[nn.Module, list[nn.Module], Any]:
    """The module this rank trains (the whole model, its pipeline stage, or a container of its
    interleaved chunks), the parts it runs (the model or its pipeline chunks, each parallelised
    and materialised on its own), and the pipeline schedule or None. `initialise` False: the
    shards are allocated but not filled (a checkpoint is loaded into them next: building the
    reference model would only be thrown away)."""
    zs = model_spec(spec.model, spec.source)
    with torch.device("meta"):
        model = zs.build()
    parts: list[nn.Module] = [model]
    pipe = spec.pipeline
    chunks: list[int] = []
    cut = None
    if pipe.stages > 1:
        chunks = pipe.chunks_of(_made(mesh).get_local_rank("pp"))
        cut = pipe_of(model, zs)  # analyze refuses a pipeline of a model without one
        last = pipe.stages * pipe.virtual_stages - 1
        parts = [cut.stage(pipe.stage_layers[c][0], pipe.stage_layers[c][1], c == 0, c == last) for c in chunks]
    for i, part in enumerate(parts):
        parts[i] = _parallelize(part, spec, mesh, device, seed, zs.blocks_attr, initialise)
    module: nn.Module = parts[0] if len(parts) == 1 else nn.ModuleList(parts)
    schedule = None
    if cut is not None:
        schedule = _schedule(parts, chunks, cut, spec, _made(mesh), device)
    return module, parts, schedule


def _meta_cut(spec: ExecSpec) -> Pipe:
    """The model's pipeline cut over a model of its own on the meta device (not the one whose
    modules this rank's stages hold: a stage built here takes its modules as its parent)."""
    zs = model_spec(spec.model, spec.source)
    with torch.device("meta"):
        model = zs.build()
    return pipe_of(model, zs)


def stage_inputs(spec: ExecSpec) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """What the first pipeline stage is fed from (inputs, targets)."""
    return _meta_cut(spec).first_args if spec.pipeline.stages > 1 else (lambda inputs, targets: (inputs,))


def stage_params(spec: ExecSpec) -> list[set[str]]:
    """Per pp rank, the parameter names its chunks hold (tied names each, as in the whole model)."""
    cut = _meta_cut(spec)
    pipe = spec.pipeline
    last = pipe.stages * pipe.virtual_stages - 1
    out: list[set[str]] = [set() for _ in range(pipe.stages)]
    for c, (a, b) in enumerate(pipe.stage_layers):
        stage = cut.stage(a, b, c == 0, c == last)
        out[c % pipe.stages] |= {n for n, _ in stage.named_parameters(remove_duplicate=False)}
    return out


def _parallelize(module: nn.Module, spec: ExecSpec, mesh: DeviceMesh | None, device: torch.device, seed: int,
                 blocks_attr: str | None, initialise: bool) -> nn.Module:
    """One part (the model or a pipeline chunk) with the plan applied and its shards materialised."""
    if spec.dim("tensor"):  # one tensor dimension, or two (2-D tensor parallelism)
        tp = spec.names("tensor")
        apply_tensor_parallel(module, spec, _made(mesh)[tp if len(tp) > 1 else tp[0]])
    experts: list[str] = []
    if spec.dim("expert"):
        ep = _made(mesh)["ep"]
        experts = shard_experts(module, ep.get_group(), ep.get_local_rank(), ep.size())
    rows = expert_rows(module)
    apply_recompute(module, spec.recompute)
    prefixes = [blocks_attr] if blocks_attr else []
    if spec.dim("context"):  # parameters replicated over the context ranks too: one data group
        group = _made(mesh)["dp", "cp"]._flatten("dp_cp") if spec.dim("data") else _made(mesh)["cp"]
        apply_data_parallel(module, spec, group, prefixes)
    elif spec.dim("data") and spec.dim("expert"):
        apply_data_parallel(module, spec, _made(mesh)["dp", "ep"]._flatten("dp_ep"), prefixes, experts,
                            _made(mesh)["dp"])
    elif spec.dim("data") or spec.dim("expert"):
        dim = "dp" if spec.dim("data") else "ep"
        apply_data_parallel(module, spec, _made(mesh)[dim], prefixes, experts, None)
    if initialise:
        materialize(module, spec.model, seed, device, spec.ties, rows)
    else:
        module.to_empty(device=device)
        retie(module, spec.ties)
        if _has_transient_buffers(module):  # a checkpoint holds no non-persistent buffer: rebuild them
            _copy_transient_buffers(module, reference_model(spec.model, seed))
    reduce_partial_grads(module)
    if spec.dim("data"):
        module = wrap_ddp(module, spec, _made(mesh).get_group("dp"))
    return module


def reduce_partial_grads(module: nn.Module) -> None:
    """A parameter replicated on the tensor axis but used on split activations (a
    sequence-parallel norm) gets a Partial gradient from DTensor. Left so, every optimizer op
    that reads it would all-reduce it again (AdamW reads it three times); redistribute it once,
    when it is accumulated, as the cost model prices it (one all-reduce per such parameter)."""
    def hook(p: torch.Tensor) -> None:
        if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)

    for p in module.parameters():
        if isinstance(p, DTensor) and p.requires_grad and not any(pl.is_shard() for pl in p.placements):
            p.register_post_accumulate_grad_hook(hook)


def _schedule(parts: list[nn.Module], chunks: list[int], cut: Pipe, spec: ExecSpec, mesh: DeviceMesh,
              device: torch.device):
    """torch.distributed.pipelining's schedule over this rank's stages: one per chunk it runs
    (several under interleaved 1F1B). 2BW runs in 1F1B's order; its 1-stale weights are the
    Runner's (TwoVersions)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    from torch.distributed.pipelining.stage import _PipelineStageBase

    pipe = spec.pipeline
    n = pipe.stages * pipe.virtual_stages
    stages: list[_PipelineStageBase] = [PipelineStage(part, c, n, device, group=mesh.get_group("pp"))
                                        for part, c in zip(parts, chunks, strict=True)]
    # scale_grads: the gradient of the mean over micro-batches, as the single-process loss
    if pipe.virtual_stages > 1:
        return ScheduleInterleaved1F1B(stages, n_microbatches=pipe.micro_batches, loss_fn=cut.loss, scale_grads=True)
    cls: type[ScheduleGPipe | Schedule1F1B] = ScheduleGPipe if pipe.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=pipe.micro_batches, loss_fn=cut.loss, scale_grads=True)


# ---- one job ----------------------------------------------------------------------------------
class Runner:
    def __init__(self, job: Job, device: torch.device) -> None:
        self.spec, self.st = job.spec, job.settings
        self.device = device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        spec = self.spec
        if spec.num_devices != self.world:
            raise RuntimeError(f"plan needs {spec.num_devices} processes, the group has {self.world}")
        self.mesh = init_device_mesh(device.type, tuple(d.size for d in spec.mesh),
                                     mesh_dim_names=tuple(d.name for d in spec.mesh)) if spec.mesh else None
        coord = {d.name: self.mesh.get_local_rank(d.name) for d in spec.mesh} if self.mesh else {}
        self.coord = coord
        # the batch splits over data x expert, data outermost (the plan's Shard over both)
        self.data_index = coord.get("dp", 0) * spec.size("expert") + coord.get("ep", 0)
        self.data_count = spec.size("data") * spec.size("expert")
        self.n_stages = spec.pipeline.stages
        self.stage = coord.get("pp", 0)
        self.is_last = self.stage == self.n_stages - 1
        # the rank whose loss stands for its data shard: last stage, first of its tensor/replica group
        self.reporter = self.is_last and coord.get("tp", 0) == coord.get("tp2", 0) == coord.get("rep", 0) == 0
        self.zs = model_spec(spec.model, spec.source)
        resuming = self.st.checkpoint is not None and self.st.checkpoint.resume is not None
        self.module, self.parts, self.schedule = build(spec, self.mesh, device, self.st.seed, initialise=not resuming)
        dp_group = _made(self.mesh).get_group("dp") if spec.dim("data") else None
        # PipeDream-2BW: the passes read the weights of one update ago, the optimizer updates the newest
        self.versions = TwoVersions(list(self.module.parameters())) if spec.pipeline.schedule == "2bw" else None
        self.opt = make_optimizer(self.module, spec, self.st.lr, dp_group,
                                  self.versions.parameters() if self.versions else None)
        self.tie_groups = self._tie_groups()
        # what the first stage is fed (an encoder-decoder's decoder reads the shifted targets too)
        self.first_args = stage_inputs(spec)
        # FSDP2's fully_shard/replicate cast parameters themselves (MixedPrecisionPolicy); elsewhere autocast
        self.autocast = spec.precision != "fp32" and spec.data_parallel in ("none", "zero1")
        self.scaler = torch.amp.GradScaler(device.type) if spec.precision == "fp16" else None
        # the context group's ring: this rank's share of each sequence, and the ring attention over it
        self.ring = None
        if spec.dim("context"):
            cp = _made(self.mesh)["cp"]
            assert spec.seq_len is not None  # analyze refuses a context axis without a sequence
            self.ring = Ring(cp.get_group(), cp.get_local_rank(), cp.size(), spec.seq_len)

    def _tie_groups(self) -> list[tuple[Any, list[nn.Parameter]]]:
        """Tied parameters split across pipeline stages (GPT's embedding and head on the first and
        last; T5's on the first and on the one holding the decoder's embedding) are a copy per
        stage; their gradients are summed over a group of those stages, as Megatron-LM does
        (torch.distributed.pipelining has no tied-weight support). Per group, this rank's copies:
        one per chunk holding it (interleaved 1F1B gives a rank several chunks, each parallelised
        on its own), and the process group of the ranks holding it that share every other
        coordinate (None when this rank's chunks are its only holders)."""
        if self.n_stages == 1 or not self.spec.ties:
            return []
        out: list[tuple[Any, list[nn.Parameter]]] = []
        mesh = _made(self.mesh).mesh  # rank numbers by coordinate
        others = mesh.shape[1:]
        held = stage_params(self.spec)
        for group in self.spec.ties:
            holders = [s for s in range(self.n_stages) if held[s] & set(group)]
            for idx in torch.cartesian_prod(*[torch.arange(s) for s in others]).reshape(-1, len(others)) if others else [()]:
                idx = tuple(int(i) for i in idx)
                ranks = sorted({int(mesh[(s, *idx)]) for s in holders})
                pg = dist.new_group(ranks) if len(ranks) > 1 else None  # every rank makes every group
                if self.rank in ranks:
                    copies = list({id(p): p for part in self.parts for n, p in part.named_parameters()
                                   if canonical(n) in group}.values())
                    if pg is not None or len(copies) > 1:
                        out.append((pg, copies))
        return out

    def _sum_tied_grads(self) -> None:
        """Give every copy of a tied parameter the sum of all copies' gradients: this rank's
        summed locally, then one all-reduce over the group's ranks, the same call with the same
        shape on each. The gradient is first placed as its parameter: DTensor gives a
        vocabulary-parallel embedding (weight Shard(0), ids replicated) a Replicate() gradient of
        the whole table, while the head on the last stage has a Shard(0) one; all-reducing their
        local tensors mismatched in size (the whole table against a shard). A copy that got no
        gradient joins with zeros, so that every rank of the group calls the collective."""
        for pg, copies in self.tie_groups:
            local = []
            for p in copies:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                elif isinstance(p.grad, DTensor) and isinstance(p, DTensor) and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
                local.append(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)
            total = local[0].contiguous() if len(local) == 1 else torch.stack(local).sum(0)  # gloo: contiguous
            if pg is not None:
                dist.all_reduce(total, group=pg)
            for g in local:
                if g is not total:
                    g.copy_(total)

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        full = global_batch(self.zs, step, self.spec.global_batch, self.spec.seq_len, self.st.seed)
        mine = local_batch(full, self.data_index, self.data_count, self.device)
        if self.ring is not None:  # token ids and targets [batch, seq]: the positions this rank holds
            pos = self.ring.positions[self.ring.rank].to(self.device)
            mine = tuple(t.index_select(1, pos) for t in mine)
        return mine

    def step(self, step: int) -> torch.Tensor | None:
        inputs, targets = self.batch(step)
        accumulate = self.schedule is None and self.spec.pipeline.micro_batches > 1
        # gradient accumulation enters autocast once per micro-batch (_accumulate)
        ctx = self._autocast() if not accumulate else contextlib.nullcontext()
        # forward and backward (and a recomputed layer's forward inside it) under ring attention
        ring = context_parallel(self.ring) if self.ring is not None else contextlib.nullcontext()
        loss = None
        with ctx, ring:
            if accumulate:
                loss = self._accumulate(inputs, targets)
            elif self.schedule is None:
                loss = self.module(inputs, targets)
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            elif self.stage == 0:  # the first chunk's rank feeds the inputs, the last chunk's the targets
                self.schedule.step(*self.first_args(inputs, targets))
            elif self.is_last:
                losses: list[torch.Tensor] = []
                self.schedule.step(target=targets, losses=losses)
                loss = torch.stack([x.detach() for x in losses]).mean()
            else:
                self.schedule.step()
        self._sum_tied_grads()
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        elif self.versions is not None:
            self.versions.step(self.opt)
        else:
            self.opt.step()
        # gradients are freed at the end of a step rather than the start, so that a step begins
        # from parameters and optimizer state only (what the profiler's memory events can see:
        # frees of blocks allocated before profiling started are not reported)
        self.opt.zero_grad(set_to_none=True)
        return loss.detach() if loss is not None else None

    def _autocast(self) -> contextlib.AbstractContextManager:
        return (torch.autocast(self.device.type, dtype=DTYPES[self.spec.precision]) if self.autocast
                else contextlib.nullcontext())

    def _accumulate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Gradient accumulation: the rank's batch as m equal micro-batches, each loss scaled by
        1/m so the summed gradients are the whole batch's mean, as the single process computes it.
        Data-parallel synchronisation as the cost model prices it: DDP (ZeRO-1) and replicate
        (ZeRO-0) all-reduce once, after the last micro-batch; FSDP (ZeRO-2/3) reduce-scatters
        every micro-batch, so gradients stay sharded; a tensor axis's partial gradients are
        reduced as each backward accumulates them (reduce_partial_grads)."""
        m = self.spec.pipeline.micro_batches
        once = self.spec.data_parallel in ("ddp", "zero1")
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m), strict=True)):
            last = i == m - 1
            sync: Any = contextlib.nullcontext()
            module: Any = self.module  # DDP or an FSDP2-based replicate, told apart by what they offer
            if once and not last and hasattr(module, "no_sync"):  # DDP
                sync = module.no_sync()
            elif once and hasattr(module, "set_requires_gradient_sync"):  # replicate
                module.set_requires_gradient_sync(last)
            # autocast per micro-batch: its weight cache (the bf16 copies) is rebuilt each time.
            # One autocast over all micro-batches kept the first micro-batch's cast nodes, which
            # autograd ran last in every later backward (lowest sequence numbers): each weight's
            # bf16 gradient waited to the backward's end, 2 bytes per parameter more at the peak
            # (+675 MiB, +9.5% on gpt2-medium with 2 micro-batches, bench/memory_accuracy.py)
            with sync, self._autocast():
                loss = self.module(x, y) / m
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        return total

    def global_loss(self, loss: torch.Tensor | None) -> float:
        """Mean of the data shards' losses (the single-process loss when shards are equal)."""
        t = torch.zeros(2, dtype=torch.float64)
        if self.reporter and loss is not None:
            t[0] = float(loss.float().item())
            t[1] = 1.0
        dist.all_reduce(t)
        return float(t[0] / t[1]) if t[1] else float("nan")

    def checkpointer(self) -> Checkpointer | None:
        ck = self.st.checkpoint
        if ck is None:
            return None
        return Checkpointer(ck, self.module, self.opt, rank=self.rank, world=self.world, seed=self.st.seed,
                            steps=self.st.steps, plan=self.spec.plan, ties=self.spec.ties, device=self.device)

    def run(self, out_dir: Path) -> None:
        """Train steps [first, end): from step 0, or from the checkpoint it resumes, to the last
        step, or to a stop (a scripted resize, a stop file, SIGTERM) where it saves first."""
        st = self.st
        n = st.steps
        saver = self.checkpointer()
        first = saver.resume() if saver else 0
        end = min(st.checkpoint.stop_at or n, n) if st.checkpoint else n
        mem_step = (end - 1 if (st.measure_memory and self.device.type == "cpu" and end - first - st.warmup >= 2)
                    else None)
        times: list[float] = []
        losses: list[float] = []
        mem: dict = {}
        comm: dict = {}
        # a pipeline's sends and receives, counted on its second step (the first also infers shapes)
        p2p = P2PCount()
        p2p_step = first + 1 if st.comm_debug and self.schedule is not None and end - first >= 2 else None
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if saver:
            saver.install()
        dist.barrier()
        for s in range(first, end):
            if st.fail_rank == self.rank and s == st.fail_step:
                raise InjectedFailure(f"injected failure on rank {self.rank} at step {s}")
            if saver:
                saver.before_step(s)
            if s == first + st.warmup and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            ctx: Any = contextlib.nullcontext()
            if s == p2p_step:
                ctx = p2p
            elif s == first and st.comm_debug and self.schedule is None:
                # (not under a pipeline schedule: its backward runs autograd.grad, which the
                # tracker's module hooks do not support)
                ctx = comm_debug_mode()
            elif s == mem_step:
                # MemTracker refuses a module that runs more than once per step (micro-batches)
                ctx = (measure.cpu_peak(self.module, self.opt, mem)
                       if self.schedule is None and self.spec.pipeline.micro_batches == 1
                       and self.st.memory_method == "memtracker" else measure.profiler_peak(mem))
            t0 = time.perf_counter()
            with ctx:
                loss = self.step(s)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(time.perf_counter() - t0)
            if s == first and st.comm_debug and self.schedule is None:
                comm = comm_counts(ctx)
            losses.append(self.global_loss(loss))
            if self.rank == 0:
                print(PROGRESS + json.dumps({"step": s, "steps": n, "loss": losses[-1], "time_s": times[-1]}), flush=True)
            if saver and saver.after_step(s, losses, times, first, end):
                break
        if saver:
            saver.uninstall()
        ran = len(times)
        timed = [i for i in range(st.warmup, ran) if first + i != mem_step] or [ran - 1]
        peak = (int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda"
                else mem.get("peak_bytes"))
        mine = {"rank": self.rank, "node": node_of_this_rank()[0], "coord": self.coord, "times": times, "timed": timed,
                "time_s": measure.median([times[i] for i in timed]), "memory_bytes": peak,
                "memory_by_category": mem.get("by_category", {}), "comm": comm,
                "checkpoints": saver.record if saver else None,
                "p2p": dict(p2p.counts) if p2p_step is not None else {}}
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, mine)
        node, host = node_of_this_rank()
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # each node writes its own ranks' figures (worker.nodes)
            own = [g for g in gathered if g["node"] == node]
            out_dir.mkdir(parents=True, exist_ok=True)
            stopped = saver.record.get("stopped") if saver else None
            (out_dir / "result.json").write_text(json.dumps({
                "losses": losses, "first_step": first, "stopped": stopped, "ranks": own,
                "nodes": [{"node_rank": node, "host": host, "ranks": [g["rank"] for g in own]}]}))


def die_with_agent() -> None:
    """SIGKILL this rank when its torchrun agent dies: a node whose agent is gone must not go on
    training (or hold its peers on other nodes at a barrier); its peers' collectives then fail at
    once on the closed connections."""
    die_with_parent(signal.SIGKILL)


def node_of_this_rank() -> tuple[int, str]:
    """torchrun's node (group) rank of this process, and its host's name."""
    return int(os.environ.get("GROUP_RANK", "0")), socket.gethostname()


def collective_timeout() -> timedelta | None:
    """How long one collective may wait for its peers: set for runs that span nodes (a node that
    dies must stop the others within a bound), torch's default otherwise."""
    text = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    return timedelta(seconds=float(text)) if text else None


def comm_debug_mode() -> Any:
    """A CommDebugMode whose module tracker survives a module called more than once per forward
    (an LSTM's recurrent GEMM, once per time step). torch 2.13's tracker registers a fresh
    "module finished" forward hook on every call and never removes the earlier ones, so the
    second call pops its parent stack twice and raises IndexError; keeping one hook per module
    (dropping the previous call's before the tracker registers its own) counts the same."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import _CommModeModuleTracker

    class _OneHookPerModule(_CommModeModuleTracker):
        def _fw_pre_hook(self, mod: nn.Module, input: Any) -> None:
            old = self.register_forward_hook_handles.pop(self._get_mod_name(mod), None)
            if old is not None:
                old.remove()
            super()._fw_pre_hook(mod, input)

    mode = CommDebugMode()
    mode.advanced_module_tracker = _OneHookPerModule()
    return mode


def comm_counts(mode) -> dict[str, dict[str, dict[str, int]]]:
    """CommDebugMode's per-module collective counts: {module FQN: {phase: {kind: count}}}, FQNs
    as in the model (the tracker prefixes the root's class name; checkpoint_wrapper adds a level)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for name, phases in mode.comm_module_counts.items():
        if name == "Global":
            key = "Global"
        else:
            key = canonical(name.partition(".")[2] + ".").rstrip(".")  # 'GPT.blocks.0' -> 'blocks.0'
        mine: dict[str, dict[str, int]] = {}
        for phase, counts in phases.items():
            for op, c in counts.items():
                d = mine.setdefault(phase, {})
                kind = collective_kind(str(op))
                d[kind] = d.get(kind, 0) + int(c)
        # a checkpoint wrapper and the module it wraps are one FQN here and each count the same
        # collectives: adding them up would double a recomputed layer's
        for phase, kinds in mine.items():
            d = out.setdefault(key, {}).setdefault(phase, {})
            for kind, c in kinds.items():
                d[kind] = max(d.get(kind, 0), c)
    return out


def collective_kind(op: str) -> str:
    for k in ("all_gather", "allgather", "reduce_scatter", "all_reduce", "allreduce", "all_to_all", "alltoall",
              "broadcast", "send", "recv"):
        if k in op:
            return {"allgather": "all_gather", "allreduce": "all_reduce", "alltoall": "all_to_all"}.get(k, k)
    return op


# ---- process ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="worker.executor")
    ap.add_argument("--jobs", required=True, help="JSON list of Job objects")
    ap.add_argument("--out", required=True, help="folder for results and error reports")
    args = ap.parse_args(argv)
    out = Path(args.out)
    rank = int(os.environ.get("RANK", "0"))
    die_with_agent()
    try:
        jobs = [Job.model_validate(j) for j in json.loads(Path(args.jobs).read_text())]
        device_type = jobs[0].settings.device if jobs else "cpu"
        if device_type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
            # NCCL moves the model's tensors; the run's own bookkeeping (the loss and step times
            # gathered across ranks, checkpoint stop flags, all_gather_object) lives in CPU
            # tensors, which NCCL refuses: one group with a backend per device type
            backend = "cpu:gloo,cuda:nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None,
                                timeout=collective_timeout())
        for i, job in enumerate(jobs):
            if rank == 0:
                print(PROGRESS + json.dumps({"job": i, "jobs": len(jobs), "summary": job.spec.summary}), flush=True)
            Runner(job, device).run(out / str(i))
            gc.collect()  # the previous job's model must not count in the next one's memory
            dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the launcher, then re-raised as exit 1
        out.mkdir(parents=True, exist_ok=True)
        (out / f"error-rank{rank}.json").write_text(json.dumps({
            "rank": rank, "type": type(e).__name__, "message": str(e), "time": time.time(),
            "traceback": traceback.format_exc()}))
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
