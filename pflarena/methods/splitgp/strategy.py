"""SplitGP (Han, Kim, Choi, Brinton and Moon, INFOCOM 2023): split learning that balances
personalization (client side) and generalization (server side).

"SplitGP: Achieving Both Generalization and Personalization in Federated Learning". The
model is split into a client-side part φ (the body) and a server-side part θ (the last
``head-layers`` weighted layers); every client adds a small auxiliary classifier κ_k on φ's
output. Each round the sampled clients train, in the split-learning way, the multi-exit
loss ``γ ℓ(κ_k(φ_k(x)), y) + (1 − γ) ℓ(θ_k(φ_k(x)), y)``: the client-side model (φ_k, κ_k)
learns each client's own task, the full model (φ, θ) every client's. The server averages
θ_k into θ̄ and the client-side models into (φ̄, κ̄), weighted by examples, and each client
continues from ``λ (φ_k, κ_k) + (1 − λ) (φ̄, κ̄)``: λ balances personalization (λ = 1, local
client-side models) against generalization (λ = 0, one shared client-side model, a
multi-exit FedAvg). At inference a client predicts locally when its client-side output's
entropy is at most ``entropy-threshold`` and offloads the sample to the server's θ̄
otherwise.

How the split training runs over Flower's messages (the solver's docstring has the detail):
both sides of each minibatch's exchange run in the client's process, so the train message
carries θ̄ down and the reply carries θ_k back next to the client-side upload (φ_k, κ_k);
the paper's per-minibatch traffic (smashed data up, gradients down) is reported as the
round's ``splitgp-smashed-bytes-up``/``-down`` (``train.server``), and
``splitgp-client-upload-bytes`` is the paper's upload of client-side models, while the
round's ``bytes_up`` also counts the θ_k the simulation returns.

The global model is the full model (φ̄, θ̄); the personalized prediction is the inference
rule with the client's (φ_k, κ_k) and θ̄. κ̄ starts as a seeded linear layer made by the
server (the same for every client), kept in the checkpoint.

Defaults: γ = 0.5 and λ = 0.2, the values the third-party reimplementations of the paper's
experiments use (not confirmed from the paper's text); a server side of the last two weighted
layers; an entropy threshold of 0.5 nats (the paper varies it to trade accuracy against
offloading; this value is not the paper's, see ``docs/methods/splitgp.md``).

The reading of the paper, decisions and measurements: docs/methods/splitgp.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from torch import nn

from pflarena.algorithms.heads import feature_size, first_head_layer
from pflarena.core import keys
from pflarena.core.footprint import FLOAT32, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.model_split import ModelSplit, layer_owners, split_names
from pflarena.core.models import build_model
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.methods.splitgp import keys as splitgp_keys
from pflarena.methods.splitgp.params import SplitGPParams
from pflarena.strategies.aggregation import as_numpy, as_record, weighted_mean
from pflarena.strategies.base import StrategySetup, array_problem, record_nbytes

__all__ = ["SplitGP", "SplitGPParams", "initial_aux_classifier"]


def initial_aux_classifier(
    model: nn.Module,
    layer: str,
    input_shape: tuple[int, ...],
    tokens: bool,
    num_classes: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """κ̄'s initial value: a linear layer from the input of ``layer`` (flattened) to the
    classes, initialised like ``nn.Linear`` under ``seed``."""
    dtype = torch.long if tokens else torch.float32
    size = feature_size(model, layer, torch.zeros((1, *input_shape), dtype=dtype))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        aux = nn.Linear(size, num_classes)
    return {name: value.detach().numpy().copy() for name, value in aux.state_dict().items()}


class SplitGP(FedAvg):
    """SplitGP's server: averages of θ_k and of the client-side models (φ_k, κ_k).

    Parameters
    ----------
    aux
        κ̄'s initial arrays (``weight``, ``bias``), :func:`initial_aux_classifier`.
    trainable
        The model's trainable parameter names, in state order.
    params
        :class:`SplitGPParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="splitgp",
        kind="baseline",
        reference="Han, Kim, Choi, Brinton and Moon, SplitGP: Achieving Both Generalization "
        "and Personalization in Federated Learning, IEEE INFOCOM 2023",
        summary="split model: client side with an auxiliary classifier (personalization, "
        "λ-mixed with the average), server side averaged (generalization); γ-weighted "
        "two-exit loss; entropy-thresholded offloading at inference",
        solver="pflarena.methods.splitgp.solver",
        params=SplitGPParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The client side φ_k (the body) and the auxiliary classifier κ_k."""
        split = federation.split(params.head_layers)
        return [
            Footprint("its client-side model", federation.entry_bytes(split.body)),
            Footprint("its auxiliary classifier", cls.aux_bytes(params, federation)),
        ]

    @classmethod
    def aux_bytes(cls, params: Any, federation: Federation) -> int:
        """The auxiliary classifier's bytes: a linear layer from the head's first layer's
        input to the classes. Where that layer is linear its input is its weight's second
        dimension; a convolutional one's (a feature map) is not in the model's shapes, and
        the head's own bytes stand for it."""
        first = layer_owners(federation.trainable)[-params.head_layers]
        weight = federation.shapes.get(f"{first}.weight" if first else "weight", ())
        if len(weight) == 2:
            return FLOAT32 * (weight[1] + 1) * federation.num_classes
        return federation.entry_bytes(federation.split(params.head_layers).head)

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The server's κ, the clients' mean, beside the model."""
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint("the auxiliary classifier κ", cls.aux_bytes(params, federation)),
        ]

    checkpointed = {"aux": "splitgp-aux/"}

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> SplitGP:
        cfg = setup.cfg
        params = setup.params
        assert isinstance(params, SplitGPParams)
        info = cfg.data_info()
        model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
        layer = first_head_layer(model, params.head_layers)
        aux = initial_aux_classifier(
            model,
            layer,
            tuple(info.input_shape),
            bool(info.tokens),
            info.num_classes,
            derive_seed(cfg.seed, "splitgp-aux-classifier", bits=AGENT_SEED_BITS),
        )
        return cls(params, **setup.common(cls.declaration), aux=aux, trainable=setup.trainable)

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        aux: dict[str, np.ndarray] | None = None,
        trainable: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        if aux is None or set(aux) != {"weight", "bias"}:
            raise ValueError("splitgp needs the auxiliary classifier's initial weight and bias")
        self.trainable = tuple(trainable)
        #: κ̄: the average auxiliary classifier (initially the server's seeded one)
        self.aux = {name: np.asarray(value) for name, value in aux.items()}
        self._split: ModelSplit | None = None
        self._aux_record: ArrayRecord | None = None
        self._full: ArrayRecord | None = None

    # ------------------------------------------------------------------ the split
    def split_of(self, arrays: ArrayRecord) -> ModelSplit:
        if self._split is None:
            trainable = self.trainable or tuple(arrays.keys())
            self._split = split_names(list(arrays.keys()), trainable, self.params.head_layers)
        return self._split

    def aux_record(self) -> ArrayRecord:
        """κ̄ as one record, made once per round and shared by every message."""
        if self._aux_record is None:
            self._aux_record = as_record(self.aux)
        return self._aux_record

    # ------------------------------------------------------------------ messages
    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(),
        }

    def evaluate_config(self, server_round: int) -> dict:
        return {**super().evaluate_config(server_round), **self.params_config()}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._full = arrays
        self.split_of(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        content = super().train_content(server_round, node_id, arrays, config)
        content[splitgp_keys.AUX] = self.aux_record()
        return content

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The protocol's evaluation (the full model (φ̄, θ̄) to the round's clients),
        with κ̄."""
        record = RecordDict(
            {
                keys.ARRAYS: self.evaluate_arrays(arrays),
                splitgp_keys.AUX: self.aux_record(),
                keys.CONFIG: ConfigRecord({**dict(config), **self.evaluate_config(server_round)}),
            }
        )
        return [
            Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node_id)
            for node_id in self.evaluation_nodes(grid, server_round)
        ]

    # ------------------------------------------------------------------ replies
    def check_train_reply(self, content: RecordDict) -> str | None:
        """φ_k, κ_k and θ_k, each with the names, shapes and dtypes of the server's."""
        examples = content.metric_records[keys.METRICS].get(keys.NUM_EXAMPLES)
        if not isinstance(examples, int | float) or examples <= 0:
            return (
                f"metric {keys.NUM_EXAMPLES!r} must be > 0 to weight the update, got {examples!r}"
            )
        if self._full is None:
            return "no round in progress"
        split = self.split_of(self._full)
        body = ArrayRecord({name: self._full[name] for name in split.body})
        head = ArrayRecord({name: self._full[name] for name in split.head})
        return (
            array_problem(content, body, keys.ARRAYS)
            or array_problem(content, self.aux_record(), splitgp_keys.AUX)
            or array_problem(content, head, splitgp_keys.SERVER_SIDE)
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """φ̄, κ̄ and θ̄: example-weighted averages of the uploads."""
        valid = self.valid_train_replies(replies)
        if not valid or self._full is None:
            return None, None
        weights = [float(msg.content[keys.METRICS][keys.NUM_EXAMPLES]) for msg in valid]
        merged = as_numpy(self._full)
        merged.update(weighted_mean([m.content[keys.ARRAYS] for m in valid], weights))
        merged.update(weighted_mean([m.content[splitgp_keys.SERVER_SIDE] for m in valid], weights))
        self.aux = weighted_mean([m.content[splitgp_keys.AUX] for m in valid], weights)
        self._aux_record = None
        metrics = self.train_metrics(valid)
        assert metrics is not None
        for name in (splitgp_keys.SMASHED_UP, splitgp_keys.SMASHED_DOWN):
            metrics[name] = int(sum(int(m.content[keys.METRICS].get(name, 0)) for m in valid))
        metrics["splitgp-client-upload-bytes"] = int(
            sum(
                record_nbytes(
                    RecordDict({k: m.content[k] for k in (keys.ARRAYS, splitgp_keys.AUX)})
                )
                for m in valid
            )
        )
        return as_record(merged), metrics

    def evaluation_details(self, reported: dict[int, MetricRecord]) -> dict[str, Any]:
        """How the inference rule split each client's test samples: the fraction offloaded to
        the server, and the accuracy of the client-side model (φ_k, κ_k) alone, per client and
        over the clients (unweighted mean, and pooled over their samples). Clients whose reply
        lacks the counts (not a SplitGP solver) or reports impossible ones are left out."""
        per_client: dict[str, dict[str, float]] = {}
        offloaded = client_correct = samples = 0
        for client_id, metrics in reported.items():
            sent = metrics.get(splitgp_keys.OFFLOADED)
            correct = metrics.get(splitgp_keys.CLIENT_SIDE_CORRECT)
            count = metrics.get(keys.PERSONALIZED_COUNT)
            if not all(isinstance(v, int) for v in (sent, correct, count)):
                continue
            if not (count > 0 and 0 <= sent <= count and 0 <= correct <= count):
                continue
            per_client[str(client_id)] = {
                "offloaded": sent / count,
                "client-side": correct / count,
            }
            offloaded += sent
            client_correct += correct
            samples += count
        if not per_client:
            return {}
        return {
            "offloaded": offloaded / samples,
            "client-side-mean": float(np.mean([c["client-side"] for c in per_client.values()])),
            "client-side-pooled": client_correct / samples,
            "per_client": per_client,
        }

    # ------------------------------------------------------------------ checkpoints
    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)  # κ̄: ``checkpointed``
        self._aux_record = None

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
