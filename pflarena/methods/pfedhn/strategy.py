"""pFedHN (Shamsian, Navon, Fetaya and Chechik, ICML 2021): a hypernetwork on the server.

"Personalized Federated Learning using Hypernetworks". The server holds a hypernetwork
h(·; φ) and one learned embedding v_i per client; client i's personalized model is
θ_i = h(v_i; φ) (:class:`HyperNetwork`). The objective is (Eq. 1, 2)::

    min_{φ, v_1..v_n} (1/n) Σ_i L_i(h(v_i; φ))

Algorithm 1, for each sampled client i:

1. the server generates θ_i = h(v_i; φ) and sends it;
2. the client runs its local training from θ_i to θ̃_i and returns it;
3. with Δθ_i = θ_i − θ̃_i standing for ∇_{θ_i} L_i (exact for one SGD step of unit size),
   the chain rule gives the updates (Eq. 4)::

       φ ← φ − α (∇_φ θ_i)ᵀ Δθ_i,      v_i ← v_i − α (∇_{v_i} θ_i)ᵀ Δθ_i

   (:func:`hypernetwork_gradients`: one vector-Jacobian product through the generated
   weights).

The personalized model is h(v_i; φ), generated for every evaluation; there is no global
model. The hypernetwork follows the authors' code (AvivSham/pFedHN): an embedding table, an
MLP of ``hidden-layers`` + 1 linear layers of ``hidden`` units with ReLUs between them, and
one linear head per target parameter; embedding size 1 + n/4 (``embed-dim=0``), 100 hidden
units, 3 hidden layers; SGD with learning rate 0.01, momentum 0.9 and weight decay 1e-3 on
the server (``embed-lr=0``: the same rate for the embeddings), gradient norms clipped at 50.
The paper's local training is 50 steps of SGD (learning rate 5e-3, momentum 0.9, batch 64);
here it is the run's local-training settings, as for every method.

Several clients per round: the paper's Algorithm 1 samples one client per step. Here every
sampled client's gradient is taken at the φ that generated its model (the round's), and the
optimizer then steps once per client, in client-id order, as the sequential algorithm would
with those clients. Models with buffers (BatchNorm statistics) are refused: the hypernetwork
generates trainable parameters only (the paper's models have none).

The reading of the paper, decisions and measurements: docs/methods/pfedhn.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from pydantic import Field
from torch import nn

from pflarena.core import keys
from pflarena.core.datasets import dataset_info
from pflarena.core.footprint import FLOAT32, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.models import build_model
from pflarena.strategies.base import PflStrategy

__all__ = ["HyperNetwork", "PFedHN", "PFedHNParams", "hypernetwork_gradients"]


class PFedHNParams(MethodParams):
    """pFedHN's parameters; defaults from the authors' code."""

    server_lr: float = Field(0.01, gt=0, description="α: the hypernetwork's SGD learning rate")
    embed_lr: float = Field(
        0.0, ge=0, description="learning rate of the client embeddings (0: server-lr)"
    )
    server_momentum: float = Field(0.9, ge=0, lt=1, description="the hypernetwork's SGD momentum")
    server_weight_decay: float = Field(
        1e-3, ge=0, description="the hypernetwork's SGD weight decay (embeddings included)"
    )
    embed_dim: int = Field(0, ge=0, description="embedding size (0: 1 + num-clients/4)")
    hidden: int = Field(100, ge=1, description="units of the hypernetwork's hidden layers")
    hidden_layers: int = Field(3, ge=0, description="hidden-to-hidden layers of its MLP")
    grad_clip: float = Field(
        50.0, ge=0, description="clip the hypernetwork's gradient norm per step (0: never)"
    )


class HyperNetwork(nn.Module):
    """h(v_i; φ): client embedding → MLP → one linear head per target parameter.

    Parameters
    ----------
    num_clients
        Rows of the embedding table.
    target
        The generated parameters' names and shapes, in the target model's order.
    """

    def __init__(
        self,
        num_clients: int,
        target: Mapping[str, Sequence[int]],
        *,
        embed_dim: int,
        hidden: int,
        hidden_layers: int,
    ) -> None:
        super().__init__()
        self.names = list(target)
        self.shapes = [tuple(int(s) for s in target[name]) for name in self.names]
        self.embeddings = nn.Embedding(num_clients, embed_dim)
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden)]
        for _ in range(hidden_layers):
            layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleList(
            nn.Linear(hidden, int(np.prod(shape, dtype=np.int64))) for shape in self.shapes
        )

    def forward(self, client: int) -> dict[str, torch.Tensor]:
        index = torch.tensor([client], dtype=torch.long, device=self.embeddings.weight.device)
        features = self.mlp(self.embeddings(index))
        return {
            name: head(features).view(shape)
            for name, shape, head in zip(self.names, self.shapes, self.heads, strict=True)
        }


def hypernetwork_gradients(
    net: HyperNetwork, client: int, delta: Mapping[str, torch.Tensor]
) -> list[torch.Tensor]:
    """(∇ θ_i)ᵀ Δθ_i for every hypernetwork parameter (embeddings included), with θ_i =
    h(v_i; φ) at the net's current φ: the update direction of Algorithm 1."""
    generated = net(client)
    return list(
        torch.autograd.grad(
            [generated[name] for name in net.names],
            list(net.parameters()),
            grad_outputs=[delta[name].to(generated[name].dtype) for name in net.names],
            allow_unused=True,
        )
    )


