"""The `paretoplan` command: a thin face over the packages (DESIGN.md section 2).

Every user mistake is an `InputError`, printed as one line with exit code 2; a budget no plan
fits is reported with the least memory any plan needs and exit code 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from search.errors import InputError, NoFeasiblePlan

EXIT_INPUT = 2
EXIT_NO_PLAN = 3


class _Parser(argparse.ArgumentParser):
    """argparse's own errors as one line too (subparsers inherit the class)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"paretoplan: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="paretoplan", description="Pareto frontiers of parallel training strategies.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("models", help="list the model zoo with parameter counts")
    sub.add_parser("devices", help="list the device catalog")

    s = sub.add_parser("search", help="search the time/memory Pareto frontier of a model on a cluster")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name (see `paretoplan models`)")
    src.add_argument("--hf-config", help="a HuggingFace transformers config.json (random init, no download)")
    src.add_argument("--graph", help="an OpGraph JSON file (format in README)")
    s.add_argument("--device", default="h100-80gb", help="catalog device type (default h100-80gb)")
    s.add_argument("--devices", type=int, default=8, help="number of devices (default 8)")
    s.add_argument("--devices-per-node", type=int, default=None, help="node size (default: the device's usual)")
    s.add_argument("--cluster", help="cluster JSON file (overrides --device/--devices/--devices-per-node)")
    s.add_argument("--memory-budget", help="per-device memory budget, e.g. 40GiB (default: device memory)")
    s.add_argument("--global-batch", type=int, default=None, help="samples per iteration (default: max(8, devices))")
    s.add_argument("--seq-len", type=int, default=None, help="sequence length (default: the model's)")
    s.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    s.add_argument("--eps", type=float, default=0.0, help="approximate mode: keep one point per (1+eps) cell")
    s.add_argument("--exhaustive", action="store_true", help="enumerate every plan (the exact reference; small graphs)")
    s.add_argument("--no-block-reuse", action="store_true", help="solve every layer separately")
    s.add_argument("--zero", default="0,1,2,3", help="ZeRO stages to consider, e.g. 0 or 1,3 (default 0,1,2,3)")
    s.add_argument("--no-recompute", action="store_true", help="never recompute activations of a block")
    s.add_argument("--no-baselines", action="store_true", help="skip the baseline planners (DP, FSDP, Megatron)")
    s.add_argument("--json", dest="json_out", help="write the frontier with every full Plan as JSON")
    s.add_argument("--html", dest="html_out", help="write an interactive offline Plotly chart of the frontier")
    s.add_argument("--dump-graph", help="write the captured OpGraph as JSON")
    s.add_argument("--all", action="store_true", help="print every frontier point, not a sample")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "models":
            return _models()
        if args.command == "devices":
            return _devices()
        if args.command == "search":
            return _search(args)
    except InputError as e:
        print(f"paretoplan: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except NoFeasiblePlan as e:
        print(f"paretoplan: {e}", file=sys.stderr)
        return EXIT_NO_PLAN
    except BrokenPipeError:  # `paretoplan models | head`
        sys.stderr.close()
        return 0
    return 0


def _models() -> int:
    from search.zoo import ZOO

    print(f"{'model':<14} {'params':>16}  description")
    for name, spec in ZOO.items():
        print(f"{name:<14} {spec.param_count():>16,}  {spec.description}")
    return 0


def _devices() -> int:
    from search.cluster import CATALOG, format_size

    print(f"{'device':<12} {'memory':>10} {'bf16 TFLOP/s':>13} {'HBM GB/s':>9} {'intra GB/s':>10} {'inter GB/s':>10}")
    for name, d in CATALOG.items():
        print(f"{name:<12} {format_size(d.memory_bytes):>10} {d.peak_flops.get('bf16', 0) / 1e12:>13.1f} "
              f"{d.memory_bandwidth / 1e9:>9.0f} {d.intra_node_bandwidth / 1e9:>10.1f} {d.inter_node_bandwidth / 1e9:>10.2f}")
    return 0


def _search(args: argparse.Namespace) -> int:
    from search.capture import capture_model
    from search.cluster import format_size, load_cluster, make_cluster, parse_size
    from search.costmodel import TrainingJob
    from search.graph import load_graph
    from search.zoo import get_model, model_from_hf_config

    cluster = load_cluster(args.cluster) if args.cluster else make_cluster(args.device, args.devices, args.devices_per_node)
    budget = parse_size(args.memory_budget) if args.memory_budget else cluster.memory_per_device
    if args.eps < 0:
        raise InputError(f"--eps must be >= 0, got {args.eps}")
    if args.global_batch is not None and args.global_batch < 1:
        raise InputError(f"--global-batch must be >= 1, got {args.global_batch}")
    if args.seq_len is not None and args.seq_len < 1:
        raise InputError(f"--seq-len must be >= 1, got {args.seq_len}")
    batch = args.global_batch or max(8, cluster.num_devices)
    zero_stages = _zero_stages(args.zero)
    for out in (args.json_out, args.html_out, args.dump_graph):  # fail before a long search, not after
        if out and not Path(out).resolve().parent.is_dir():
            raise InputError(f"cannot write {out!r}: folder {str(Path(out).parent)!r} does not exist")

    t0 = time.perf_counter()
    if args.graph:
        graph = load_graph(args.graph)
        batch = int(graph.meta.get("global_batch", batch))
        seq = graph.meta.get("seq_len")
        seq_len = int(seq) if seq is not None else None
    else:
        spec = get_model(args.model) if args.model else model_from_hf_config(args.hf_config)
        graph = capture_model(spec, batch, args.seq_len)
        seq_len = args.seq_len or spec.default_seq_len if spec.kind != "vision" else None
    capture_s = time.perf_counter() - t0
    if args.dump_graph:
        _write(args.dump_graph, graph.to_json())
    job = TrainingJob(global_batch=batch, seq_len=seq_len, precision=args.precision)

    if args.exhaustive:
        from search.exhaustive import exhaustive_search

        result = exhaustive_search(graph, cluster, job, tie_blocks=not args.no_block_reuse, zero_stages=zero_stages,
                                   recompute=not args.no_recompute)
    else:
        from search.ft import search

        result = search(graph, cluster, job, eps=args.eps, reuse_blocks=not args.no_block_reuse,
                        zero_stages=zero_stages, recompute=not args.no_recompute)
    from search.plan import pick

    best = pick(result.points, budget)
    _print_table(result, best, budget, capture_s, args.all)
    bases = [] if args.no_baselines else _baselines(result, budget)
    if bases:
        _print_baselines(result, bases)
    if args.json_out or args.html_out:
        from search.plan import build_plans

        plans = build_plans(result)
        if args.json_out:
            doc = _json_doc(result, plans, best, budget, capture_s)
            doc["baselines"] = _baselines_json(result, bases)
            _write(args.json_out, json.dumps(doc, indent=1))
        if args.html_out:
            from paretoplan.report import frontier_html

            _write(args.html_out, frontier_html(result, plans, budget, best, bases))
    if best is None:
        least = min((p.memory_bytes for p in result.points), default=0.0)
        raise NoFeasiblePlan(
            f"no plan fits the memory budget of {format_size(int(budget))} per device; the leanest plan needs "
            f"{format_size(int(least))}", int(least))
    return 0


def _zero_stages(text: str) -> tuple[int, ...]:
    try:
        stages = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        stages = ()
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        raise InputError(f"--zero takes stages 0-3 separated by commas, got {text!r}")
    return stages


def _baselines(result, budget: float) -> list:
    """The baselines inside the space that was searched (a restricted search, e.g. --zero 0,
    says nothing about FSDP)."""
    from search.baselines import baselines

    stages = set(result.stats.get("zero_stages", [0, 1, 2, 3]))
    recompute = result.stats.get("recompute", True)

    def inside(b) -> bool:
        rc = any(v.startswith("recompute@") and int(a[b.point.row]) for v, a in b.point.configs.items())
        return b.solution.zero in stages and (recompute or not rc)

    return [b for b in baselines(result.graph, result.cluster, result.job, budget=budget, result=result) if inside(b)]


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms >= 0.1 else f"{ms:.4f}"


def _print_baselines(result, bases) -> None:
    from search.baselines import against_frontier
    from search.cluster import format_size

    print()
    print(f"{'baseline (same cost model)':<30} {'time/iter':>11} {'memory':>10}   frontier at its memory / at its time")
    for b in bases:
        d = against_frontier(result.points, b)
        faster = f"#{d['faster_point']} {d['speedup']:.2f}x faster" if d["speedup"] else "-"
        leaner = f"#{d['leaner_point']} {d['memory_ratio']:.2f}x less memory" if d["memory_ratio"] else "-"
        print(f"{b.name:<30} {_ms(b.time_s):>8} ms {format_size(int(b.memory_bytes)):>10}   {faster} / {leaner}")


def _baselines_json(result, bases) -> list[dict]:
    if not bases:
        return []
    from search.baselines import against_frontier, as_result
    from search.plan import build_plans

    plans = build_plans(as_result(result.graph, result.cluster, result.job, bases))
    return [{"name": b.name, "description": b.description, "time_s": b.time_s,
             "memory_bytes": int(round(b.memory_bytes)), "against_frontier": against_frontier(result.points, b),
             "plan": plan.model_dump()} for b, plan in zip(bases, plans)]


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise InputError(f"cannot write {path!r}: {e.strerror or e}") from None


def _sample(points, k: int) -> list[int]:
    """k rows spread evenly along the frontier's curve (arc length in log time and log memory),
    so a frontier with a long flat tail still shows its knee."""
    import numpy as np

    n = len(points)
    if n <= k:
        return list(range(n))
    t = np.log([max(p.time_s, 1e-300) for p in points])
    m = np.log([max(p.memory_bytes, 1.0) for p in points])
    t = (t - t.min()) / (np.ptp(t) or 1.0)
    m = (m - m.min()) / (np.ptp(m) or 1.0)
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(t), np.diff(m)))])
    targets = np.linspace(0.0, arc[-1], k)
    return sorted({int(i) for i in np.searchsorted(arc, targets, side="left").clip(0, n - 1)} | {0, n - 1})


