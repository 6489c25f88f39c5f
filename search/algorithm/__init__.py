"""The algorithm, in import order (each module imports only those above it):

- `frontier`: Pareto frontiers as factors (join, reduce, eliminate, read back);
- `chain`: the block stack that FT solves once and pipelines cut into stages;
- `evaluate`: cost tables, and the price of one given plan on a mesh or a pipeline;
- `results`: what a search returns (the `Solution` protocol, its two kinds, frontier points);
- `factor_graph`: one mesh's factor graph and its elimination;
- `pipeline`: the pipeline stage search;
- `ft`: FT, the search over meshes, ZeRO stages and pipeline shapes;
- `exhaustive`: the reference that checks them, imported by none of them.
"""
