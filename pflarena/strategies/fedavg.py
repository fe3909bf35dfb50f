"""FedAvg (McMahan et al., 2017): the example-weighted average of the clients' models."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration
from pflarena.strategies.base import PflStrategy

__all__ = ["FedAvg"]


class FedAvg(PflStrategy):
    """Federated Averaging.

    Each sampled client starts from the global model, runs local SGD and returns its model;
    the server replaces the global model by the average of the returned models weighted
    by the clients' numbers of training examples (McMahan et al., 2017, Algorithm 1).
    The personalized model of a client is the global model itself.
    """

    declaration = MethodDeclaration(
        name="fedavg",
        kind="baseline",
        reference="McMahan et al., Communication-Efficient Learning of Deep Networks from "
        "Decentralized Data, AISTATS 2017",
        summary="the example-weighted average of the clients' models; personalized = global",
        solver="pflarena.client.solvers.fedavg",
    )

    def check_train_reply(self, content: RecordDict) -> str | None:
        """The update, and a positive ``num-examples`` to weight it by."""
        examples = content.metric_records[keys.METRICS].get(keys.NUM_EXAMPLES)
        if not isinstance(examples, int | float) or examples <= 0:
            return (
                f"metric {keys.NUM_EXAMPLES!r} must be > 0 to weight the update, got {examples!r}"
            )
        return super().check_train_reply(content)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        contents = [msg.content for msg in valid]
        return aggregate_arrayrecords(contents, keys.NUM_EXAMPLES), self.train_metrics(valid)
