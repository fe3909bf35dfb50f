"""pFedMe (T Dinh, Tran and Nguyen, NeurIPS 2020): personalization through Moreau envelopes.

"Personalized Federated Learning with Moreau Envelopes". Each client's loss is replaced by
its Moreau envelope, and the federation solves the bi-level problem (Eq. 2, 3)::

    min_w F(w) = (1/N) Σ_i F_i(w),   F_i(w) = min_θ { f_i(θ) + (λ/2) ‖θ − w‖² }

whose inner minimiser θ̂_i(w) = prox_{f_i/λ}(w) is client i's personalized model and w is
the global model. Algorithm 1 (pFedMe), one round t:

1. the server sends w^t; each sampled client starts its **local copy of the global model**
   w_{i,0} = w^t;
2. for r = 0 … R−1 the client draws a minibatch D_i and solves the personalized problem
   h̃_i(θ; w_{i,r}, D_i) = f̃_i(θ; D_i) + (λ/2) ‖θ − w_{i,r}‖² approximately, to accuracy
   ν (‖∇h̃_i(θ̃_i)‖ ≤ ν, Eq. 7), with K steps of gradient descent at the personal learning
   rate; then it moves its local copy, w_{i,r+1} = w_{i,r} − ηλ (w_{i,r} − θ̃_i) (Eq. 8),
   a gradient step on F_i since ∇F_i(w) = λ (w − θ̂_i(w)) (Eq. 4);
3. it uploads w_{i,R}; the server averages the uploads and steps with β (Eq. 10):
   w^{t+1} = (1 − β) w^t + β · (1/|S|) Σ_{i∈S} w_{i,R}.

The client code is :mod:`pflarena.methods.pfedme.solver`; the server step is
:func:`beta_update`. Defaults are those of the paper's experiments and the authors' code
(CharlieDinh/pFedMe, ``main.py`` and README): λ = 15, K = 5, personal learning rate 0.09
(the non-convex MNIST setting; 0.1 for the convex one), β = 1 (the paper also reports
β = 2). The local learning rate η is the run's ``lr`` (the paper's 0.005), R is
``local-epochs`` passes of ``batch-size`` minibatches (one local round per minibatch; the
paper's R = 20 rounds of |D| = 20 samples).

Where the paper leaves a choice (the strategy's options, reasons in ``docs/methods/pfedme.md``):

- **Accuracy ν** (``pfedme.inner-tolerance``): the paper states the accuracy its analysis
  needs and runs a fixed K in its experiments. Here K is the most steps; the solve stops
  earlier once ‖∇h̃_i‖ ≤ ν (ν = 0: always K steps, the paper's experiments). Every client
  measures ‖∇h̃_i(θ̃_i)‖ at the θ̃_i it uses and reports the mean and the largest
  (``inner-grad-norm``, ``inner-grad-norm-max``), so a run states the accuracy it reached.
- **Warm start of θ** (not specified): θ starts each round at w^t and each local round at the
  previous θ̃ (the authors' code).
- **Averaging** (``pfedme.weighting``): the paper's Eq. 10 averages the uploads uniformly
  (``uniform``); the authors' code weights them by training examples (``examples``).
- **Personalized model** of a client that has not trained yet: the global model w^t (θ̂
  of a client never sampled is unknown; its closest available estimate is w).

The reading of the paper, decisions and measurements: docs/methods/pfedme.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from pydantic import Field

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.methods.pfedme import keys as pfedme_keys
from pflarena.strategies.aggregation import as_numpy, as_record, weighted_mean

__all__ = ["PFedMe", "PFedMeParams", "beta_update"]


#: the settings only the server uses (the solver is sent the others)
SERVER_SIDE = {"beta", "weighting"}


class PFedMeParams(MethodParams):
    """pFedMe's parameters; defaults from the paper's experiments and the authors' code."""

    lambda_: float = Field(
        15.0, gt=0, description="λ: weight of (λ/2)‖θ − w‖² tying θ_i to the local copy w"
    )
    inner_steps: int = Field(
        5, ge=1, description="K: most gradient steps solving the personalized problem"
    )
    personal_lr: float = Field(
        0.09, gt=0, description="step size of the K steps on f̃_i(θ) + (λ/2)‖θ − w‖²"
    )
    beta: float = Field(
        1.0, gt=0, le=10, description="β: w ← (1 − β) w + β · mean of the uploaded copies"
    )
    inner_tolerance: float = Field(
        0.0,
        ge=0,
        description="ν: stop the inner solve once ‖∇h̃_i(θ)‖ ≤ ν (0: always K steps)",
    )
    weighting: Literal["uniform", "examples"] = Field(
        "uniform",
        description="average of the uploads: 'uniform' (paper, Eq. 10) or by training "
        "examples ('examples', the authors' code)",
    )


def beta_update(previous: ArrayRecord, average: dict[str, np.ndarray], beta: float) -> ArrayRecord:
    """Eq. 10: ``(1 − β) · previous + β · average`` on floating-point entries, in the
    previous record's dtypes (``average`` in float64: :func:`weighted_mean` with
    ``dtype=np.float64``); integer entries are the average's (see
    :mod:`pflarena.strategies.aggregation`)."""
    out = {}
    for name, old in as_numpy(previous).items():
        if np.issubdtype(old.dtype, np.floating):
            mixed = (1.0 - beta) * old.astype(np.float64) + beta * average[name]
            out[name] = mixed.astype(old.dtype)
        else:
            out[name] = average[name]
    return as_record(out)


class PFedMe(FedAvg):
    """pFedMe: clients solve the Moreau-envelope problem; the server steps with β.

    Parameters
    ----------
    params
        :class:`PFedMeParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="pfedme",
        kind="baseline",
        reference="T Dinh, Tran and Nguyen, Personalized Federated Learning with Moreau "
        "Envelopes, NeurIPS 2020",
        summary="personalized θ_i = prox of f_i around the client's copy of the global "
        "model (K inner steps); the copies move along ∇ of the Moreau envelope; server step β",
        solver="pflarena.methods.pfedme.solver",
        params=PFedMeParams,
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )
    client_models = (1, "its personal model")

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(exclude=SERVER_SIDE),
        }

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid or self._round_arrays is None:
            return None, None
        uploads = [msg.content[keys.ARRAYS] for msg in valid]
        metrics = [msg.content[keys.METRICS] for msg in valid]
        weights = (
            [float(m[keys.NUM_EXAMPLES]) for m in metrics]
            if self.params.weighting == "examples"
            else None
        )
        average = weighted_mean(uploads, weights, dtype=np.float64)
        new = beta_update(self._round_arrays, average, self.params.beta)
        out = self.train_metrics(valid)
        assert out is not None
        for name in (pfedme_keys.INNER_GRAD_NORM, pfedme_keys.INNER_STEPS):
            values = [float(m.get(name, float("nan"))) for m in metrics]
            out[f"mean-{name}"] = float(np.mean(values))
        out["max-inner-grad-norm"] = float(
            max(float(m.get(pfedme_keys.INNER_GRAD_NORM_MAX, float("nan"))) for m in metrics)
        )
        return new, out

    def run_summary(self) -> dict[str, Any]:
        summary = self.params.model_dump(by_alias=True, exclude=SERVER_SIDE)
        return summary | self.params.model_dump(by_alias=True, include=SERVER_SIDE)
