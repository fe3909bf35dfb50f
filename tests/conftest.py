import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


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