def _print_table(result, best, budget: float, capture_s: float, show_all: bool) -> None:
    from search.cluster import format_size

    pts = result.points
    rows = list(range(len(pts))) if show_all else _sample(pts, 20)
    best_i = pts.index(best) if best is not None else None
    if best_i is not None and best_i not in rows:
        rows = sorted(rows + [best_i])
    print(f"{result.graph.name}: {result.graph.param_count():,} parameters, {len(result.graph.ops)} ops, "
          f"global batch {result.job.global_batch}, {result.job.precision}, on {result.cluster.describe()}")
    print(f"{'':2}{'#':>5} {'time/iter':>12} {'memory/device':>14}  plan")
    summaries = _summaries(result, [pts[i] for i in rows])
    for i, s in zip(rows, summaries):
        p = pts[i]
        mark = "*" if i == best_i else (" " if p.memory_bytes <= budget else "!")
        print(f"{mark:2}{i:>5} {_ms(p.time_s):>9} ms {format_size(int(p.memory_bytes)):>14}  {s}")
    shown = "" if len(rows) == len(pts) else f" (showing {len(rows)}; --all for every point)"
    print(f"{len(pts)} Pareto-optimal plans{shown}; '*' fastest that fits {format_size(int(budget))}, "
          f"'!' over budget")
    mode = "exhaustive" if result.stats.get("exhaustive") else ("exact" if result.eps == 0 else f"eps={result.eps}")
    zeros = ",".join(str(z) for z in result.stats.get("zero_stages", [0]))
    n_meshes = len(result.stats.get("meshes", []))
    print(f"search ({mode}) took {result.search_seconds:.3f} s over {n_meshes} mesh{'es' if n_meshes != 1 else ''} "
          f"x ZeRO stages {zeros}{' with per-layer recomputation' if result.stats.get('recompute') else ''}; "
          f"capture {capture_s:.2f} s")


def _summaries(result, points) -> list[str]:
    from search.plan import build_plans

    return [p.summary for p in build_plans(result, points)]


def _json_doc(result, plans, best, budget: float, capture_s: float) -> dict:
    return {
        "model": result.graph.name,
        "cluster": result.cluster.describe(),
        "job": result.job.model_dump(),
        "memory_budget_bytes": int(budget),
        "search_seconds": result.search_seconds,
        "capture_seconds": capture_s,
        "eps": result.eps,
        "stats": result.stats,
        "picked": result.points.index(best) if best is not None else None,
        "frontier": [{"time_s": p.time_s, "memory_bytes": int(round(p.memory_bytes)), "plan": plan.model_dump()}
                     for p, plan in zip(result.points, plans)],
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
