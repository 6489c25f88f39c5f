"""Does the search offer only plans the executor runs? For each family's tiny variant (2 layers,
width 64; bench/model_families.py), search on N CPU devices and pass every frontier plan to the
executor's analysis (worker/analyze.py), which refuses, naming why, what it cannot launch as
priced. Prints one row per family and the total; refusals grouped by their reason.

    python bench/executable_plans.py --devices 4
    python bench/executable_plans.py --devices 8 --families gpt2,opt,t5
    python bench/executable_plans.py --devices 8 --families opt,mamba --parity   # and launch some

Analysis is what runs before a launch (no processes start). With --parity, each family's first,
middle and last accepted plan with a tensor axis also run 3 steps as N gloo processes and their
losses are compared with one process (largest difference; parity below 2e-5).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_families import FAMILIES, parity, tiny_config  # noqa: E402


def refusals(family: str, devices: int) -> tuple[int, Counter[str], list[Any]]:
    """(frontier size, reason -> plans refused for it (names of ops and modules elided), the
    ExecSpecs of the accepted plans with a tensor axis)."""
    from search.plans.api import SearchRequest, run_search
    from worker.analyze import Unsupported, analyze

    o = run_search(SearchRequest(hf_config=tiny_config(family), name=family, device="cpu", devices=devices,
                                 devices_per_node=devices, global_batch=8, seq_len=32, precision="fp32",
                                 baselines=False))
    why: Counter[str] = Counter()
    tensor = []
    for plan in o.plans:
        try:
            spec = analyze(plan)
        except Unsupported as e:
            why[re.sub(r"'[^']*'", "'…'", str(e))[:150]] += 1
            continue
        if any(a.role == "tensor" and a.size > 1 for a in plan.mesh.axes):
            tensor.append(spec)
    return len(o.plans), why, tensor


def launched(specs: list[Any]) -> str:
    """The first, middle and last spec run 3 steps against one process: 'diff (mesh)' each."""
    out = []
    for spec in [specs[i] for i in sorted({0, len(specs) // 2, len(specs) - 1})] if specs else []:
        what = spec.summary.split(" | ")[0]
        try:
            ok, diff = parity(spec)
        except Exception as e:  # noqa: BLE001 - the run's failure is the verdict
            out.append(f"FAILED {' '.join(str(e).split())[:100]} ({what})")
            continue
        out.append(f"{'parity' if ok else 'NO parity'} {diff:.0e} ({what})")
    return "; ".join(out) or "no plan with a tensor axis"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--families", help="comma-separated model types (default: all 51)")
    ap.add_argument("--parity", action="store_true", help="launch some accepted tensor-parallel plans (see above)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    families = args.families.split(",") if args.families else FAMILIES
    total = refused = 0
    print("| family | frontier | refused | s | reason (count) |" + (" launched (3 steps) |" if args.parity else "")
          + "\n|---|---|---|---|---|" + ("---|" if args.parity else ""))
    for family in families:
        t0 = time.perf_counter()
        try:
            n, why, tensor = refusals(family, args.devices)
        except Exception as e:  # noqa: BLE001 - a family the search refuses is a row too
            print(f"| {family} | - | - | - | search refused: {' '.join(str(e).split())[:120]} |", flush=True)
            continue
        total, refused = total + n, refused + sum(why.values())
        reasons = "; ".join(f"{r} ({c})" for r, c in why.most_common())
        ran = f" | {launched(tensor)}" if args.parity else ""
        print(f"| {family} | {n} | {sum(why.values())} | {time.perf_counter() - t0:.0f} | {reasons or '-'}{ran} |",
              flush=True)
    print(f"\n{total - refused} of {total} frontier plans accepted on {args.devices} devices "
          f"({len(families)} families)")


if __name__ == "__main__":
    main()
