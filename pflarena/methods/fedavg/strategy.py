"""FedAvg (McMahan et al., 2017): the example-weighted average of the clients' models.

The reading of the paper, decisions and measurements: docs/methods/fedavg.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from pydantic import Field

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.aggregation import weighted_average
from pflarena.strategies.base import PflStrategy

__all__ = ["PERSONAL_MODEL_HELP", "FedAvg", "FedAvgParams", "PersonalModel", "local_result"]

#: What a method without a personalization step of its own reports as a client's P-model.
PersonalModel = Literal["global", "local-result"]
PERSONAL_MODEL_HELP = (
    "the personalized model: 'global' (the global model, the evaluation protocol's reading) "
    "or 'local-result' (the client's latest local-training result before aggregation, the "
    "FedPG paper's reading; the global model until the client first trains)"
)


class FedAvgParams(MethodParams):
    """FedAvg's parameters."""

    personal_model: PersonalModel = Field("global", description=PERSONAL_MODEL_HELP)


def local_result(params: Any, federation: Federation) -> list[Footprint]:
    """What a client keeps with ``personal-model = local-result`` (FedAvg's, FedProx's and
    FedMGDA+'s P-model): its latest local-training result; nothing otherwise."""
    if getattr(params, "personal_model", "global") != "local-result":
        return []
    return [Footprint("its latest local-training result", federation.state_bytes())]


class FedAvg(PflStrategy):
    """Federated Averaging.

    Each sampled client starts from the global model, runs local SGD and returns its model;
    the server replaces the global model by the average of the returned models weighted
    by the clients' numbers of training examples (McMahan et al., 2017, Algorithm 1).
    The personalized model of a client is the global model itself, or with
    ``personal_model="local-result"`` the model it returned from its latest local training
    (kept in its state).
    """

    declaration = MethodDeclaration(
        name="fedavg",
        kind="baseline",
        reference="McMahan et al., Communication-Efficient Learning of Deep Networks from "
        "Decentralized Data, AISTATS 2017",
        summary="the example-weighted average of the clients' models; personalized = global "
        "(or each client's local result)",
        solver="pflarena.methods.fedavg.solver",
        params=FedAvgParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [*super().client_footprint(params, federation), *local_result(params, federation)]

    @property
    def personal_model(self) -> PersonalModel:
        """``fedavg.personal-model``; a method built on FedAvg without that setting (Ditto,
        FedProx…) has a personalized model of its own or the global one, never this switch."""
        return getattr(self.params, "personal_model", "global")

    def train_config(self, server_round: int, node_id: int) -> dict:
        """The base config; ``<method>.personal-model`` when it is not the global model."""
        config = super().train_config(server_round, node_id)
        if self.personal_model != "global":
            config |= self.method_config(**{"personal-model": self.personal_model})
        return config

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
        records = [msg.content[keys.ARRAYS] for msg in valid]
        weights = [float(msg.content[keys.METRICS][keys.NUM_EXAMPLES]) for msg in valid]
        return weighted_average(records, weights), self.train_metrics(valid)
