"""paretoplan: service."""
