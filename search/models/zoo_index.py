"""The zoo's listing (name, family, kind, parameter count, default sequence length, description),
built once and committed as zoo_index.json: counting parameters builds every model on the meta
device (~2.5 s for the zoo), which made the first GET /api/models take 4.5 s. Reading the index
needs neither torch nor the models.

    python -m search.models.zoo_index        # rewrite zoo_index.json after changing the zoo

tests/search/models/test_zoo_index.py fails when the committed index and the zoo disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

INDEX = Path(__file__).with_name("zoo_index.json")


def load() -> list[dict[str, Any]]:
    """The committed listing, in the zoo's order."""
    return list(json.loads(INDEX.read_text())["models"])


def build() -> list[dict[str, Any]]:
    """The listing computed from the zoo itself (builds every model on meta)."""
    from search.models.zoo import ZOO

    return [{"name": n, "family": s.family, "kind": s.kind, "params": s.param_count(),
             "default_seq_len": s.default_seq_len, "description": s.description} for n, s in ZOO.items()]


def write() -> None:
    INDEX.write_text(json.dumps({"models": build()}, indent=1) + "\n")


if __name__ == "__main__":
    write()
    print(f"wrote {INDEX}")
