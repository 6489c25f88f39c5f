"""Models in: the OpGraph IR, capture from torch modules and HF configs, the model zoo."""
