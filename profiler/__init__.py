"""paretoplan: profiler."""
