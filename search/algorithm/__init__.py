"""The algorithm: Pareto frontiers as factors, FT over one mesh, the pipeline stage search, and the
exhaustive reference that checks them (imported by none of them)."""
