"""One seed derivation: the same parts give the seeds every method has always used."""

import hashlib

import pytest

from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed


def _sha_prefix(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


@pytest.mark.parametrize("parts", [(0, 3, 7, "train"), (42, "page-server", 12), (1,)])
def test_the_seeds_runs_were_made_with(parts):
    text = "/".join(map(str, parts))
    assert derive_seed(*parts) == _sha_prefix(text)  # ClientJob.seed's streams
    assert derive_seed(*parts, bits=AGENT_SEED_BITS) == _sha_prefix(text) >> 1  # the agents'
    assert 0 <= derive_seed(*parts, bits=AGENT_SEED_BITS) < 2**63


def test_a_pinned_value_and_independent_streams():
    assert derive_seed(0, 1, 2, "train") == 0x7A4F3D152306BFA5  # run seed 0, client 1, round 2
    assert len({derive_seed(0, c, r, "train") for c in range(20) for r in range(20)}) == 400
    with pytest.raises(ValueError, match="bits must be in"):
        derive_seed(0, bits=65)
