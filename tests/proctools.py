"""What tests of process lifetimes share: finding the processes a test left behind."""

from __future__ import annotations

from pathlib import Path


def pids_mentioning(text: str) -> list[int]:
    """The live processes whose command line contains `text` (a run's directory, say)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out
