"""Instructions one default search executes, counted by callgrind: a load-independent measure of
search speed for comparing two checkouts on a shared machine, where CPU seconds swing by 1.5x
from run to run (docs/benchmarks.md, Round 14).

    python bench/search_instructions.py                         # gpt3-175b, this checkout
    python bench/search_instructions.py --case llama128 --tree /path/to/old/checkout

The graph is captured once and pickled (capture is not counted); the script then runs under
`valgrind --tool=callgrind` twice, loading the graph with and without calling `search()`, and
prints the difference. Each count takes about 4-5 minutes. Needs valgrind (exit 2 without it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# name -> (model, global batch, seq len, device, devices, pipelines)
CASES = {
    "gpt3": ("gpt3-175b", 1536, 2048, "a100-80gb", 1024, True),
    "gpt3flat": ("gpt3-175b", 1536, 2048, "a100-80gb", 1024, False),
    "llama128": ("llama-70b", 128, 4096, "h100-80gb", 128, True),
}

RUN = """
import pickle, sys
from search.algorithm.ft import SearchOptions, search
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
graph = pickle.load(open(sys.argv[1], "rb"))
job = TrainingJob(global_batch={batch}, seq_len={seq}, precision="bf16")
cluster = make_cluster({device!r}, {devices})
if sys.argv[2] == "1":
    search(graph, cluster, job, SearchOptions(pipeline={pipeline}, accumulate=True))
"""

CAPTURE = """
import pickle, sys
from search.models.capture import capture_model
from search.models.zoo import get_model
pickle.dump(capture_model(get_model({model!r}), {batch}, {seq}), open(sys.argv[1], "wb"))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="gpt3", choices=sorted(CASES))
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to count")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("error: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        raise SystemExit(2)
    if not (Path(args.tree) / "search" / "algorithm" / "ft.py").is_file():
        print(f"error: {args.tree} is not a paretoplan checkout (no search/algorithm/ft.py)", file=sys.stderr)
        raise SystemExit(2)
    model, batch, seq, device, devices, pipeline = CASES[args.case]
    # a fixed string hash: set and dict orders, and so the count, repeat from run to run
    env = dict(os.environ, PYTHONPATH=args.tree, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        graph = os.path.join(tmp, "graph.pkl")
        subprocess.run([sys.executable, "-c", CAPTURE.format(model=model, batch=batch, seq=seq), graph],
                       env=env, check=True, cwd=args.tree)
        script = os.path.join(tmp, "run.py")
        Path(script).write_text(RUN.format(batch=batch, seq=seq, device=device, devices=devices, pipeline=pipeline))

        def count(with_search: str) -> int:
            out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                                  script, graph, with_search], env=env, capture_output=True, text=True, cwd=args.tree)
            for line in out.stderr.splitlines():
                if "Collected" in line:
                    return int(line.split()[-1])
            raise SystemExit(f"error: callgrind gave no count:\n{out.stderr[-2000:]}")

        total, base = count("1"), count("0")
    print(f"{args.case} ({model}, {devices} x {device}, batch {batch}, seq {seq}, "
          f"{'default' if pipeline else 'no-pipeline'}) at {args.tree}: {(total - base) / 1e9:.3f} G instructions")


if __name__ == "__main__":
    main()
