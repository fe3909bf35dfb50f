"""FedAvg over part of the model: the server side of the split-model methods.

FedPer, FedRep and FedBABU share the body of the model (:mod:`pflarena.core.model_split`) and keep
the head on the client or fixed; LG-FedAvg shares the head and keeps the body. In each,
only the shared part travels: :class:`PartialFedAvg` sends the shared entries of the server's
model down (one record per round, the same object in every message), checks that each
upload holds exactly those entries, averages them, and writes the average back into the
server's full model, whose other entries stay as they were (the run's initial values). The
part kept on the client never reaches the server, and the server has nothing of it to send.

Evaluation messages carry the shared part too: a client's personalized model is the latest
shared part with its own private part (the authors' codes of FedRep and LG-FedAvg evaluate
every client after copying the new global layers into its local model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from pflarena.core import keys
from pflarena.core.methods import MethodParams, hyphenate
from pflarena.core.model_split import ModelSplit, split_names, split_problem
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.strategies.aggregation import as_numpy, as_record, weighted_mean
from pflarena.strategies.base import StrategySetup

__all__ = ["PartialFedAvg", "split_problem"]


class PartialFedAvg(FedAvg):
    """FedAvg of the shared part of a body/head split; the other part never travels.

    The method's parameters (:attr:`params`) hold the split and the average: the number of
    final weighted layers on the head side (:attr:`layers_field`, ``head_layers`` by
    default, :func:`pflarena.core.model_split.split_names`) and ``weighting`` (``examples``: the
    shared part is averaged with weights n_i / n, FedAvg; ``uniform``: with weight 1 / |S|
    per sampled client).

    Parameters
    ----------
    trainable
        The model's trainable parameter names, in state order (from the run's setup).
    """

    #: Which side of the split the clients share: "body" (FedPer, FedRep, FedBABU) or
    #: "head" (LG-FedAvg).
    shared: ClassVar[Literal["body", "head"]] = "body"
    #: The params field counting the head's final weighted layers; it travels under its
    #: run-config key (LG-FedAvg: ``global_layers``, the shared head).
    layers_field: ClassVar[str] = "head_layers"

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> PartialFedAvg:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    def __init__(
        self, params: MethodParams | None = None, *, trainable: Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        self.trainable = tuple(trainable)
        self._split: ModelSplit | None = None
        self._full: ArrayRecord | None = None

    @property
    def head_layers(self) -> int:
        """The final weighted layers on the head side of the split (:attr:`layers_field`)."""
        return getattr(self.params, self.layers_field)

    # ------------------------------------------------------------------ the split
    def split_of(self, arrays: ArrayRecord) -> ModelSplit:
        """The body/head split of the server's model (taken once, from its entry names)."""
        if self._split is None:
            trainable = self.trainable or tuple(arrays.keys())
            self._split = split_names(list(arrays.keys()), trainable, self.head_layers)
        return self._split

    def shared_names(self, arrays: ArrayRecord) -> tuple[str, ...]:
        split = self.split_of(arrays)
        return split.body if self.shared == "body" else split.head

    def shared_part(self, arrays: ArrayRecord) -> ArrayRecord:
        """The shared entries of ``arrays`` (the same Array objects, not copies)."""
        return ArrayRecord({name: arrays[name] for name in self.shared_names(arrays)})

    def split_config(self, server_round: int) -> dict[str, Any]:
        """What the solver needs to take the same split: the method's ``head-layers``."""
        return self.method_config(**{hyphenate(self.layers_field): self.head_layers})

    # ------------------------------------------------------------------ messages
    def train_config(self, server_round: int, node_id: int) -> dict:
        return {**super().train_config(server_round, node_id), **self.split_config(server_round)}

    def evaluate_config(self, server_round: int) -> dict:
        return {**super().evaluate_config(server_round), **self.split_config(server_round)}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages with only the shared part; replies are checked against it."""
        self._full = arrays
        return super().configure_train(server_round, self.shared_part(arrays), config, grid)

    def evaluate_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The shared part: with its private part, each client's personalized model."""
        return self.shared_part(arrays)

    # ------------------------------------------------------------------ aggregation
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the uploaded shared parts; the server model's other entries are kept."""
        valid = self.valid_train_replies(replies)
        if not valid or self._full is None:
            return None, None
        uploads = [msg.content[keys.ARRAYS] for msg in valid]
        if self.params.weighting == "examples":
            weights = [float(msg.content[keys.METRICS][keys.NUM_EXAMPLES]) for msg in valid]
        else:
            weights = [1.0] * len(valid)
        average = weighted_mean(uploads, weights)
        merged = as_numpy(self._full)
        merged.update(average)
        return as_record(merged), self.train_metrics(valid)

    def run_summary(self) -> dict[str, Any]:
        split = self._split
        summary: dict[str, Any] = {
            "shared": self.shared,
            "head-layers": self.head_layers,
            "weighting": self.params.weighting,
        }
        if split is not None:
            summary |= {"body": list(split.body), "head": list(split.head)}
        return summary
