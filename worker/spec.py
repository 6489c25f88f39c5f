"""What a rank executes: the edge between the launcher and the per-rank program (pydantic, JSON).

`ExecSpec` is derived from a Plan by `worker.analyze` before anything launches; every rank reads
the same spec, so no rank re-derives the strategy. `RunSettings` holds what the user chose for
this run (steps, seed, learning rate), and `Job` pairs the two.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from search.models.source import ModelSource

PROGRESS = "@@paretoplan "  # the prefix of rank 0's progress lines on stdout, which the launcher reads

Role = Literal["pp", "data", "tensor", "expert", "context", "replicate"]


class MeshDim(BaseModel):
    """One dimension of the runtime DeviceMesh. Plan axes with the same role that are adjacent in
    device order are merged into one dimension (a plan may split the batch on both dp and tp)."""

    model_config = ConfigDict(frozen=True)
    name: str                      # pp | dp | tp | ep | cp | rep: named by role, not by the plan axis
    size: int
    role: Role
    plan_axes: list[str] = Field(default_factory=list)


class StyleSpec(BaseModel):
    """One `parallelize_module` style on one module, over the tensor-parallel mesh dimension.
    Layouts are DTensor placements written as in the Plan ('Shard(1)', 'Replicate()', 'Partial()')."""

    module: str
    style: Literal["colwise", "rowwise", "sequence", "prepare_input", "prepare_output", "placed"]
    input_layout: str | None = None
    desired_input_layout: str | None = None
    output_layout: str | None = None
    desired_output_layout: str | None = None
    use_local_output: bool = True
    sequence_dim: int | None = None
    ops: list[str] = Field(default_factory=list, description="the plan ops (or edges) this realises")
    axis_styles: list[str] = Field(default_factory=list, description="per tensor axis, the style of the module's own "
                                   "op ('' where it replicates)")
    param_layouts: dict[str, str] = Field(default_factory=dict, description="placed (two tensor axes): each "
                                          "parameter's placements, one per tensor axis, comma-separated")
    call_layouts: list[list[str]] = Field(default_factory=list, description="prepare_input on a module called once "
                                          "per tensor: per call in forward order, [input, desired input] layouts, or "
                                          "[] for a call that keeps its tensor as it comes; empty: every call alike")


class ExpectedComm(BaseModel):
    """A collective the Plan's cost model prices on the tensor (expert, context) axis, where the executor performs it."""

    unit: str = Field(description="top-level module or block layer ('blocks.0', 'lm_head'; '' = the root)")
    module: str = Field(description="the module whose hook or style performs it")
    phase: Literal["forward", "backward"]
    kind: Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
    source: str = Field(description="the plan edge 'u -> v' or the op whose parameter gradient it syncs")
    dtensor: bool = Field(default=False, description="performed by a DTensor redistribution (on a CPU mesh DTensor "
                          "runs an all-to-all as an all-gather and a local chunk: gloo has no all-to-all there)")


class PipelineExec(BaseModel):
    stages: int = 1
    schedule: Literal["none", "gpipe", "1f1b", "2bw"] = "none"
    micro_batches: int = 1
    virtual_stages: int = Field(default=1, description="> 1: interleaved 1F1B, each pp rank running this many chunks")
    stage_layers: list[list[int]] = Field(default_factory=list, description="block-stack layers [first, end) of every "
                                          "chunk in model order (stages x virtual_stages of them), chunk c on pp rank "
                                          "c % stages")
    p2p: list[int] = Field(default_factory=list, description="per pp rank, the point-to-point sends (and as many "
                           "receives) of one step that the plan prices: activations forward, gradients back")
    p2p_recv: list[int] = Field(default_factory=list, description="per pp rank, the point-to-point receives of one "
                                "step where they differ from the sends (several tensors cross a cut, some without a "
                                "gradient: an encoder-decoder's); empty: as many as p2p")

    def chunks_of(self, rank: int) -> list[int]:
        """The chunks pp rank `rank` runs, in model order."""
        return list(range(rank, self.stages * self.virtual_stages, self.stages))


class ExecSpec(BaseModel):
    model: str
    source: ModelSource | None = Field(default=None, description="how each rank rebuilds the model (the plan's)")
    kind: str = Field(description="zoo model kind: lm | mlm | vision")
    global_batch: int
    seq_len: int | None
    precision: Literal["fp32", "bf16", "fp16"]
    num_devices: int
    mesh: list[MeshDim]
    data_parallel: Literal["none", "ddp", "zero1", "fsdp"] = "none"
    reshard_after_forward: bool = False
    zero_stage: int = 0
    styles: list[StyleSpec] = Field(default_factory=list)
    ties: list[list[str]] = Field(default_factory=list, description="parameter FQNs that are one parameter")
    recompute: list[str] = Field(default_factory=list)
    pipeline: PipelineExec = Field(default_factory=PipelineExec)
    expected_comms: list[ExpectedComm] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="where execution knowingly differs from the Plan")
    summary: str = ""
    predicted_time_s: float = 0.0
    predicted_memory_bytes: int = 0
    plan: dict[str, Any] = Field(default_factory=dict)

    def dim(self, role: Role) -> MeshDim | None:
        return next((d for d in self.mesh if d.role == role), None)

    def size(self, role: Role) -> int:
        return (d := self.dim(role)) and d.size or 1

    def names(self, role: Role) -> tuple[str, ...]:
        """The mesh dimensions of a role: one, or two tensor dimensions ('tp', 'tp2')."""
        return tuple(d.name for d in self.mesh if d.role == role)


class CheckpointSettings(BaseModel):
    """Where a launch saves its state with torch.distributed.checkpoint, when, and what it resumes
    from (worker.checkpoint); the launcher (worker.elastic) fills it for every launch."""

    dir: str = Field(description="the run directory: checkpoints are its sub-directories <tag>step-<k>")
    tag: str = Field(default="", description="prefix of this launch's checkpoint names: two launches never share one")
    every: int | None = Field(default=None, ge=1, description="save after every N-th step")
    resume: str | None = Field(default=None, description="the checkpoint to load before the first step")
    stop_at: int | None = Field(default=None, ge=1, description="save and stop before this step (a scripted resize)")
    stop_file: str | None = Field(default=None, description="when this file appears, save and stop at the next "
                                                             "step boundary")
    keep: int = Field(default=2, ge=1, description="complete checkpoints kept in the run directory")
    history: dict[str, Any] = Field(default_factory=dict, description="the launcher's record of the run so far, "
                                                                      "stored with every checkpoint")


class RunSettings(BaseModel):
    steps: int = Field(default=20, ge=1)
    warmup: int = Field(default=2, ge=0, description="steps excluded from the timing (and the memory step)")
    seed: int = 0
    lr: float = 1e-3
    device: Literal["cpu", "cuda"] = "cpu"
    comm_debug: bool = Field(default=False, description="record step 0 under CommDebugMode")
    measure_memory: bool = True
    memory_method: Literal["profiler", "memtracker"] = Field(
        default="profiler", description="CPU peak memory: the profiler's allocator events (default; they also see "
        "communication buffers) or MemTracker (a breakdown by kind; not for pipeline stages)")
    fail_rank: int | None = Field(default=None, description="testing: this rank raises at fail_step")
    fail_step: int = 0
    checkpoint: CheckpointSettings | None = Field(default=None, description="save and resume (worker.checkpoint)")


class Job(BaseModel):
    spec: ExecSpec
    settings: RunSettings
