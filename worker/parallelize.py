"""Apply an ExecSpec to a module with torch's own parallel APIs.

Order (torchtitan's): tensor parallelism (``parallelize_module``), then activation checkpointing
(``checkpoint_wrapper``), then data parallelism (``fully_shard`` / ``replicate``), all on the
meta device; the caller materialises afterwards. ZeRO stages map to:

- 0: ``replicate`` (FSDP2's DDP: gradients all-reduced) per block and at the root.
- 1: ``DistributedDataParallel`` with ``ZeroRedundancyOptimizer`` (see `wrap_ddp`,
  `make_optimizer`): gradients all-reduced, optimizer state sharded, updated parameters broadcast
  by their owners. Memory is ZeRO-1's; the traffic is an all-reduce plus broadcasts where the cost
  model prices reduce-scatter + all-gather. ZeroRedundancyOptimizer needs plain tensors, so with
  tensor or pipeline parallelism (DTensor parameters) ZeRO-1 runs as ZeRO-2 (worker.analyze notes it).
- 2: ``fully_shard(reshard_after_forward=False)``: gradients reduce-scattered and kept sharded,
  parameters gathered once per step and kept through backward (ZeRO-2's traffic and memory).
- 3: ``fully_shard(reshard_after_forward=True)``: FSDP, parameters gathered in forward and again
  in backward.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from worker.spec import ExecSpec, StyleSpec

CKPT_PREFIX = "_checkpoint_wrapped_module."
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def placement(text: str | None) -> Placement | None:
    if text is None:
        return None
    if text == "Replicate()":
        return Replicate()
    if text == "Partial()":
        return Partial()
    if text.startswith("Shard(") and text.endswith(")"):
        return Shard(int(text[6:-1]))
    raise ValueError(f"not a DTensor placement: {text!r}")


def placements(text: str | None) -> tuple[Placement, ...] | None:
    """A comma-separated list of placements, one per mesh dimension (two tensor axes)."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        pl = placement(part)
        assert pl is not None
        out.append(pl)
    return tuple(out)


class _Unaliased(torch.autograd.Function):
    """The identity, whose output is no view: `DTensor.to_local()` returns a view made inside a
    custom autograd Function, and autograd forbids modifying such a view in place. transformers
    does (Llama-4's MoE adds the routed experts' sum into its shared expert's output with `add_`),
    so a local shard leaving a style is handed over through this. It shares the shard's storage and
    version counter: an in-place change of a tensor some backward saved is still caught."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def to_local(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard as a plain tensor the model may modify in place."""
    from torch.distributed.tensor import DTensor

    local = x.to_local() if isinstance(x, DTensor) else x
    return _Unaliased.apply(local) if local._is_view() else local


def _unaliased_output(mod: nn.Module, inputs: tuple, out: object) -> object:
    """A forward hook after a torch style that leaves its output local (see `_Unaliased`)."""
    return to_local(out) if isinstance(out, torch.Tensor) else out


def _first_key(args: tuple, kwargs: dict) -> int | str | None:
    """Where a module's first input is: its first positional argument, else its first tensor
    keyword argument (transformers calls its attention as `self_attn(hidden_states=..., ...)`)."""
    if args:
        return 0
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return "hidden_states"
    return next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)


