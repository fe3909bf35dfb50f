import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

sys.path.insert(0, str(Path(__file__).parent))

#: Set to 1 by ``.ci/run``, which installs every command the suite runs: a test that lacks one
#: fails there, saying which, where a developer's ``make test`` skips it, saying which.
REQUIRE_TOOLS = "PFLARENA_REQUIRE_TOOLS"


@pytest.fixture
def lacking() -> Callable[[str], NoReturn]:
    """``lacking(reason)`` ends a test that cannot run here for want of a command (``reason``
    names it): a skip, or a failure under ``PFLARENA_REQUIRE_TOOLS=1`` (CI), so that a CI
    step never passes with the test left out."""

    def end(reason: str) -> NoReturn:
        __tracebackhide__ = True  # reported where the test calls it
        if os.environ.get(REQUIRE_TOOLS) == "1":
            pytest.fail(f"{REQUIRE_TOOLS}=1, but {reason}", pytrace=False)
        pytest.skip(reason)

    return end


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    import torch

    torch.set_num_threads(1)


#: The modules that take longest (a loopback deployment each, minutes), run first.
LONGEST = ("test_deployment.py", "test_deployment_faults.py", "test_deployment_secure.py")


def pytest_collection_modifyitems(config, items):
    """The longest work first, so that the workers of ``make test`` (pytest-xdist, one test
    module per unit: ``--dist loadfile --no-loadscope-reorder``) finish together: the
    deployment modules, then the modules with slow tests, then the rest. A module's own
    order is kept (a deployment's last test stops one of its nodes)."""

    def rank(item: pytest.Item) -> int:
        if item.path.name in LONGEST:
            return LONGEST.index(item.path.name)
        return len(LONGEST) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)


#: The file the in-process engine writes where a client call ran past its time
#: (``pflarena.runtime.inprocess.STUCK_CALLS_FILE``; not imported here, to keep this file's
#: imports light).
STUCK_CALLS = "stuck-calls.txt"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report gets the ``stuck-calls.txt`` files of its ``tmp_path`` (where
    a client that never answered was), so that a hang in CI can be read from its log."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp_path, Path) and tmp_path.is_dir():
        for path in sorted(tmp_path.rglob(STUCK_CALLS))[:3]:
            text = path.read_text(errors="replace")
            report.sections.append((f"where the stuck calls were: {path}", text[-12000:]))
    return report
