"""pFedHN: generated shapes, the hypernetwork and embedding gradients against autograd
through the generated model, the server step, real runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from helpers import config, run_local
from torch.func import functional_call
from torch.nn import functional as F

from pflarena.core.models import build_model
from pflarena.methods.pfedhn.strategy import HyperNetwork, hypernetwork_gradients
from pflarena.server.build import build_strategy


def _target():
    model = build_model("mlp", (64,), 10, seed=0).double()
    return model, {name: tuple(p.shape) for name, p in model.named_parameters()}


def _net(target, num_clients=6, seed=0):
    torch.manual_seed(seed)
    return HyperNetwork(num_clients, target, embed_dim=3, hidden=16, hidden_layers=2).double()


def test_the_generated_weights_have_the_target_models_shapes():
    model, target = _target()
    net = _net(target)
    generated = net(2)
    assert list(generated) == [name for name, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        assert generated[name].shape == param.shape
    # and they load into the target model as they are
    model.load_state_dict({k: v.detach() for k, v in generated.items()})


def test_the_update_direction_is_autograd_through_the_generated_model():
    """With Δθ = ∇_θ L_i(θ) at θ = h(v_i; φ), (∇θ)ᵀΔθ must equal ∇_φ L_i(h(v_i; φ)) and
    ∇_{v} L_i(h(v_i; φ)) computed by autograd through the whole composition; the other
    clients' embeddings get no gradient."""
    model, target = _target()
    net = _net(target)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(20, 64, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 10, (20,), generator=generator)
    client = 4

    def loss_of(params):
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    # the reference: L(h(v_i; φ)) differentiated end to end
    reference = torch.autograd.grad(loss_of(net(client)), list(net.parameters()))
    # Δθ the client would report for one unit step of full-batch gradient descent
    theta = {k: v.detach().requires_grad_(True) for k, v in net(client).items()}
    delta = dict(zip(theta, torch.autograd.grad(loss_of(theta), list(theta.values())), strict=True))
    grads = hypernetwork_gradients(net, client, delta)
    names = [name for name, _ in net.named_parameters()]
    for name, got, want in zip(names, grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=name)
    embedding = grads[names.index("embeddings.weight")]
    others = [i for i in range(6) if i != client]
    assert embedding[client].abs().sum() > 0
    assert torch.equal(embedding[others], torch.zeros_like(embedding[others]))


def test_the_server_step_uses_the_declared_rates_for_net_and_embeddings(tmp_path):
    """One optimizer step on Algorithm 1's direction: φ with server-lr, the embeddings with
    their own embed-lr, both with weight decay; only the trained client's embedding moves
    by more than the decay."""
    cfg = config(
        strategy="pfedhn",
        num_clients=4,
        **{"pfedhn.server-momentum": 0.0, "pfedhn.embed-lr": 0.05},
    )
    strategy = build_strategy(cfg)
    strategy.server_round = 1
    net = strategy.net
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    like = ArrayRecord(
        {
            name: Array(np.zeros(shape, dtype=np.float32))
            for name, shape in zip(net.names, net.shapes, strict=True)
        }
    )
    generated = strategy.generate(1, like)
    trained = ArrayRecord(
        {name: Array(generated[name].numpy() - 0.01) for name in generated.keys()}
    )
    delta = {
        name: torch.as_tensor(generated[name].numpy() - trained[name].numpy())
        for name in generated.keys()
    }
    expected = hypernetwork_gradients(net, 1, delta)
    net_lr, embed_lr = strategy.params.server_lr, strategy.embedding_lr
    assert (net_lr, embed_lr) == (0.01, 0.05)
    decay = strategy.params.server_weight_decay
    # one step as aggregate_train takes it, through the strategy's own optimizer
    strategy.optimizer.zero_grad(set_to_none=True)
    for param, grad in zip(net.parameters(), expected, strict=True):
        param.grad = grad.clone()
    strategy.optimizer.step()
    for (name, value), grad in zip(net.named_parameters(), expected, strict=True):
        lr = embed_lr if name == "embeddings.weight" else net_lr
        want = before[name] - lr * (grad + decay * before[name])
        if name == "embeddings.weight":  # client 0 was not trained: decay only
            torch.testing.assert_close(value[0].detach(), before[name][0] * (1 - lr * decay))
        torch.testing.assert_close(value.detach(), want, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- runs
def test_pfedhn_learns_on_digits(tmp_path):
    # the hypernetwork learns from the clients' updates a round late: more local epochs
    cfg = config(strategy="pfedhn", num_rounds=4, local_epochs=3, fraction_train=1.0)
    outcome = run_local(cfg, tmp_path)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy
    assert outcome.rounds[-1]["evaluation"]["global"] is None
    assert outcome.rounds[-1]["train"]["server"]["mean-update-norm"] > 0


def test_models_with_buffers_are_refused():
    with pytest.raises(ValueError, match="buffers"):
        build_strategy(config(strategy="pfedhn", dataset="digits", model="resnet18"))
