"""paretoplan: profiler - measured costs for the search's cost model (docs/cli.md, Profiling).

- `ops`: the distinct op signatures a search will price, timed forward and backward;
- `collectives`: all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over spawned
  gloo (CPU) or NCCL (GPU) ranks, per group size and message size;
- `fit`: least-squares alpha-beta fits;
- `run`: one profiling run, merged into a DeviceProfile (search/prices/profile.py) over a base profile;
- `calibrate`: correction factors fitted to measured runs (RunReports).
"""
