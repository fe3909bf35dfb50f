"""Local training: every client trains its own model on its own data, with no communication.

The reading of the paper, decisions and measurements: docs/methods/local.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration
from pflarena.strategies.base import PflStrategy

__all__ = ["Local"]


class Local(PflStrategy):
    """The no-federation baseline ("Local only" in the papers' tables).

    Each round the sampled clients train the model they keep in their own state; nothing is
    sent but the round's config, and nothing is aggregated. There is no global model.
    """

    declaration = MethodDeclaration(
        name="local",
        kind="baseline",
        reference='Local training only: no federation (the papers\' "Local" row)',
        summary="each client trains its own model on its own data; nothing is shared",
        solver="pflarena.methods.local.solver",
        global_model=False,
    )
    client_models = (1, "its model")
    expects_arrays = False

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        # The server's arrays are only the shared initialisation; clients keep their own.
        return RecordDict({keys.CONFIG: ConfigRecord(config)})

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        return None, self.train_metrics(valid)
