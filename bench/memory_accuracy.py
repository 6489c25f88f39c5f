"""Predicted vs measured peak memory of one device, as the executor runs a plan in one process.

    python bench/memory_accuracy.py                      # the table in docs/benchmarks.md (~20 min on 2 cores)
    python bench/memory_accuracy.py --rows gpt2-medium:2:256:bf16:1:none   # model:batch:seq:precision:micro:recompute

Each row prices a one-device plan with `paretoplan estimate` (the 'h100-80gb' catalog device: the
memory model does not depend on the device), runs it in one process on this machine's CPU as the
executor runs it (torch.autocast for bf16 with fp32 parameters, gradient accumulation over the
micro-batches, every layer checkpointed under recompute 'full') and prints the predicted and
measured peak (MemTracker when one micro-batch runs, else the profiler's allocator events; the
worker's own measurement), the error (+: the run held more than predicted, an OOM risk) and, for
MemTracker, the measured peak by kind. `llama-small` is llama-7b's shape (RMSNorm, rotary GQA
with 4 query heads per K/V head, SwiGLU, untied head, 32,000 tokens) at width 512 and 4 layers,
given to the search as a HuggingFace config, as a user's model would be.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

from search.plans.estimate import EstimateRequest, estimate
from worker.analyze import analyze
from worker.launch import make_report, run_jobs
from worker.spec import Job, RunSettings

TARGET = 0.05
LLAMA_SMALL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 512,
               "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False}
ROWS = [
    "gpt2-medium:2:256:bf16:1:none", "gpt2-medium:2:256:bf16:1:full", "gpt2-medium:4:256:bf16:2:full",
    "gpt2-medium:2:256:fp32:1:none",
    "llama-small:2:512:bf16:1:none", "llama-small:4:512:bf16:1:full", "llama-small:4:256:bf16:2:none",
    "llama-small:2:512:fp32:1:none", "llama-small:4:512:fp32:2:full",
]


def request(row: str) -> tuple[EstimateRequest, int]:
    """The estimate request of one row and its micro-batch count."""
    model, batch, seq, precision, micro, recompute = row.split(":")
    m = int(micro)
    fields: dict = dict(device="h100-80gb", devices=1, devices_per_node=1, global_batch=int(batch), seq_len=int(seq),
                        precision=precision, micro_batch=int(batch) // m, recompute=recompute)
    if model == "llama-small":
        fields.update(hf_config=LLAMA_SMALL, name="llama-small")
    else:
        fields["model"] = model
    return EstimateRequest(**fields), m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=ROWS, help="model:batch:seq:precision:micro-batches:recompute")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("| model | batch x seq | precision | micro-batches | recompute | predicted | measured | error "
          "| measured by kind (MiB) |")
    print("|---|---|---|---:|---|---:|---:|---:|---|")
    errs = []
    for row in args.rows:
        req, m = request(row)
        est = estimate(req)
        method = "memtracker" if m == 1 else "profiler"
        job = Job(spec=analyze(est.plan), settings=RunSettings(steps=args.steps, warmup=1, memory_method=method))
        now = datetime.now(UTC)
        raw = run_jobs([job], timeout=3600)[0]
        rep = make_report(job, raw, now, datetime.now(UTC))
        meas = rep.measured.memory_bytes or 0
        err = meas / est.memory_bytes - 1 if est.memory_bytes else float("nan")
        errs.append(err)
        kinds = raw["ranks"][0].get("memory_by_category") or {}
        by = ", ".join(f"{k.split('.')[-1]} {v / 2**20:.0f}" for k, v in kinds.items() if v and k != "Total") if m == 1 else "-"
        model, batch, seq, precision, micro, recompute = row.split(":")
        print(f"| {model} | {batch} x {seq} | {precision} | {micro} | {recompute} | {est.memory_bytes / 2**20:.0f} MiB | "
              f"{meas / 2**20:.0f} MiB | {err * 100:+.1f}% | {by} |", flush=True)
    worst = max(errs, key=abs)
    print(f"\nworst error {worst * 100:+.1f}%, median |error| {statistics.median(abs(e) for e in errs) * 100:.1f}% "
          f"over {len(errs)} plans (target: within {TARGET * 100:.0f}%, never under; + means the run held more than "
          f"predicted); {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
