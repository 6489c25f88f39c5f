"""Errors that mean "the user asked for something that cannot be planned".

The command line turns every `InputError` into a one-line message and exit code 2; the
service (later) turns it into HTTP 422. Anything else escaping is a bug.
"""


import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError


class InputError(ValueError):
    """Bad input from the user: unknown model or device, malformed graph, impossible cluster."""


class NoFeasiblePlan(RuntimeError):
    """A valid request for which no plan fits the memory budget (not an input error)."""

    def __init__(self, message: str, least_memory_bytes: int) -> None:
        super().__init__(message)
        self.least_memory_bytes = least_memory_bytes


def read_json(path: str | Path, what: str) -> Any:
    """The JSON document in a user's file; InputError naming `what` (\"profile\", \"graph file\")
    when it cannot be read or is not JSON text."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise InputError(f"cannot read {what} {str(p)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {str(p)!r} is not valid JSON (not text)") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{what} {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno}") from None


_NAMED_PROBLEMS = 10  # problems an InputError spells out; the rest are counted


def invalid(e: ValidationError, what: str, where: Callable[[str], str] | None = None) -> InputError:
    """One line from a pydantic error: `what` (\"graph.json: invalid graph\"), then each problem's
    field path (through `where`, e.g. to spell it as a CLI flag) and message, separated by "; "
    (the first ten; how many more after them).

    Every edge that validates a user's document with pydantic raises this, `from None`."""
    def place(err: Any) -> str:
        path = ".".join(str(x) for x in err.get("loc", ()))
        return where(path) if where is not None else (f" at {path}" if path else "")

    errors = e.errors()
    text = f"{what}{place(errors[0])}: {errors[0].get('msg', 'invalid')}"
    for err in errors[1:_NAMED_PROBLEMS]:
        at = place(err).strip()  # without the space that joins the first problem to `what`
        text += f"; {at}: {err.get('msg', 'invalid')}" if at else f"; {err.get('msg', 'invalid')}"
    if len(errors) > _NAMED_PROBLEMS:
        text += f" (and {len(errors) - _NAMED_PROBLEMS} more problems)"
    return InputError(text)
