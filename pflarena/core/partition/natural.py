"""``natural``: natively federated data sets come one share per client, nothing to divide."""

from __future__ import annotations

from pflarena.core.partition.registry import PartitionSpec, register_partition

__all__: list[str] = []

register_partition(PartitionSpec("natural", None, natural=True))
