"""The `paretoplan` command: a thin face over the packages (DESIGN.md section 2).

Every user mistake is an `InputError`, printed as one line with exit code 2; a budget no plan
fits is reported with the least memory any plan needs and exit code 3.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    from search.api import run_search
    from search.cluster import format_size

    req = _request(args)
    for out in (args.json_out, args.html_out, args.dump_graph):  # fail before a long search, not after
        if out and not Path(out).resolve().parent.is_dir():
            raise InputError(f"cannot write {out!r}: folder {str(Path(out).parent)!r} does not exist")
    o = run_search(req)
    result = o.result
    if args.dump_graph:
        _write(args.dump_graph, result.graph.to_json())
    _print_table(result, o.best, o.budget, o.capture_seconds, args.all)
    if o.baselines:
        _print_baselines(result, o.baselines)
    if args.json_out:
        _write(args.json_out, o.report.model_dump_json(indent=1))
    if args.html_out:
        from paretoplan.report import frontier_html

        _write(args.html_out, frontier_html(result, o.plans, o.budget, o.best, o.baselines))
    if o.best is None:
        least = min((p.memory_bytes for p in result.points), default=0.0)
        raise NoFeasiblePlan(
            f"no plan fits the memory budget of {format_size(int(o.budget))} per device; the leanest plan needs "
            f"{format_size(int(least))}", int(least))
    return 0


def _read_json(path: str, what: str) -> object:
    p = Path(path)
    if what == "HF config" and p.is_dir():
        p = p / "config.json"
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise InputError(f"cannot read {what} file {str(p)!r}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{what} file {str(p)!r} is not valid JSON: {e}") from None


def _request(args: argparse.Namespace):
    """The CLI's flags as the SearchRequest the service takes too (one validation path)."""
    from pydantic import ValidationError

    from search.api import SearchRequest

    fields: dict = dict(device=args.device, devices=args.devices, devices_per_node=args.devices_per_node,
                        memory_budget=args.memory_budget, global_batch=args.global_batch, seq_len=args.seq_len,
                        precision=args.precision, eps=args.eps, zero_stages=list(_zero_stages(args.zero)),
                        recompute=not args.no_recompute, baselines=not args.no_baselines,
                        exhaustive=args.exhaustive, reuse_blocks=not args.no_block_reuse)
    if args.cluster:
        fields["cluster"] = _read_json(args.cluster, "cluster")
    if args.model:
        fields["model"] = args.model
    elif args.hf_config:
        p = Path(args.hf_config)
        fields["hf_config"] = _read_json(args.hf_config, "HF config")
        fields["name"] = p.name if p.is_dir() else (p.parent.name or p.stem) if p.name == "config.json" else p.stem
    else:
        fields["graph"] = _read_json(args.graph, "graph")
    try:
        return SearchRequest(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        flag = f"--{where.replace('_', '-')}" if where else "arguments"
        raise InputError(f"{flag}: {first.get('msg', 'invalid')}") from None


def _zero_stages(text: str) -> tuple[int, ...]:
    try:
        stages = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        stages = ()
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        raise InputError(f"--zero takes stages 0-3 separated by commas, got {text!r}")
    return stages


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
