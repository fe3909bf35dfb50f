"""FedEM (Marfoq et al. 2021) through the real ClientApp: E-step, M-steps, the reduction M = 1."""

from __future__ import annotations

import numpy as np
import torch
from helpers import config, grid_for, run_local, stored
from torch.nn import functional as F

from pflarena.core.datasets import to_tensors
from pflarena.core.federation import load_client
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy


def _recording(strategy):
    seen: list = []
    original = strategy.train_round

    def train_round(server_round, arrays, grid, send):
        new, metrics = original(server_round, arrays, grid, send)
        seen.append((arrays, new))
        return new, metrics

    strategy.train_round = train_round
    return seen


def test_one_component_is_fedavg(tmp_path):
    common = {"num_clients": 4, "num_rounds": 2, "lr": 0.05}
    fedavg_cfg = config(strategy="fedavg", **common)
    fedem_cfg = config(strategy="fedem", **common, **{"fedem.num-components": 1})
    fedavg, fedem = build_strategy(fedavg_cfg), build_strategy(fedem_cfg)
    a, b = _recording(fedavg), _recording(fedem)
    run_local(fedavg_cfg, tmp_path / "a", strategy=fedavg)
    run_local(fedem_cfg, tmp_path / "b", strategy=fedem)
    for (_, expected), (_, got) in zip(a, b, strict=True):
        for name in expected.keys():
            np.testing.assert_allclose(
                got[f"component.0.{name}"].numpy(), expected[name].numpy(), rtol=0, atol=1e-6
            )


def test_the_e_and_m_steps_are_their_formulas(tmp_path):
    """Round 2: q(z_s = m) ∝ π_m exp(−ℓ_m(s)) with the π_i the client kept from round 1 and
    the components the server sent; the new π_i = mean_s q, kept by the client."""
    cfg = config(strategy="fedem", dataset="synthetic-mixture", num_clients=3, num_rounds=2)
    strategy = build_strategy(cfg)
    seen = _recording(strategy)
    grid = grid_for(cfg)
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    sent = seen[1][0]  # the components of round 2
    for node in grid.node_ids:
        client = strategy.client_ids[node]
        data, info = load_client(cfg.federation_spec(), client)
        x, y = to_tensors(data.x_train, data.y_train, info)
        losses = []
        for m in range(3):
            w = torch.from_numpy(sent[f"component.{m}.linear.weight"].numpy()).double()
            b = torch.from_numpy(sent[f"component.{m}.linear.bias"].numpy()).double()
            losses.append(F.cross_entropy(x.double() @ w.T + b, y, reduction="none").numpy())
        before = stored(grid.contexts[node], "fedem/mixture-weights", accepted=101)["pi"].numpy()
        assert not np.allclose(before, 1 / 3)  # round 1 moved it: the prior matters here
        joint = np.log(before) - np.stack(losses, axis=1)
        q = np.exp(joint - joint.max(1, keepdims=True))
        q /= q.sum(1, keepdims=True)
        pi = stored(grid.contexts[node], "fedem/mixture-weights")["pi"].numpy()
        np.testing.assert_allclose(pi, q.mean(0), atol=1e-6)
        assert abs(pi.sum() - 1) < 1e-9


def test_fedem_learns_on_digits(tmp_path):
    # the q-weighted loss scales each component's steps by about 1/M at first
    cfg = config(
        strategy="fedem", num_clients=4, num_rounds=3, lr=0.3, local_epochs=2,
        **{"fedem.num-components": 2},
    )  # fmt: skip
    outcome = run_local(cfg, tmp_path, strategy=build_strategy(cfg))
    start = outcome.rounds[0]["evaluation"]["personalized"]["mean"]
    end = outcome.rounds[-1]["evaluation"]["personalized"]["mean"]
    assert end > start + 0.3
    assert outcome.rounds[1]["bytes_down"] == 4 * 2 * sum(
        len(a.data) for a in initial_arrays(cfg).values()
    )  # M full models to each client
