"""paretoplan: web."""