class PFedHN(PflStrategy):
    """pFedHN: a server hypernetwork generates each client's model from its embedding.

    Parameters
    ----------
    target
        The target model's trainable parameters: names and shapes.
    params
        :class:`PFedHNParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="pfedhn",
        kind="baseline",
        reference="Shamsian, Navon, Fetaya and Chechik, Personalized Federated Learning "
        "using Hypernetworks, ICML 2021",
        summary="a server hypernetwork maps learned client embeddings to each client's model; "
        "clients train it and return the update, which trains the hypernetwork and embedding",
        solver="pflarena.methods.pfedhn.solver",
        params=PFedHNParams,
        global_model=False,
    )

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The hypernetwork with its SGD momentum: one embedding per client (of size
        ``embed-dim``, by default 1 + N/4, so that the embeddings grow as N²/4), and heads
        that map ``hidden`` units to every model parameter; and a gradient of the whole
        hypernetwork per reply of the round, all computed at the φ that generated the
        models before the first step (Algorithm 1 run sequentially)."""
        n, f, h = federation.num_clients, federation, params.hidden
        embed = cls.embedding_dim(params, n)
        weights = cls.hypernetwork_weights(params, federation)
        return [
            *super().server_footprint(params, federation),
            Footprint(f"the client embeddings and their momentum (2 x {n} x {embed} float32)",
                      2 * n * embed * FLOAT32),
            Footprint(f"the heads and their momentum (2 x {h} x {f.model_params} float32)",
                      2 * h * f.model_params * FLOAT32),
            # aggregate_train computes every reply's gradient at the same φ before it steps
            Footprint(f"the round's hypernetwork gradients, one per reply ({f.sampled} x "
                      f"{weights} float32)", f.sampled * weights * FLOAT32),
        ]  # fmt: skip

    @staticmethod
    def embedding_dim(params: Any, num_clients: int) -> int:
        """A client embedding's size: ``embed-dim``, by default 1 + N/4."""
        return params.embed_dim or int(1 + num_clients / 4)

    @classmethod
    def hypernetwork_weights(cls, params: Any, federation: Federation) -> int:
        """Every parameter of the hypernetwork: the embeddings, its MLP, the heads (with
        biases)."""
        n, h = federation.num_clients, params.hidden
        embed = cls.embedding_dim(params, n)
        weights = n * embed + (embed * h + h) + params.hidden_layers * (h * h + h)
        return weights + h * federation.model_params + federation.model_params

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The hypernetwork φ and its SGD momentum."""
        weights = cls.hypernetwork_weights(params, federation)
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(f"the hypernetwork and its momentum (2 x {weights} float32)",
                      2 * weights * FLOAT32),
        ]  # fmt: skip

    @classmethod
    def from_setup(cls, setup) -> PFedHN:
        cfg = setup.cfg
        info = dataset_info(cfg.dataset)
        model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        buffers = [name for name in model.state_dict() if name not in trainable]
        if buffers:
            raise ValueError(
                f"pfedhn generates trainable parameters only; model {cfg.model_name()!r} has "
                f"buffers ({', '.join(buffers[:3])}...): choose a model without BatchNorm"
            )
        target = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
        return cls(setup.params, **setup.common(cls.declaration), target=target)

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        target: Mapping[str, Sequence[int]],
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        if self.num_clients is None:
            raise ValueError("pfedhn needs num_clients (one embedding per client)")
        params = self.params
        #: the embedding size in use (``embed-dim``, or 1 + num-clients/4 where it is 0)
        self.embedding_size = self.embedding_dim(params, self.num_clients)
        #: the embeddings' learning rate in use (``embed-lr``, or ``server-lr`` where it is 0)
        self.embedding_lr = params.embed_lr or params.server_lr
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.net = HyperNetwork(
                self.num_clients,
                target,
                embed_dim=self.embedding_size,
                hidden=params.hidden,
                hidden_layers=params.hidden_layers,
            )
        self.net.requires_grad_(True)
        embedding = [self.net.embeddings.weight]
        others = [p for name, p in self.net.named_parameters() if not name.startswith("embeddings")]
        self.optimizer = torch.optim.SGD(
            [{"params": others}, {"params": embedding, "lr": self.embedding_lr}],
            lr=params.server_lr,
            momentum=params.server_momentum,
            weight_decay=params.server_weight_decay,
        )
        #: node id -> the client id whose model it was sent this round (None: unknown node)
        self._sent_to: dict[int, int | None] = {}

    # ------------------------------------------------------------------ models
    def generate(self, client: int, like: ArrayRecord) -> ArrayRecord:
        """θ_i = h(v_i; φ) as an ArrayRecord in the layout (order, dtypes) of ``like``."""
        with torch.no_grad():
            generated = self.net(client)
        out = {}
        for name in like.keys():
            dtype = like[name].numpy().dtype
            out[name] = Array(np.ascontiguousarray(generated[name].numpy().astype(dtype)))
        return ArrayRecord(out)

    # ------------------------------------------------------------------ checkpoints
    # a torch network's state dict and its optimiser's momentum buffers: by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()
        for name, value in self.net.state_dict().items():
            arrays[f"pfedhn/net/{name}"] = value.numpy().copy()
        for index, param in enumerate(self.net.parameters()):
            buffer = self.optimizer.state.get(param, {}).get("momentum_buffer")
            if buffer is not None:
                arrays[f"pfedhn/momentum/{index}"] = buffer.numpy().copy()
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        state = {
            name: torch.as_tensor(arrays[f"pfedhn/net/{name}"]) for name in self.net.state_dict()
        }
        self.net.load_state_dict(state)
        self.optimizer.state.clear()
        for index, param in enumerate(self.net.parameters()):
            key = f"pfedhn/momentum/{index}"
            if key in arrays:
                self.optimizer.state[param] = {"momentum_buffer": torch.as_tensor(arrays[key])}

    # ------------------------------------------------------------------ messages
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent_to = {}
        return super().configure_train(server_round, arrays, config, grid)

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        client = self.client_ids.get(node_id)
        self._sent_to[node_id] = client
        # a node whose client id is unknown (none after round 0) trains the initial model;
        # its reply cannot be attributed to an embedding and is not used
        model = arrays if client is None else self.generate(client, arrays)
        return RecordDict({keys.ARRAYS: model, keys.CONFIG: ConfigRecord(config)})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Each of the round's clients evaluates its own generated model h(v_i; φ)."""
        settings = ConfigRecord({**dict(config), **self.evaluate_config(server_round)})
        messages = []
        for node_id in self.evaluation_nodes(grid, server_round):
            client = self.client_ids.get(node_id)
            model = arrays if client is None else self.generate(client, arrays)
            messages.append(
                Message(
                    content=RecordDict({keys.ARRAYS: model, keys.CONFIG: settings}),
                    message_type=MessageType.EVALUATE,
                    dst_node_id=node_id,
                )
            )
        return messages

    # ------------------------------------------------------------------ replies
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        # every gradient at the φ that generated the models, then one step per client
        steps: list[tuple[int, list[torch.Tensor]]] = []
        delta_norms = []
        for msg in valid:
            node = msg.metadata.src_node_id
            client = int(msg.content[keys.METRICS][keys.CLIENT_ID])
            if self._sent_to.get(node, client) != client:
                continue  # trained the initial model sent to an unknown node
            with torch.no_grad():
                generated = self.net(client)
            trained = msg.content[keys.ARRAYS]
            delta = {
                name: generated[name]
                - torch.as_tensor(trained[name].numpy()).to(generated[name].dtype)
                for name in self.net.names
            }
            delta_norms.append(float(torch.sqrt(sum((d**2).sum() for d in delta.values()))))
            steps.append((client, hypernetwork_gradients(self.net, client, delta)))
        for _, grads in steps:
            self.optimizer.zero_grad(set_to_none=True)
            for param, grad in zip(self.net.parameters(), grads, strict=True):
                param.grad = None if grad is None else grad.clone()
            if self.params.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.net.parameters(), self.params.grad_clip)
            self.optimizer.step()
        metrics = self.train_metrics(valid)
        assert metrics is not None
        if delta_norms:
            metrics["mean-update-norm"] = float(np.mean(delta_norms))
        metrics["embedding-norm"] = float(self.net.embeddings.weight.detach().norm())
        return None, metrics

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True) | {
            "embed-lr": self.embedding_lr,
            "embed-dim": self.embedding_size,
        }
