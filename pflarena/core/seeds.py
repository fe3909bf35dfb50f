"""Seeds derived from what a random stream is for: one function for every process.

A stream is named by its parts (the run's seed, a client, a round, a purpose); the same parts
give the same seed in every process (the ServerApp, a SuperNode's ClientApp, a resumed run)
and different parts independent streams. Python's ``hash`` is salted per process, and numpy's
``SeedSequence`` takes integers only, so the parts are hashed with SHA-256.
"""

from __future__ import annotations

import hashlib

__all__ = ["AGENT_SEED_BITS", "derive_seed"]

#: The width of the seeds of the DDPG agents and of the methods that took their seeds from the
#: same helper (PAGE, Dap-FL, SplitGP's auxiliary classifier, FedRecon): 63 bits, kept so that
#: their runs reproduce; everything else (``ClientJob.seed``) uses the full 64.
AGENT_SEED_BITS = 63


def derive_seed(*parts: object, bits: int = 64) -> int:
    """A ``bits``-bit seed from ``parts``: the first 8 bytes of SHA-256 of the parts joined by
    ``/``, read little-endian, shortened to their top ``bits`` bits."""
    if not 1 <= bits <= 64:
        raise ValueError(f"bits must be in [1, 64], got {bits}")
    text = "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> (64 - bits)
