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
    # tests/worker (shared.py): the plans of every executor module in one torchrun launch of 4 gloo processes
    "shared_launch": ("processes",),
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


# Under `pytest -n 2 --dist loadgroup -m processes` (.ci/run), the tests that launch training ranks
# run one after the other on one xdist worker, since each keeps both cores busy (8 ranks on 2
# cores only contend), while
# the service and dashboard tests, which mostly wait on HTTP, a database or a browser, run beside
# them on the other worker. The groups are made here, by the test's directory, in the scheduler
# itself: xdist's own `xdist_group` mark renames the test (`item._nodeid`), which pytest 9 ignores
# (its node ids are `item._id`), so under pytest 9 every test became a group of its own, ranks ran
# on both workers at once and a module's shared launch ran once on each.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByKind(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return process_group(nodeid)

    return ByKind(config, log)


def process_group(nodeid: str) -> str:
    """The xdist group of a test under `--dist loadgroup`: "services" for tests/service and
    tests/web, "ranks" for the rest."""
    return "services" if nodeid.startswith(("tests/service/", "tests/web/")) else "ranks"
