"""What profiling costs: distinct op signatures, reuse from a base profile, and seconds.

    python bench/profile_cost.py            # the table in docs/benchmarks.md (a few minutes on 2 cores)
    python bench/profile_cost.py --quick    # smaller shapes, for a smoke run

Runs the real profiler (profiler.run.run_profile) on this machine, one run after the other, each
on top of the profile the previous runs built (the way a user extends a profile with --base):

1. gpt2-medium on 4 devices (4 per node: meshes dp4, dp2 x tp2, tp4), from nothing - op
   signatures, the AdamW step and the collectives of group sizes 2 and 4;
2. the same again: everything is reused, nothing timed;
3. gpt2-medium on 2 devices: the 2-device meshes share many local shapes with the 4-device ones;
4. llama-7b on 4 devices: a different model, little in common with GPT-2.

Scaled to fit this machine (2 CPU cores): the models keep their real widths, depths and
vocabularies (24 x 1024 for gpt2-medium, 32 x 4096 with an 11008-wide MLP for llama-7b), but the
token count per iteration is cut - gpt2-medium at global batch 4 x sequence 256, llama-7b at
global batch 2 x sequence 128 (their defaults are 8 x 1024 and 8 x 4096) - so that one op runs
in well under a second on one core.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from profiler.run import run_profile
from search.prices.profile import DeviceProfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter sequences (a smoke run, not the docs/benchmarks.md table)")
    ap.add_argument("--out", help="write the final profile here")
    args = ap.parse_args()
    g_seq, l_seq = (64, 32) if args.quick else (256, 128)
    runs = [
        ("gpt2-medium", 4, 4, 4, g_seq, "fresh"),
        ("gpt2-medium", 4, 4, 4, g_seq, "rerun"),
        ("gpt2-medium", 2, 2, 4, g_seq, "fewer devices"),
        ("llama-7b", 4, 4, 2, l_seq, "second model"),
    ]
    prof: DeviceProfile | None = None  # each run extends the previous run's profile
    rows = []
    t_all = time.perf_counter()
    load0 = os.getloadavg()[0]
    for model, devices, per_node, batch, seq, what in runs:
        cpu0 = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        prof, s = run_profile(model, devices, device="cpu", devices_per_node=per_node, global_batch=batch,
                              seq_len=seq, base=prof, progress=sys.stderr.isatty())
        cpu = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu0
        rows.append((model, f"{devices} ({what})", f"{batch} x {seq}", s.instances, s.signatures, s.timed, s.reused,
                     s.reused / s.signatures if s.signatures else 0.0, s.op_seconds, s.collective_fits,
                     s.collective_seconds, s.seconds, cpu))
        print(f"  {model} {devices} devices: {s.line()}", file=sys.stderr)
    assert prof is not None  # runs is not empty
    head = ("model", "devices", "batch x seq", "op configs", "signatures", "timed", "reused", "reuse", "op s",
            "coll. fits", "coll. s", "total s", "CPU s")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        cells = [r[0], r[1], r[2], f"{r[3]:,}", str(r[4]), str(r[5]), str(r[6]), f"{100 * r[7]:.0f}%", f"{r[8]:.1f}",
                 str(r[9]), f"{r[10]:.1f}", f"{r[11]:.1f}", f"{r[12]:.1f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\n{len(prof.ops)} op signatures in the final profile; {time.perf_counter() - t_all:.0f} s in all "
          f"({prof.host.processor}, {prof.host.cpu_count} cores, {prof.host.threads} torch thread(s) per rank); "
          f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (s: wall clock; CPU s: "
          f"user CPU of the profiler and its gloo ranks - far below the wall clock means other work shared the cores)")
    if args.out:
        prof.dump(args.out)


if __name__ == "__main__":
    main()
