"""Errors the operations raise; the app turns each into its HTTP status with {"detail": message}."""


class NotFound(LookupError):
    """404: no such job, strategy, run or profile."""


class Conflict(RuntimeError):
    """409: the state does not allow it (a lease lost, a job not searched yet)."""
