"""What resizing a running job costs: the time from the step boundary where it stops to the first
step on the new layout, split into save, re-plan, restart and load, for a few model sizes.

    python bench/resize.py                       # the table in docs/benchmarks.md
    python bench/resize.py --models llama-tiny   # one model

Each case is `paretoplan run --model M --devices 4 --steps 4 --resize 2:2 --checkpoint-dir D` as a
user runs it (gloo CPU processes on this machine): the search picks the plan for 4 processes, at
step 2 the run saves (torch.distributed.checkpoint, every rank its shards), re-plans (the same
search for 2 processes), relaunches torchrun with 2 processes, which build the model and load the
checkpoint resharded into their layout. The times are the report's (`segments[1].resize_s`):
save and load as the ranks measured them (slowest rank), re-plan in the launcher, restart the
rest (old processes out, torchrun and the new ranks up, the model built). The checkpoint's size
on disk is given beside them, and under each row the ranks' own split of save (the state dict,
DCP's write) and load (the new layout's state dict, whose optimizer state DCP makes with a zero
step; DCP's read and reshard; putting it in place).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (model, global batch, sequence length): sizes a 2-core machine runs in minutes
CASES = [("llama-tiny", 8, 64), ("gpt2", 4, 128), ("gpt2-medium", 4, 128)]


def run_case(model: str, batch: int, seq: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="paretoplan-bench-resize-") as tmp:
        ckpt, report = Path(tmp) / "run", Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "paretoplan", "run", "--model", model, "--devices", "4", "--steps", "4",
               "--resize", "2:2", "--global-batch", str(batch), "--seq-len", str(seq), "--checkpoint-dir", str(ckpt),
               "--warmup", "1", "--report", str(report), "--no-progress"]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode != 0:
            return {"model": model, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}
        rep = json.loads(report.read_text())
        size = max((sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
                    for d in ckpt.iterdir() if d.name.endswith("step-0000002")), default=0)
        # the ranks' own split of save and load (slowest rank of each part)
        saved = [r["checkpoints"]["saves"][-1] for r in _ranks(ckpt / "launch-0")]
        loaded = [r["checkpoints"]["load"] for r in _ranks(ckpt / "launch-1")]
    before, after = rep["segments"][0], rep["segments"][1]
    parts = {"save state_dict": max(x["state_dict_s"] for x in saved), "save write": max(x["write_s"] for x in saved),
             "load state_dict": max(x["state_dict_s"] for x in loaded), "load read": max(x["read_s"] for x in loaded),
             "load set": max(x["set_s"] for x in loaded)}
    return {"model": model, "from": before["plan_summary"], "to": after["plan_summary"], "resize_s": after["resize_s"],
            "bytes": size, "parts": parts}


def _ranks(launch: Path) -> list[dict]:
    return json.loads((launch / "out" / "0" / "result.json").read_text())["ranks"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[c[0] for c in CASES])
    args = ap.parse_args()
    from search.models.zoo import get_model

    print(f"{'model':<12} {'params':>8} {'checkpoint':>10} {'save':>7} {'re-plan':>8} {'restart':>8} {'load':>7} "
          f"{'total':>7}  4 -> 2 processes")
    for model, batch, seq in CASES:
        if model not in args.models:
            continue
        r = run_case(model, batch, seq)
        params = get_model(model).param_count()
        if "error" in r:
            print(f"{model:<12} {params / 1e6:>7.1f}M  failed: {r['error']}")
            continue
        t = r["resize_s"]
        total = t["save_s"] + t["replan_s"] + t["restart_s"] + t["load_s"]
        print(f"{model:<12} {params / 1e6:>7.1f}M {r['bytes'] / 2**20:>8.1f}MiB {t['save_s']:>6.2f}s {t['replan_s']:>7.2f}s "
              f"{t['restart_s']:>7.2f}s {t['load_s']:>6.2f}s {total:>6.2f}s  {r['from'].split(' |')[0]} -> "
              f"{r['to'].split(' |')[0]}")
        print(f"{'':<12} {'':>8} {'':>10}  " + ", ".join(f"{k} {v:.2f}s" for k, v in r["parts"].items()))
    print(f"(cpu: {os.cpu_count()} cores, gloo; step boundary to the first step on the new layout)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
