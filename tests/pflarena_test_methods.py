"""Two methods defined outside the pflarena package, loaded through ``PFLARENA_PLUGINS``.

They prove the plug-in path: each is one strategy class with its declaration and one solver
(this module itself), and nothing in ``pflarena/`` names them.

* ``toy-avg``: FedAvg with a server step size (``toy-avg.server-step``), the smallest useful
  method with a parameter of its own.
* ``line-search``: a round of two exchanges. ``gradients``: each sampled client returns its
  full training gradient at θ, which the server keeps in a per-client pool (on disk, like
  FedPG's stale gradients); the direction d is the mean of every client's latest gradient,
  fresh or stale (as in SAG). ``line-search``: the server sends θ and d back, each client
  returns its training loss at θ − η d for every candidate step η, and the server moves θ by
  the step with the lowest mean loss.
"""

from __future__ import annotations

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
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from pydantic import Field
from torch.nn import functional as F

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.training import train_epochs
from pflarena.strategies.base import (
    MultiExchangeStrategy,
    PflStrategy,
    array_problem,
    vector_problem,
)

MODULE = __name__
GRADIENT = "gradient"
DIRECTION = "direction"
LOSSES = "losses"


# --------------------------------------------------------------------------- toy-avg
class ToyAvgParams(MethodParams):
    server_step: float = Field(1.0, gt=0, le=1, description="θ ← θ + step · (average − θ)")


class ToyAvg(PflStrategy):
    declaration = MethodDeclaration(
        name="toy-avg",
        kind="plugin",
        reference="tests/pflarena_test_methods.py",
        summary="FedAvg with a server step size",
        solver=MODULE,
        params=ToyAvgParams,
    )

    def aggregate_train(self, server_round, replies):
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        average = aggregate_arrayrecords([m.content for m in valid], keys.NUM_EXAMPLES)
        current = self._round_arrays
        stepped = ArrayRecord(
            {
                name: Array(
                    current[name].numpy()
                    + self.params.server_step * (average[name].numpy() - current[name].numpy())
                )
                for name in current.keys()
            }
        )
        return stepped, self.train_metrics(valid)


# --------------------------------------------------------------------------- line-search
class LineSearchParams(MethodParams):
    steps: str = Field("0.05,0.2,0.5,1.0", description="candidate step sizes η, comma-separated")


class LineSearch(MultiExchangeStrategy):
    declaration = MethodDeclaration(
        name="line-search",
        kind="plugin",
        reference="tests/pflarena_test_methods.py",
        summary="full-gradient descent with a federated line search: two exchanges per round",
        solver=MODULE,
        params=LineSearchParams,
        honours=frozenset({"batch-size"}),
    )

    def __init__(self, params=None, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.steps = [float(s) for s in self.params.steps.split(",")]
        self.last_step: float | None = None

    def _messages(self, nodes, content_for):
        return [
            Message(content=content_for(n), message_type=MessageType.TRAIN, dst_node_id=n)
            for n in nodes
        ]

    def _config(self, server_round: int, phase: str) -> ConfigRecord:
        return ConfigRecord(
            {
                keys.SERVER_ROUND: server_round,
                keys.METHOD: self.method,
                keys.SOLVER: self.declaration.solver,
                keys.PHASE: phase,
                keys.BATCH_SIZE: self.training.batch_size,
                **self.method_config(steps=",".join(map(str, self.steps))),
            }
        )

    def train_round(self, server_round, arrays, grid, send):
        self._round_arrays = arrays
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        trainable = [
            n for n in arrays.keys() if np.issubdtype(arrays[n].numpy().dtype, np.floating)
        ]
        reference = ArrayRecord({n: arrays[n] for n in trainable})

        first = send(
            "gradients",
            self._messages(
                nodes,
                lambda n: RecordDict(
                    {keys.ARRAYS: arrays, keys.CONFIG: self._config(server_round, "gradients")}
                ),
            ),
        )
        gradients = self.valid_replies(first, lambda c: array_problem(c, reference, GRADIENT))
        if not gradients:
            return None, None
        pool = self.pool("gradients")
        for msg in gradients:
            pool.put(
                self.client_ids[first.node_of(msg)], server_round, {GRADIENT: msg.content[GRADIENT]}
            )
        latest = [pool.get(client, GRADIENT) for client in pool.clients()]
        direction = ArrayRecord(
            {n: Array(np.mean([g[n].numpy() for g in latest], axis=0)) for n in trainable}
        )
        survivors = [first.node_of(m) for m in gradients]
        second = send(
            "line-search",
            self._messages(
                survivors,
                lambda n: RecordDict(
                    {
                        keys.ARRAYS: arrays,
                        DIRECTION: direction,
                        keys.CONFIG: self._config(server_round, "line-search"),
                    }
                ),
            ),
        )

        def check(content):
            return vector_problem(content, LOSSES, {"losses": (len(self.steps),)})

        answers = self.valid_replies(second, check)
        if not answers:
            return None, None
        weights = np.array([float(m.content[keys.METRICS][keys.NUM_EXAMPLES]) for m in answers])
        losses = np.array([m.content[LOSSES]["losses"].numpy() for m in answers])
        mean_loss = weights @ losses / weights.sum()
        best = int(np.argmin(mean_loss))
        self.last_step = self.steps[best]
        new = {n: arrays[n].numpy() for n in arrays.keys()}
        for n in trainable:
            new[n] = new[n] - self.last_step * direction[n].numpy()
        metrics = MetricRecord({keys.TRAIN_LOSS: float(mean_loss[best]), "step": self.last_step})
        return ArrayRecord({n: Array(np.ascontiguousarray(v)) for n, v in new.items()}), metrics


PFLARENA_STRATEGIES = [ToyAvg, LineSearch]


# --------------------------------------------------------------------------- the solver
def _full_loss(model, job) -> torch.Tensor:
    return F.cross_entropy(model(job.data.x_train), job.data.y_train)


def train_toy_avg(job):
    """``toy-avg``'s client: local epochs from the global model."""
    model = job.global_model()
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    return {keys.ARRAYS: ArrayRecord(model.state_dict())}, train_metrics(job, loss, steps)


def train(job):
    if job.method == "toy-avg":
        return train_toy_avg(job)
    model = job.global_model()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if job.phase == "gradients":
        loss = _full_loss(model, job)
        grads = torch.autograd.grad(loss, [p for _, p in params])
        record = ArrayRecord(
            {n: Array(g.detach().cpu().numpy()) for (n, _), g in zip(params, grads, strict=True)}
        )
        return {GRADIENT: record}, train_metrics(job, float(loss.detach()), 1)
    assert job.phase == "line-search", job.phase
    direction = job.content[DIRECTION]
    steps = [float(s) for s in str(job.param("steps")).split(",")]
    start = {n: p.detach().clone() for n, p in params}
    losses = []
    with torch.no_grad():
        for step in steps:
            for n, p in params:
                p.copy_(start[n] - step * torch.from_numpy(direction[n].numpy()).to(p.device))
            losses.append(float(_full_loss(model, job)))
    record = ArrayRecord({"losses": Array(np.array(losses, dtype=np.float64))})
    return {LOSSES: record}, train_metrics(job, min(losses), 0)


def evaluate(job):
    result = job.test(job.global_model())
    return eval_metrics(job, result, result)
