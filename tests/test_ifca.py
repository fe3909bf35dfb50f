"""IFCA (Ghosh et al. 2020, Algorithm 1) through the real ClientApp: identity estimates, both
aggregation options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import config, grid_for, run_local
from torch.nn import functional as F

from pflarena.core import keys
from pflarena.core.datasets import to_tensors
from pflarena.core.federation import load_client
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy


def _literal(stacked, cluster, x, y):
    """Client loss and gradient of cluster model j (logistic regression), by autograd."""
    w = torch.from_numpy(stacked[f"cluster.{cluster}.linear.weight"].numpy().copy()).double()
    b = torch.from_numpy(stacked[f"cluster.{cluster}.linear.bias"].numpy().copy()).double()
    w.requires_grad_(True)
    b.requires_grad_(True)
    loss = F.cross_entropy(x.double() @ w.T + b, y)
    loss.backward()
    return float(loss.detach()), {"linear.weight": w.grad.numpy(), "linear.bias": b.grad.numpy()}


@pytest.mark.parametrize("averaging", ["model", "gradient"])
def test_clients_pick_their_lowest_loss_cluster_and_clusters_average_their_members(
    tmp_path, averaging
):
    cfg = config(
        strategy="ifca", dataset="synthetic-mixture", num_clients=6, num_rounds=1, lr=0.5,
        **{"ifca.num-clusters": 3, "ifca.averaging": averaging},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    grid = grid_for(cfg)
    replies = {}

    def keep(reply):
        if keys.ARRAYS not in reply.content:  # an evaluation
            return reply
        replies[reply.metadata.src_node_id] = {
            k: v.numpy().copy() for k, v in reply.content[keys.ARRAYS].items()
        }
        return reply

    grid.reply_filter = keep
    new = {}
    original = strategy.train_round

    def train_round(*args):
        out = original(*args)
        new["arrays"] = out[0]
        return out

    strategy.train_round = train_round
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    stacked = strategy.stacked(initial_arrays(cfg))
    chosen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    gradients = {}
    for node in grid.node_ids:
        client = strategy.client_ids[node]
        data, info = load_client(cfg.federation_spec(), client)
        x, y = to_tensors(data.x_train, data.y_train, info)
        losses = [_literal(stacked, j, x, y)[0] for j in range(3)]
        cluster = int(np.argmin(losses))
        assert strategy.assignments[1][client] == cluster
        chosen[cluster].append(node)
        gradients[node] = _literal(stacked, cluster, x, y)[1]
    assert sum(len(v) for v in chosen.values()) == 6
    for cluster, nodes in chosen.items():
        for name in ("linear.weight", "linear.bias"):
            got = new["arrays"][f"cluster.{cluster}.{name}"].numpy()
            before = stacked[f"cluster.{cluster}.{name}"].numpy()
            if not nodes:
                np.testing.assert_array_equal(got, before)
            elif averaging == "model":
                expected = np.mean([replies[n][name] for n in nodes], axis=0)
                np.testing.assert_allclose(got, expected, atol=1e-6)
            else:
                expected = before - 0.5 / 6 * np.sum([gradients[n][name] for n in nodes], axis=0)
                np.testing.assert_allclose(got, expected, atol=1e-6)


def test_ifca_learns_and_writes_its_clusters(tmp_path):
    cfg = config(
        strategy="ifca", num_clients=4, num_rounds=3, local_epochs=2, **{"ifca.num-clusters": 2}
    )
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    start = outcome.rounds[0]["evaluation"]["personalized"]["mean"]
    assert outcome.rounds[-1]["evaluation"]["personalized"]["mean"] > start + 0.3
    written = strategy.write_artifacts(tmp_path)
    assert [p.name for p in written] == ["clusters.csv"]
    assert len(written[0].read_text().splitlines()) == 1 + 3 * 4
    assert sum(strategy.run_summary()["last_cluster_sizes"]) == 4
