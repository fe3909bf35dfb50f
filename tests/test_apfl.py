"""APFL: the α update against autograd of the mixed loss, the three updates, real runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import config, run_local, stored
from torch.nn import functional as F

from pflarena.core.models import build_model
from pflarena.methods.apfl.solver import ALPHA_KEY, apfl_step


def _setting(seed=0, n=24):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 10, (n,), generator=generator)
    local = build_model("mlp", (64,), 10, seed=seed).double()
    global_ = build_model("mlp", (64,), 10, seed=seed + 100).double()
    return local, global_, x, y


def _mixed_loss_gradients(local, global_, alpha, x, y):
    """Autograd of the literal mixed loss f(α v + (1 − α) w) with α, v and w as leaves."""
    names = [name for name, _ in local.named_parameters()]
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    v = [p.detach().clone().requires_grad_(True) for p in local.parameters()]
    w = [p.detach().clone().requires_grad_(True) for p in global_.parameters()]
    mixture = {n: a * vi + (1 - a) * wi for n, vi, wi in zip(names, v, w, strict=True)}
    loss = F.cross_entropy(torch.func.functional_call(local, mixture, (x,)), y)
    grad_a, *grad_v = torch.autograd.grad(loss, [a, *v])
    own = F.cross_entropy(global_(x), y)
    grad_w = torch.autograd.grad(own, list(global_.parameters()))
    return float(grad_a), grad_v, grad_w


@pytest.mark.parametrize("alpha", [0.5, 0.2, 0.9])
def test_the_alpha_update_is_autograds_gradient_of_the_mixed_loss(alpha):
    local, global_, x, y = _setting()
    grad_a, grad_v, grad_w = _mixed_loss_gradients(local, global_, alpha, x, y)
    v0 = [p.detach().clone() for p in local.parameters()]
    w0 = [p.detach().clone() for p in global_.parameters()]
    lr, alpha_lr = 0.1, 0.01
    new_alpha, _, _ = apfl_step(
        local, global_, alpha, x, y, lr=lr, alpha_lr=alpha_lr, adaptive=True
    )
    assert new_alpha == pytest.approx(alpha - alpha_lr * grad_a, rel=1e-12, abs=1e-14)
    # v moves along ∂f(v̄)/∂v (which carries the factor α), w along ∇f(w)
    for p, p0, g in zip(local.parameters(), v0, grad_v, strict=True):
        torch.testing.assert_close(p.detach(), p0 - lr * g, rtol=1e-12, atol=1e-14)
    for p, p0, g in zip(global_.parameters(), w0, grad_w, strict=True):
        torch.testing.assert_close(p.detach(), p0 - lr * g, rtol=1e-12, atol=1e-14)


def test_alpha_stays_in_the_unit_interval_and_can_be_fixed():
    local, global_, x, y = _setting(seed=3)
    grad_a, _, _ = _mixed_loss_gradients(local, global_, 0.5, x, y)
    big_step = 10.0 / abs(grad_a)  # a step that would leave [0, 1]
    new_alpha, _, _ = apfl_step(local, global_, 0.5, x, y, lr=0.0, alpha_lr=big_step, adaptive=True)
    assert new_alpha in (0.0, 1.0)
    local, global_, x, y = _setting(seed=3)
    fixed, _, _ = apfl_step(local, global_, 0.5, x, y, lr=0.1, alpha_lr=1.0, adaptive=False)
    assert fixed == 0.5


def test_apfl_learns_on_digits_and_adapts_alpha(tmp_path):
    # w learns as FedAvg's model does (41% after 3 one-epoch rounds at lr 0.1): more epochs
    cfg = config(strategy="apfl", num_rounds=4, local_epochs=3, fraction_train=1.0)
    grid_outcome = run_local(cfg, tmp_path)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in grid_outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy
    server = grid_outcome.rounds[-1]["train"]["server"]
    assert 0.0 <= server["min-alpha"] <= server["mean-alpha"] <= server["max-alpha"] <= 1.0
    assert server["min-alpha"] != 0.5 or server["max-alpha"] != 0.5  # α was learned


def test_the_mixture_is_what_clients_evaluate(tmp_path):
    """With α fixed at 1 the personalized model is the local model v (local training with
    the global model's gradient steps alongside); with α = 0 it is the global model."""
    cfg = config(
        strategy="apfl",
        num_rounds=2,
        fraction_train=1.0,
        **{"apfl.alpha": 0.0, "apfl.adaptive": False},
    )
    last = run_local(cfg, tmp_path).rounds[-1]["evaluation"]
    assert last["personalized"]["mean"] == pytest.approx(last["global"]["mean"])
    assert np.isfinite(last["personalized"]["mean"])


def test_alpha_is_client_state(tmp_path):
    from helpers import grid_for

    cfg = config(strategy="apfl", num_rounds=1, fraction_train=1.0)
    grid = grid_for(cfg)
    run_local(cfg, tmp_path, grid=grid)
    for context in grid.contexts.values():
        record = stored(context, ALPHA_KEY)
        assert record is not None and 0.0 <= float(record["alpha"].numpy()[0]) <= 1.0
