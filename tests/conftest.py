"""Test helpers shared by the suites (tests/<package>/...) are importable by module name."""

import sys
from pathlib import Path

for sub in ("search",):
    sys.path.insert(0, str(Path(__file__).parent / sub))
