"""paretoplan: paretoplan."""
