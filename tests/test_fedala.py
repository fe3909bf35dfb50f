"""FedALA: element weights in [0, 1], weights of 1 give the global model, Eq. 6 against
autograd, real runs."""

from __future__ import annotations

import pytest
import torch
from helpers import config, run_local
from torch.func import functional_call
from torch.nn import functional as F

from pflarena.core.models import build_model
from pflarena.methods.fedala.solver import aggregate, higher_layers, learn_weights


def _setting(seed=0, n=32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 10, (n,), generator=generator)
    model = build_model("mlp", (64,), 10, seed=seed).double()
    local = {k: v.detach().clone() for k, v in model.state_dict().items()}
    global_ = {
        k: v.detach().clone()
        for k, v in build_model("mlp", (64,), 10, seed=seed + 7).double().state_dict().items()
    }
    return model, local, global_, x, y


def test_the_higher_layers_are_the_top_modules_weight_and_bias():
    model = build_model("mlp", (64,), 10, seed=0)
    assert higher_layers(model, 1) == ["net.5.weight", "net.5.bias"]
    assert higher_layers(model, 2) == ["net.3.weight", "net.3.bias", "net.5.weight", "net.5.bias"]


def test_weights_of_one_give_the_global_model_and_of_zero_the_local_top():
    model, local, global_, _, _ = _setting()
    names = higher_layers(model, 1)
    ones = {name: torch.ones_like(global_[name]) for name in names}
    result = aggregate(local, global_, ones)
    assert result.keys() == global_.keys()
    for name, value in global_.items():
        assert torch.equal(result[name], value)
    zeros = {name: torch.zeros_like(global_[name]) for name in names}
    result = aggregate(local, global_, zeros)
    for name in global_:
        expected = local[name] if name in names else global_[name]  # lower layers: global
        assert torch.equal(result[name], expected)


def test_one_weight_step_is_eq_6_by_autograd():
    """W ← clip(W − η ∇_W L(Θ_i + (Θ − Θ_i) ⊙ W), 0, 1), ∇_W taken by autograd with W a leaf."""
    model, local, global_, x, y = _setting(seed=1)
    names = higher_layers(model, 1)
    start = {name: torch.full_like(global_[name], 0.7) for name in names}
    eta = 0.5
    leaves = {name: w.clone().requires_grad_(True) for name, w in start.items()}
    params = dict(global_)
    for name in names:
        params[name] = local[name] + (global_[name] - local[name]) * leaves[name]
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    grads = torch.autograd.grad(loss, [leaves[name] for name in names])
    expected = {
        name: torch.clamp(start[name] - eta * g, 0.0, 1.0)
        for name, g in zip(names, grads, strict=True)
    }
    weights = {name: w.clone() for name, w in start.items()}
    epochs = learn_weights(
        model,
        local,
        global_,
        weights,
        x,
        y,
        eta=eta,
        batch_size=len(y),  # one minibatch: one step
        generator=torch.Generator().manual_seed(0),
        until_settled=False,
        threshold=0.01,
        window=10,
        max_epochs=100,
    )
    assert epochs == 1
    for name in names:
        torch.testing.assert_close(weights[name], expected[name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("eta", [1.0, 1e3])
def test_the_learned_weights_stay_in_the_unit_interval(eta):
    model, local, global_, x, y = _setting(seed=2)
    names = higher_layers(model, 2)
    weights = {name: torch.ones_like(global_[name]) for name in names}
    epochs = learn_weights(
        model,
        local,
        global_,
        weights,
        x,
        y,
        eta=eta,
        batch_size=8,
        generator=torch.Generator().manual_seed(0),
        until_settled=True,
        threshold=1e-9,  # never settles: runs to the bound
        window=3,
        max_epochs=5,
    )
    assert epochs == 5
    values = torch.cat([w.ravel() for w in weights.values()])
    assert values.min() >= 0.0 and values.max() <= 1.0
    assert values.min() < 1.0  # they moved
    if eta > 1.0:  # a large step drives some to the bounds, where the clip holds them
        assert (values == 0.0).any() and (values == 1.0).any()


# --------------------------------------------------------------------------- runs
def test_fedala_learns_on_digits_and_reports_its_weights(tmp_path):
    cfg = config(strategy="fedala", num_rounds=3, fraction_train=1.0)
    outcome = run_local(cfg, tmp_path)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy
    assert outcome.rounds[-1]["evaluation"]["global"] is not None
    server = outcome.rounds[-1]["train"]["server"]
    assert 0.0 <= server["mean-mean-weight"] <= 1.0
    assert server["mean-ala-epochs"] >= 1  # from round 2 every client aggregates
