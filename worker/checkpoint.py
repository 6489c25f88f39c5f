"""Checkpoints of a training run, saved and loaded by every rank with torch.distributed.checkpoint
(DCP), so that a run can stop, change its layout and go on from the same step.

What a checkpoint holds: the model and the optimizer as `get_state_dict` gives them (keyed by the
parameters' FQNs in the unwrapped model, the optimizer state flattened per parameter, each tensor
sharded as the plan shards it: FSDP2 and tensor-parallel DTensors, a pipeline stage's own
modules, ZeRO-1's partition of the optimizer), each rank's RNG state, and `meta.json`: the next
step to run (the data position: step s always trains on the synthetic batch of (seed, s)), the
losses and step times so far, the plan it was saved under and the launcher's history. Because
the keys are the unwrapped model's FQNs, any layout loads any other: DCP reads each rank's shard
of every tensor it asks for, whatever the saving layout's shards were; a pipeline stage asks for
its own modules only; a tied parameter that one layout keeps once and another twice (GPT's
embedding and head across pipeline stages) is read under whichever name was saved.

A checkpoint is a sub-directory `<tag>step-<k>` of the run directory; it is complete once its
`meta.json` exists (written last, atomically, by rank 0), and the launcher resumes from the
complete one with the highest step.

Stopping: a launch stops at a step boundary to save when it reaches `stop_at` (a scripted
resize), when its stop file appears (the launcher asks: a resize, SIGTERM to the launcher), or
when any rank gets SIGTERM; the ranks agree on it with one all-reduce per step, so they all save
after the same step. `PARETOPLAN_KILL_RANK_AT=RANK:STEP` makes that rank SIGKILL itself before
that step, once per run directory (a marker file says it happened), to test recovery.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel, Field
from torch import nn

from worker.spec import PROGRESS, CheckpointSettings, ExecSpec

FORMAT = "paretoplan.checkpoint/1"
META = "meta.json"
KILL_ENV = "PARETOPLAN_KILL_RANK_AT"
PREFIXES = ("model.", "optim.state.", "optim.param_groups.")


class CheckpointMeta(BaseModel):
    """What a checkpoint says about itself (its tensors are in the DCP files beside it)."""

    format: str = FORMAT
    step: int = Field(ge=0, description="the next step to run: the data position")
    seed: int
    world: int = Field(gt=0, description="processes that saved it")
    plan: dict[str, Any] = Field(description="the plan it was saved under")
    losses: list[float] = Field(description="the loss of every step before `step`")
    step_times_s: list[float] = Field(description="per step before `step`, the slowest rank's time")
    history: dict[str, Any] = Field(default_factory=dict, description="the launcher's record of the run")
    save_s: float = 0.0
    saved_at: float = Field(description="unix time the save finished")


# ---- the run directory ------------------------------------------------------------------------
def name(tag: str, step: int) -> str:
    return f"{tag}step-{step:07d}"


def read_meta(path: str | Path) -> CheckpointMeta:
    return CheckpointMeta.model_validate_json((Path(path) / META).read_text())


def complete(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run directory, oldest first (by step, then by save time)."""
    root = Path(run_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        try:
            meta = read_meta(d) if d.is_dir() and (d / META).is_file() else None
        except (OSError, ValueError):
            meta = None  # unreadable: not a checkpoint to resume from
        if meta is not None:
            found.append((meta.step, meta.saved_at, d))
    return [d for _, _, d in sorted(found)]


def annotate(path: str | Path, history: dict[str, Any]) -> None:
    """Replace the launcher's history stored with a checkpoint (the launcher moved on since it
    was saved: a resize picked the layout a resume from it must take)."""
    meta = read_meta(path).model_copy(update={"history": history})
    tmp = Path(path) / (META + ".tmp")
    tmp.write_text(meta.model_dump_json())
    tmp.replace(Path(path) / META)


def latest(run_dir: str | Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    done = complete(run_dir)
    return done[-1] if done else None


def prune(run_dir: str | Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints (and nothing incomplete: a launch may
    be writing it)."""
    for d in complete(run_dir)[:-keep]:
        shutil.rmtree(d, ignore_errors=True)


# ---- state dicts ------------------------------------------------------------------------------
def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # flattened optimizer state ("state.<fqn>.exp_avg"): one key per parameter, so that a layout
    # holding another subset of the parameters (a pipeline stage, a ZeRO-1 partition) reads its own
    return StateDictOptions(flatten_optimizer_state_dict=True)


def _local_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose state this rank holds: ZeRO-1's ZeroRedundancyOptimizer keeps its
    partition in an inner optimizer over this rank's parameters (its own state_dict needs a
    consolidation on one rank, which a sharded checkpoint does not want)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(opt, ZeroRedundancyOptimizer):
        inner = opt.optim
        assert isinstance(inner, torch.optim.Optimizer)
        return inner
    return opt


def state_dict(module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer as one flat dict: 'model.<fqn>' and 'optim.state.<fqn>.<name>' keys."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(module, _local_optimizer(opt), options=_options())
    return {**{f"model.{k}": v for k, v in msd.items()}, **{f"optim.{k}": v for k, v in osd.items()}}


def _set_state_dict(module: nn.Module, opt: torch.optim.Optimizer, flat: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    msd = {k[len("model."):]: v for k, v in flat.items() if k.startswith("model.")}
    osd = {k[len("optim."):]: v for k, v in flat.items() if k.startswith("optim.")}
    set_state_dict(module, _local_optimizer(opt), model_state_dict=msd, optim_state_dict=osd, options=_options())


def alias(key: str, ties: list[list[str]], available: set[str]) -> str | None:
    """`key` under another name of its tied parameter that the checkpoint has, or None."""
    for group in ties:
        for own in group:
            for prefix in PREFIXES:
                head = prefix + own
                if key == head or key.startswith(head + "."):
                    for other in group:
                        candidate = prefix + other + key[len(head):]
                        if other != own and candidate in available:
                            return candidate
    return None


def _rng_key(rank: int, kind: str = "cpu") -> str:
    return f"rng.{kind}.rank{rank}"


def _rng_states(rank: int, device: torch.device) -> dict[str, torch.Tensor]:
    out = {_rng_key(rank): torch.get_rng_state()}
    if device.type == "cuda":
        out[_rng_key(rank, "cuda")] = torch.cuda.get_rng_state(device)
    return out


# ---- what a rank does -------------------------------------------------------------------------
class Checkpointer:
    """One rank's saves, loads and stop decisions for one launch."""

    def __init__(self, settings: CheckpointSettings, module: nn.Module, opt: torch.optim.Optimizer, *,
                 rank: int, world: int, seed: int, steps: int, plan: dict[str, Any], ties: list[list[str]],
                 device: torch.device) -> None:
        self.ck, self.module, self.opt, self.steps = settings, module, opt, steps
        self.rank, self.world, self.seed, self.plan, self.ties, self.device = rank, world, seed, plan, ties, device
        self.before: CheckpointMeta | None = None  # what the resumed checkpoint recorded
        self.record: dict[str, Any] = {"saves": []}
        self._signalled = False
        self._previous_handler: Any = None
        self.kill_at = kill_point()

    # -- loading ----------------------------------------------------------------------------
    def resume(self) -> int:
        """Load the checkpoint to resume from, if any; the first step to run."""
        if self.ck.resume is None:
            return 0
        import torch.distributed.checkpoint as dcp

        started = time.time()
        path = Path(self.ck.resume)
        meta = read_meta(path)
        flat = state_dict(self.module, self.opt)
        got_state = time.time()
        available = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
        wanted: dict[str, Any] = {}
        renamed: dict[str, str] = {}
        for key, value in flat.items():
            source = key if key in available else alias(key, self.ties, available)
            if source is None:
                raise RuntimeError(f"checkpoint {path} has no {key!r}: it was saved for another model")
            wanted[source] = value
            renamed[source] = key
        rng = {k: v for k, v in _rng_states(self.rank, self.device).items() if k in available}
        wanted.update(rng)
        dcp.load(wanted, checkpoint_id=str(path))
        read = time.time()
        _set_state_dict(self.module, self.opt, {renamed[k]: v for k, v in wanted.items() if k in renamed})
        # RNG streams belong to ranks: restored where the same rank saved one (nothing in this
        # training draws random numbers today; a model with dropout would need them per layout)
        if _rng_key(self.rank) in wanted:
            torch.set_rng_state(wanted[_rng_key(self.rank)])
        if _rng_key(self.rank, "cuda") in wanted:
            torch.cuda.set_rng_state(wanted[_rng_key(self.rank, "cuda")], self.device)
        self.before = meta
        done = time.time()
        # the parts: the layout's own state dict (optimizer state made by a zero step), DCP's read
        # and reshard, and putting it in place
        self.record["load"] = {"started_at": started, "s": done - started, "checkpoint": str(path), "step": meta.step,
                               "state_dict_s": got_state - started, "read_s": read - got_state, "set_s": done - read}
        return meta.step

    # -- stopping ---------------------------------------------------------------------------
    def install(self) -> None:
        """SIGTERM asks for a save at the next step boundary instead of killing the rank."""
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.record["ready_at"] = time.time()  # built (and loaded): the launch's restart ends here

    def uninstall(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        self._signalled = True

    def before_step(self, step: int) -> None:
        """The fault a test asked for: this rank dies by SIGKILL before `step`, once per run."""
        if self.kill_at is None or self.kill_at != (self.rank, step):
            return
        marker = Path(self.ck.dir) / f"killed-rank{self.rank}-step{step}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{KILL_ENV}={self.rank}:{step}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def after_step(self, step: int, losses: list[float], times: list[float], first: int, end: int) -> bool:
        """Save if due; True when the launch stops here (after `step`)."""
        local = self._signalled or bool(self.ck.stop_file and os.path.exists(self.ck.stop_file))
        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        # a stop asked for after the last step is no stop: the run is over (and reports)
        asked = bool(flag.item()) and step + 1 < self.steps
        scripted = self.ck.stop_at is not None and step + 1 == self.ck.stop_at and step + 1 == end
        stop = asked or scripted
        # (no periodic save after the last step: the run is over)
        due = self.ck.every is not None and (step + 1) % self.ck.every == 0 and step + 1 < self.steps
        if stop or due:
            path = self.save(step + 1, losses, times, first)
            if stop:
                self.record["stopped"] = {"step": step + 1, "checkpoint": str(path),
                                          "why": "asked" if asked else "stop_at"}
        return stop

    # -- saving -----------------------------------------------------------------------------
    def save(self, next_step: int, losses: list[float], times: list[float], first: int) -> Path:
        """Save the state before `next_step` (losses and times: this launch's, from step `first`)."""
        import torch.distributed.checkpoint as dcp

        started = time.time()
        path = Path(self.ck.dir) / name(self.ck.tag, next_step)
        flat = state_dict(self.module, self.opt)
        flat.update(_rng_states(self.rank, self.device))
        got_state = time.time()
        dcp.save(flat, checkpoint_id=str(path))
        wrote = time.time() - got_state
        # the slowest rank's time per step, as the report keeps it
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        took = torch.tensor([time.time() - started], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if self.rank == 0:
            earlier = self.before
            meta = CheckpointMeta(step=next_step, seed=self.seed, world=self.world, plan=self.plan,
                                  losses=[*(earlier.losses[:first] if earlier else []), *losses],
                                  step_times_s=[*(earlier.step_times_s[:first] if earlier else []),
                                                *slowest.tolist()],
                                  history=self.ck.history, save_s=float(took.item()), saved_at=time.time())
            if len(meta.losses) != next_step:
                raise RuntimeError(f"checkpoint at step {next_step} would record {len(meta.losses)} losses")
            tmp = path / (META + ".tmp")
            tmp.write_text(meta.model_dump_json())
            tmp.replace(path / META)  # complete from here on
            prune(self.ck.dir, self.ck.keep)
            print(PROGRESS + json.dumps({"saved": str(path), "at": next_step}), flush=True)
        dist.barrier()  # no rank goes on (or exits) before the checkpoint is complete
        self.record["saves"].append({"step": next_step, "s": float(took.item()), "done_at": time.time(),
                                     "checkpoint": str(path), "state_dict_s": got_state - started, "write_s": wrote})
        return path


def checkpoint_blocker(spec: ExecSpec) -> str | None:
    """What of this plan a checkpoint cannot hold yet (None: it can): expert-parallel shards are
    plain tensors under one name on every rank; an interleaved rank's chunks are separate
    modules under one optimizer, whose FQNs are not the model's; PipeDream-2BW's stale weight
    version lives beside the model, not in its state dict."""
    if spec.dim("expert"):
        return "expert-parallel plans"
    if spec.pipeline.virtual_stages > 1:
        return "interleaved pipelines"
    if spec.pipeline.schedule == "2bw":
        return "PipeDream-2BW plans"
    return None


def kill_point() -> tuple[int, int] | None:
    """(rank, step) from PARETOPLAN_KILL_RANK_AT=RANK:STEP, or None."""
    text = os.environ.get(KILL_ENV, "").strip()
    if not text:
        return None
    try:
        rank, step = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"{KILL_ENV} must be RANK:STEP (two integers), got {text!r}") from None
    return rank, step
