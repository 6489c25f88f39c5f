"""paretoplan: search."""
