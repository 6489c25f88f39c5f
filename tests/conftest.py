"""Marks of the whole suite. The fast subset (`pytest -m "not slow"`) leaves out every test of the
three kinds that need more than this process: each is marked slow here too, so one deselection
covers them. A test is of a kind when it says so (`pytest.mark.processes`, a module's
`pytestmark`, a `pytest.param(..., marks=...)`) or when it uses a fixture that starts such things.
"""

from __future__ import annotations

import pytest

SLOW_KINDS = ("processes", "browser", "postgres")

# fixtures that start processes or a browser, with the marks every test using them gets
FIXTURE_KINDS: dict[str, tuple[str, ...]] = {
    "tiny_profile": ("processes",),  # tests/profiler: a real profile, its collectives on 2 gloo processes
    "family_runs": ("processes",),  # tests/worker: one torchrun launch of 4 gloo processes
    "runs": ("processes",),  # tests/worker: a module's plans in one torchrun launch of 4 gloo processes
    "live": ("processes",),  # tests/service: paretoplan serve and a worker, as processes
    "browser": ("browser",),  # tests/web: Chromium
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for name, kinds in FIXTURE_KINDS.items():
            if name in fixtures:
                for kind in kinds:
                    item.add_marker(kind)
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("processes"):
            item.add_marker(pytest.mark.xdist_group(_process_group(item)))


def _process_group(item: pytest.Item) -> str:
    """Under `pytest -n 2 --dist loadgroup -m processes` (.ci/run), the tests that launch training
    ranks run one after the other on one xdist worker, since each keeps both cores busy (two such
    launches at once, 8 ranks on 2 cores, made the suite slower: 23 min against 18 one after the
    other), while the service and dashboard tests, which mostly wait on HTTP, a database or a
    browser, run beside them on the other worker."""
    parts = item.path.parts
    return "services" if "service" in parts or "web" in parts else "ranks"