def first_input(mod: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
    key = _first_key(args, kwargs)
    if key is None:
        raise RuntimeError(f"{type(mod).__name__} was called without a tensor input to redistribute")
    return args[0] if key == 0 else kwargs[str(key)]


def with_first_input(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    key = _first_key(args, kwargs)
    if key == 0:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, str(key): x}


class PrepareFirstInput(ParallelStyle):
    """PrepareModuleInput for a module's first input, positional or keyword: torch's style counts
    positional inputs only, and refuses a module that takes its input by keyword (every attention
    of transformers). The local shard arrives in `input_layout` and is redistributed to
    `desired_input_layout` by DTensor."""

    def __init__(self, input_layout: Placement, desired_input_layout: Placement, use_local_output: bool,
                 calls: list[tuple[Placement, Placement] | None] | None = None) -> None:
        super().__init__()
        self.received, self.wanted, self.local = input_layout, desired_input_layout, use_local_output
        # a module called once per tensor whose calls convert differently (T5's stack dropout, after the
        # embedding and after the final norm): call k of every forward (and of every recomputation,
        # which replays the calls in order) takes calls[k % n]; None keeps that call's tensor as it is
        self.calls = calls
        self.count = 0

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import DTensor

        def enter(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            received, wanted = self.received, self.wanted
            if self.calls:
                layouts = self.calls[self.count % len(self.calls)]
                self.count += 1
                if layouts is None:
                    return args, kwargs
                received, wanted = layouts
            x = first_input(mod, args, kwargs)
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, (received,), run_check=False)
            if x.placements != (wanted,):
                x = x.redistribute(device_mesh, (wanted,))
            return with_first_input(args, kwargs, to_local(x) if self.local else x)

        module.register_forward_pre_hook(enter, with_kwargs=True)
        return module


class Placed(ParallelStyle):
    """A module's placements on several tensor mesh dimensions at once (2-D tensor parallelism):
    parallelize_module's styles place one dimension (a 2-D mesh is refused: "placements must have
    the same length as device_mesh.ndim"), DTensor itself computes on any. The module's own
    parameters are distributed as the plan places them; its first input arrives as a local shard
    in `input_layout` (or as a DTensor), is redistributed to `desired_input_layout`, and enters as
    a DTensor when the module computes on them (its own op) or as the local shard otherwise; its
    output (a DTensor, or a local shard in `output_layout` for a module that computes locally) is
    redistributed to `desired_output_layout` and leaves as a local shard unless `use_local_output`
    is False. Every redistribution is DTensor's own, collective for collective."""

    def __init__(self, st: StyleSpec) -> None:
        super().__init__()
        self.st = st
        self.own = st.style == "placed"

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import DTensor, distribute_tensor

        st = self.st
        for name, layout in st.param_layouts.items():
            param = module.get_parameter(name)
            dist = distribute_tensor(param, device_mesh, placements(layout))
            module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))
        received, wanted = placements(st.input_layout), placements(st.desired_input_layout)
        local_in = not self.own and st.use_local_output
        if received is not None and wanted is not None:
            def enter(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
                x = first_input(mod, args, kwargs)
                if not isinstance(x, DTensor):
                    x = DTensor.from_local(x, device_mesh, received, run_check=False)
                if x.placements != wanted:
                    x = x.redistribute(device_mesh, wanted)
                return with_first_input(args, kwargs, to_local(x) if local_in else x)

            module.register_forward_pre_hook(enter, with_kwargs=True)
        produced = placements(st.output_layout)
        leaving = placements(st.desired_output_layout) if not self.own else produced
        if self.own or st.style == "prepare_output":
            def leave(mod: nn.Module, inputs: tuple, out: torch.Tensor) -> torch.Tensor:
                if not isinstance(out, DTensor):
                    assert produced is not None
                    out = DTensor.from_local(out, device_mesh, produced, run_check=False)
                if leaving is not None and out.placements != leaving:
                    out = out.redistribute(device_mesh, leaving)
                return to_local(out) if st.use_local_output else out

            module.register_forward_hook(leave)
        return module


def parallel_style(st: StyleSpec) -> ParallelStyle:
    i, di, o, do = (placement(x) for x in (st.input_layout, st.desired_input_layout,
                                           st.output_layout, st.desired_output_layout))
    if st.style == "colwise":
        return ColwiseParallel(input_layouts=i, output_layouts=o, use_local_output=st.use_local_output)
    if st.style == "rowwise":
        return RowwiseParallel(input_layouts=i, output_layouts=o, use_local_output=st.use_local_output)
    if st.style == "sequence":
        return SequenceParallel(sequence_dim=st.sequence_dim if st.sequence_dim is not None else 1,
                                use_local_output=st.use_local_output)
    if st.style == "prepare_input":
        assert i is not None and di is not None, "analyze gives a prepare_input both of its layouts"
        calls = [(_layout(c[0]), _layout(c[1])) if c else None for c in st.call_layouts]
        return PrepareFirstInput(i, di, st.use_local_output, calls or None)
    assert o is not None and do is not None, "analyze gives a prepare_output both of its layouts"
    return PrepareModuleOutput(output_layouts=(o,), desired_output_layouts=(do,), use_local_output=st.use_local_output)


def _layout(text: str) -> Placement:
    p = placement(text)
    assert p is not None, f"a call's layout names a placement, got {text!r}"
    return p


def has_module(root: nn.Module, fqn: str) -> bool:
    try:
        root.get_submodule(fqn)
        return True
    except AttributeError:
        return False


# torch's styles whose output leaves as `to_local()` (a view) when use_local_output is set
LOCAL_OUTPUT = ("colwise", "rowwise", "sequence", "prepare_output")


def apply_tensor_parallel(module: nn.Module, spec: ExecSpec, tp_mesh: DeviceMesh) -> None:
    """One ``parallelize_module`` call per style, in the spec's order (a module's input preparation
    registers its hook before the module's own style), or on two tensor dimensions one `Placed`
    each; modules absent from this pipeline stage are skipped. Tied parameters that TP replaced
    separately are tied again."""
    held_calls = getattr(module, "held_calls", None)  # a pipeline stage making some calls of a module
    for st in spec.styles:
        if not has_module(module, st.module):
            continue
        held = held_calls(st.module) if callable(held_calls) and st.call_layouts else None
        if held is not None:  # T5's encoder dropout on the stage of the final norm: its call 1 comes first
            st = st.model_copy(update={"call_layouts": [st.call_layouts[c] for c in held]})
        if tp_mesh.ndim > 1:  # parallelize_module takes a 1-D mesh only
            Placed(st)._apply(module.get_submodule(st.module), tp_mesh)
        else:
            parallelize_module(module, tp_mesh, {st.module: parallel_style(st)})
            if st.use_local_output and st.style in LOCAL_OUTPUT:
                module.get_submodule(st.module).register_forward_hook(_unaliased_output)
    if tp_mesh.ndim == 1:
        local_heads(module, spec, tp_mesh.size())
    retie(module, spec.ties)


QKV = ("q_proj", "k_proj", "v_proj")


def local_heads(module: nn.Module, spec: ExecSpec, ways: int) -> None:
    """An attention module whose query, key and value projections are column-parallel computes on
    its rank's heads: a head count it reads in its forward is made that share (Megatron's heads per
    partition). Whisper views its keys and values as (batch, -1, self.num_heads, head_dim): with
    the global count, a rank's one head of 32 positions read as four heads of 8."""
    colwise = {st.module for st in spec.styles if st.style == "colwise"}
    parents = {m.rpartition(".")[0] for m in colwise if m.rpartition(".")[2] in QKV}
    for fqn in sorted(parents):
        if not has_module(module, fqn):
            continue
        attn = module.get_submodule(fqn)
        present = [n for n in QKV if isinstance(getattr(attn, n, None), nn.Module)]
        heads = getattr(attn, "num_heads", None)
        if (len(present) == len(QKV) and all(f"{fqn}.{n}" in colwise for n in present)
                and isinstance(heads, int) and heads % ways == 0):
            setattr(attn, "num_heads", heads // ways)  # noqa: B010 - an int attribute nn.Module types as Tensor | Module


def retie(module: nn.Module, ties: list[list[str]]) -> None:
    """Make the FQNs of each tied group one Parameter again (TP and ``to_empty`` replace each
    module's parameter separately). Within a pipeline stage only the names present are tied. The
    group takes a tensor-parallel holder's weight (a DTensor) where there is one: a holder the
    forward never calls (T5's `shared`) has no style and keeps a whole tensor, which the styled
    holders cannot compute with."""
    from torch.distributed.tensor import DTensor

    for group in ties:
        present = [n for n in group if _has_param(module, n)]
        if len(present) < 2:
            continue
        present.sort(key=lambda n: not isinstance(module.get_parameter(n), DTensor))  # stable: DTensors first
        first = module.get_parameter(present[0])
        for name in present[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(module.get_submodule(owner), attr, first)


def _has_param(module: nn.Module, name: str) -> bool:
    owner, _, attr = name.rpartition(".")
    return has_module(module, owner) and isinstance(getattr(module.get_submodule(owner), attr, None), nn.Parameter)


def apply_recompute(module: nn.Module, fqns: list[str]) -> None:
    """Wrap each recomputed block with non-reentrant activation checkpointing (the reentrant
    variant does not compose with DTensor and FSDP2)."""
    for fqn in fqns:
        if not has_module(module, fqn):
            continue
        parent_name, _, child = fqn.rpartition(".")
        parent = module.get_submodule(parent_name)
        parent.register_module(child, checkpoint_wrapper(parent.get_submodule(child),
                                                         checkpoint_impl=CheckpointImpl.NO_REENTRANT))


def block_units(module: nn.Module, prefixes: list[str]) -> list[nn.Module]:
    """The modules data parallelism wraps one by one (each block layer), before the root."""
    out: list[nn.Module] = []
    for prefix in prefixes:
        if has_module(module, prefix):
            out.extend(module.get_submodule(prefix).children())
    return out


def apply_data_parallel(module: nn.Module, spec: ExecSpec, dp_mesh: DeviceMesh, prefixes: list[str],
                        experts: list[str] | None = None, experts_mesh: DeviceMesh | None = None) -> None:
    """fully_shard / replicate over the data-parallel mesh dimension, block by block, then the root.
    Under expert parallelism `dp_mesh` is data x expert, and each experts module of `experts` (each
    rank holding different experts) is wrapped first on its own over `experts_mesh`, the data
    dimension alone, or, with none, left out of every unit: its gradients need no synchronisation."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if spec.precision != "fp32":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[spec.precision], reduce_dtype=torch.float32)
    units = block_units(module, prefixes)
    experts = [e for e in experts or [] if has_module(module, e)]
    ignored = ({p for e in experts for p in module.get_submodule(e).parameters()}
               if experts and experts_mesh is None else None)
    if spec.data_parallel == "fsdp":
        # a pipeline stage runs several micro-batches per step: keep the parameters gathered
        # between them rather than gathering per micro-batch (torchtitan does the same)
        reshard = spec.reshard_after_forward and spec.pipeline.stages == 1
        if experts_mesh is not None:
            for e in experts:
                fully_shard(module.get_submodule(e), mesh=experts_mesh, reshard_after_forward=reshard, mp_policy=mp)
        for u in units:
            fully_shard(u, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, ignored_params=ignored)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp, ignored_params=ignored)
    elif spec.data_parallel == "ddp":
        if experts_mesh is not None:
            for e in experts:
                replicate(module.get_submodule(e), mesh=experts_mesh, mp_policy=mp)
        for u in units:
            replicate(u, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)
        replicate(module, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)


def wrap_ddp(module: nn.Module, spec: ExecSpec, dp_group) -> nn.Module:
    """ZeRO-1: classic DDP (after materialisation; it broadcasts rank 0's parameters, which equal
    everyone's) so that parameters stay plain tensors, as ZeroRedundancyOptimizer needs."""
    if spec.data_parallel != "zero1":
        return module
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, process_group=dp_group)


def make_optimizer(module: nn.Module, spec: ExecSpec, lr: float, dp_group=None,
                   params: list[nn.Parameter] | None = None) -> torch.optim.Optimizer:
    """AdamW everywhere; under ZeRO-1, wrapped in ZeroRedundancyOptimizer over the data group.
    `params`: what it updates, when not the module's own (PipeDream-2BW's newest weights)."""
    params = [p for p in module.parameters() if p.requires_grad] if params is None else params
    if spec.data_parallel == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=dp_group, lr=lr,
                                       foreach=False)
    return torch.optim.AdamW(params, lr=lr, foreach=False)


def canonical(fqn: str) -> str:
    """A parameter's FQN as in the unwrapped model (checkpoint_wrapper inserts a level)."""
    return fqn.replace(CKPT_PREFIX, "")
