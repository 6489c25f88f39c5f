"""Errors that mean "the user asked for something that cannot be planned".

The command line turns every `InputError` into a one-line message and exit code 2; the
service (later) turns it into HTTP 422. Anything else escaping is a bug.
"""


class InputError(ValueError):
    """Bad input from the user: unknown model or device, malformed graph, impossible cluster."""


class NoFeasiblePlan(RuntimeError):
    """A valid request for which no plan fits the memory budget (not an input error)."""

    def __init__(self, message: str, least_memory_bytes: int) -> None:
        super().__init__(message)
        self.least_memory_bytes = least_memory_bytes
