"""paretoplan: worker."""
