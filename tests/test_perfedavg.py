"""Per-FedAvg: the Hessian-vector product against double backward, the meta step, runs."""

from __future__ import annotations

import pytest
import torch
from helpers import config, run_local
from torch import nn
from torch.nn import functional as F

from pflarena.core.models import build_model
from pflarena.methods.perfedavg.solver import (
    batch_stream,
    hvp_autograd,
    hvp_finite_difference,
    meta_step,
)


def _smooth_mlp(seed):
    """A two-layer tanh network: smooth, so a central difference converges to its Hessian
    product (a ReLU network's gradient jumps where a shift crosses a kink, and autograd's
    Hessian ignores the kinks)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))


def _setting(seed=0, n=40, model="tanh-mlp"):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 10, (n,), generator=generator)
    if model == "tanh-mlp":
        model = _smooth_mlp(seed).double()
    else:
        model = build_model(model, (64,), 10, seed=seed).double()
    vector = [
        torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in model.parameters()
    ]
    return model, vector, x, y


def _double_backward(model, vector, x, y):
    """∇²f v written out independently: ∂/∂w ⟨∇f(w), v⟩ by torch.autograd.functional.vhp."""
    names = [name for name, _ in model.named_parameters()]
    params = tuple(p.detach().clone() for p in model.parameters())

    def loss_of(*values):
        out = torch.func.functional_call(model, dict(zip(names, values, strict=True)), (x,))
        return F.cross_entropy(out, y)

    _, product = torch.autograd.functional.vhp(loss_of, params, tuple(vector))
    return list(product)


def _relative_error(a, b):
    num = torch.sqrt(sum(((u - v) ** 2).sum() for u, v in zip(a, b, strict=True)))
    den = torch.sqrt(sum((v**2).sum() for v in b))
    return float(num / den)


@pytest.mark.parametrize("model_name", ["tanh-mlp", "logreg"])
def test_the_hf_product_matches_double_backward_to_1e_5(model_name):
    model, vector, x, y = _setting(model=model_name)
    before = [p.detach().clone() for p in model.parameters()]
    reference = _double_backward(model, vector, x, y)
    product = hvp_finite_difference(model, vector, x, y, delta=1e-4)
    assert _relative_error(product, reference) < 1e-5
    assert _relative_error(hvp_autograd(model, vector, x, y), reference) < 1e-12
    # the parameters are restored after the two shifted gradients
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), q)


def test_a_coarse_difference_step_misses_the_product():
    """The central difference is accurate to O(δ²): a large δ must fail the 1e-5 bound, so the
    test above can fail."""
    model, vector, x, y = _setting(seed=1)
    reference = _double_backward(model, vector, x, y)
    assert _relative_error(hvp_finite_difference(model, vector, x, y, delta=0.5), reference) > 1e-5


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_the_meta_step_follows_the_maml_gradient(variant):
    """One local step equals w − β ∇̃F(w) computed literally from MAML's objective with
    autograd: F(w) = f(w − α∇f(w, D), D') (HF: exact Hessian term on D'')."""
    model, _, x, y = _setting(seed=2, n=30)
    alpha, beta = 0.05, 0.1
    stream_batches = [torch.arange(0, 10), torch.arange(10, 20), torch.arange(20, 30)]
    names = [name for name, _ in model.named_parameters()]
    w = [p.detach().clone().requires_grad_(True) for p in model.parameters()]

    def f(values, idx):
        out = torch.func.functional_call(model, dict(zip(names, values, strict=True)), (x[idx],))
        return F.cross_entropy(out, y[idx])

    inner = torch.autograd.grad(f(w, stream_batches[0]), w)
    adapted = [a - alpha * g for a, g in zip(w, inner, strict=True)]
    if variant == "fo":
        adapted = [a.detach().requires_grad_(True) for a in adapted]
        outer = torch.autograd.grad(f(adapted, stream_batches[1]), adapted)
    else:
        # the paper's HF step: g − α ∇²f(w, D'') g with g = ∇f(w̃, D')
        adapted_d = [a.detach().requires_grad_(True) for a in adapted]
        g = torch.autograd.grad(f(adapted_d, stream_batches[1]), adapted_d)
        grad_third = torch.autograd.grad(f(w, stream_batches[2]), w, create_graph=True)
        hv = torch.autograd.grad(sum((a * b).sum() for a, b in zip(grad_third, g, strict=True)), w)
        outer = [a - alpha * b for a, b in zip(g, hv, strict=True)]
    expected = [a.detach() - beta * g for a, g in zip(w, outer, strict=True)]
    meta_step(
        model,
        iter(stream_batches),
        x,
        y,
        alpha=alpha,
        beta=beta,
        variant=variant,
        hvp="autograd",
    )
    for p, e in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=1e-10, atol=1e-12)


def test_the_batch_stream_runs_pass_after_pass():
    stream = batch_stream(5, 2, torch.Generator().manual_seed(0))
    first_pass = [next(stream) for _ in range(3)]
    assert sorted(torch.cat(first_pass).tolist()) == [0, 1, 2, 3, 4]
    assert len(next(stream)) == 2  # the next pass begins


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_learns_on_digits(variant, tmp_path):
    # At the paper's α = 0.001 a step moves about as far as a plain SGD step of size β:
    # like FedAvg at lr 0.1, one epoch a round for 3 rounds is too little (41% for FedAvg)
    cfg = config(
        strategy="perfedavg",
        num_rounds=4,
        local_epochs=3,
        fraction_train=1.0,
        **{"perfedavg.variant": variant},
    )
    outcome = run_local(cfg, tmp_path)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy
    assert outcome.rounds[-1]["evaluation"]["global"] is not None
