"""A process that must not outlive its parent: the kernel signals it when the parent dies
(Linux's PR_SET_PDEATHSIG), so no finally of a parent killed by SIGKILL is needed to stop it."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent(sig: signal.Signals = signal.SIGKILL, parent: int | None = None) -> None:
    """Have `sig` sent to this process when its parent (`parent`, the pid it had before a fork;
    by default the current one) dies; exit at once if it already has. A no-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid() if parent is None else parent
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)
