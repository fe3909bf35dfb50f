"""Dap-FL (Chen et al., IEEE TPDS 2023): clients tune their own learning rate and epochs
with DDPG.

"Dap-FL: Federated Learning Flourishes by Adaptive Tuning and Secure Aggregation", by the
authors of PAGE, who name it as PAGE's ancestor (docs/methods/page.md). Every client keeps a DDPG
agent that chooses its local learning rate and number of local epochs each round, so that
clients with different resources need not share one setting; the server aggregates the
uploads. The paper secures the aggregation with the Paillier cryptosystem; **that
encryption is left out here: the server aggregates the models in the clear**, which gives
the same global model (Paillier's additive homomorphism computes the same weighted sum) at
none of the cost, and none of the protection.

The client side is :mod:`pflarena.methods.dapfl.solver`: state (loss, accuracy, F1 score)
of the received global model on the client's training split, action (epochs, learning
rate) in configured ranges, reward the improvement of that state from one round to the
next, bounded by clipping the loss change. The first round's actions are random.

**Aggregation weights** (``weighting``, :func:`contribution_weights`): ``examples``, the
default, weights each upload by its client's training examples, p_i = n_i / Σ_j n_j, as the
authors' released code does (``weights`` = "the size of local data"). The paper's text was
not available; PAGE describes Dap-FL as adaptively controlling the clients' contributions,
which the released code does through each client's own learning rate and epochs (the size
of its update), not through the weights. ``work`` is a reading of "adaptive
contributions" through the weights, not from a source: p_i ∝ n_i α_i, the examples times
the epochs the client's agent chose (the sample gradients it computed). ``uniform``: 1/m.

There is no server agent (the paper has none): the strategy is stateless between rounds.
The parts of the authors' code left out, and why, are in docs/methods/dapfl.md
(decisions and measurements): the Paillier encryption, and the primal-dual resource constraint (a cost
critic whose cost the code draws at random).

The reading of the paper, decisions and measurements: docs/methods/dapfl.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.methods.dapfl import keys as dapfl_keys
from pflarena.methods.dapfl.params import DapflParams
from pflarena.strategies.aggregation import weight_entropy, weighted_combination
from pflarena.strategies.base import PflStrategy

__all__ = ["DapFL", "DapflParams", "contribution_weights"]


def contribution_weights(
    examples: np.ndarray, epochs: np.ndarray, weighting: str = "examples"
) -> np.ndarray:
    """The aggregation weights of m uploads, on the simplex.

    ``examples``: p_i = n_i / Σ_j n_j (the authors' code); ``work``: p_i = n_i α_i /
    Σ_j n_j α_j, with α_i the epochs client i trained; ``uniform``: p_i = 1/m.
    """
    n = np.asarray(examples, dtype=np.float64)
    alpha = np.asarray(epochs, dtype=np.float64)
    if n.ndim != 1 or n.shape != alpha.shape or len(n) == 0:
        raise ValueError(
            f"contribution weights need one count and one epoch number per upload, got "
            f"{n.shape} and {alpha.shape}"
        )
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError(f"examples must be finite and > 0, got {n}")
    if not (np.all(np.isfinite(alpha)) and np.all(alpha > 0)):
        raise ValueError(f"epochs must be finite and > 0, got {alpha}")
    if weighting == "examples":
        share = n
    elif weighting == "work":
        share = n * alpha
    elif weighting == "uniform":
        share = np.ones_like(n)
    else:
        raise ValueError(f"weighting must be 'examples', 'work' or 'uniform', got {weighting!r}")
    return share / share.sum()


class DapFL(PflStrategy):
    """Dap-FL: clients' DDPG agents choose their local lr and epochs; the server aggregates
    with :func:`contribution_weights` (in the clear: no Paillier encryption).

    Parameters
    ----------
    Others
        See :class:`DapflParams`.
    """

    declaration = MethodDeclaration(
        name="dapfl",
        kind="baseline",
        reference="Chen, Wang, Chen, Yan and Lin, Dap-FL: Federated Learning Flourishes by "
        "Adaptive Tuning and Secure Aggregation, IEEE TPDS 34(6), 2023",
        summary="each client's DDPG agent picks its local lr and epochs (state: loss, "
        "accuracy, F1 of the global model; reward: their improvement); data-size-weighted "
        "aggregation in the clear (the paper's Paillier encryption is left out)",
        solver="pflarena.methods.dapfl.solver",
        params=DapflParams,
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The personal model and the client's agent (state (loss, accuracy, F1), action
        (epochs, ln lr)), with a transition for each round it trained in."""
        from pflarena.algorithms.ddpg import box_config, saved_bytes  # torch: at --check only

        config = box_config(lambda key: getattr(params, key.replace("-", "_")), 3)
        return [
            Footprint("its personal model", federation.state_bytes()),
            Footprint(
                f"its agent (hidden {params.hidden})", saved_bytes(config, federation.num_rounds)
            ),
        ]

    def train_config(self, server_round: int, node_id: int) -> dict:
        """The common settings plus what the clients' agents need."""
        client = self.params_config(exclude={"weighting"})
        return {**super().train_config(server_round, node_id), **client}

    def check_train_reply(self, content: RecordDict) -> str | None:
        """The model, and the metrics the aggregation and the round's report read."""
        metrics = content.metric_records[keys.METRICS]
        for name, valid, wanted in (
            (keys.NUM_EXAMPLES, lambda v: v >= 1, "a count >= 1"),
            (dapfl_keys.EPOCHS, lambda v: v >= 1, "a number of epochs >= 1"),
            (dapfl_keys.LR, lambda v: v > 0, "a learning rate > 0"),
        ):
            value = metrics.get(name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or not valid(value)
            ):
                return f"metric {name!r} must be {wanted}, got {value!r}"
        return super().check_train_reply(content)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        metrics = [m.content[keys.METRICS] for m in valid]
        examples = np.array([float(m[keys.NUM_EXAMPLES]) for m in metrics])
        epochs = np.array([float(m[dapfl_keys.EPOCHS]) for m in metrics])
        lrs = np.array([float(m[dapfl_keys.LR]) for m in metrics])
        weights = contribution_weights(examples, epochs, self.params.weighting)
        new_arrays = weighted_combination([m.content[keys.ARRAYS] for m in valid], weights)

        out = self.train_metrics(valid)
        assert out is not None
        entropy = weight_entropy(weights)
        out.update(
            {
                "weight-entropy-ratio": entropy / math.log(len(weights))
                if len(weights) > 1
                else 1.0,
                "max-weight": float(weights.max()),
                "mean-epochs": float(epochs.mean()),
                "mean-lr": float(np.exp(np.log(lrs).mean())),
                "state-accuracy": float(
                    np.mean([float(m.get(dapfl_keys.STATE_ACCURACY, math.nan)) for m in metrics])
                ),
            }
        )
        rewards = [float(m[dapfl_keys.REWARD]) for m in metrics if dapfl_keys.REWARD in m]
        if rewards:
            out["client-reward"] = float(np.mean(rewards))
            out["client-clipped"] = int(sum(int(m.get(dapfl_keys.CLIPPED, 0)) for m in metrics))
        return new_arrays, out

    def run_summary(self) -> dict[str, Any]:
        p = self.params
        return {
            "agents": p.agents,
            "weighting": p.weighting,
            "reward_weights": [p.loss_weight, p.accuracy_weight, p.f1_weight],
            "loss_change_clip": p.loss_change_clip,
            "epochs_range": [p.min_epochs, p.max_epochs],
            "lr_range": [p.min_lr, p.max_lr],
            "secure_aggregation": False,
        }
