"""K canonical copies of a model and PPFL's two forms, against literal computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from pflarena.algorithms.canonical import (
    CanonicalModel,
    PersonalizedModel,
    copied_entries,
    copy_seed,
    initial_stacked_state,
    mixture_loss,
    mixture_scores,
    parse_stacked,
    stack_state,
)
from pflarena.core.models import build_model


def _model(name="logreg", shape=(6,), classes=3, count=3, layers=0, seed=0):
    state = initial_stacked_state(name, shape, classes, seed, count, layers, "canonical")
    tensors = {k: torch.as_tensor(v) for k, v in state.items()}
    return CanonicalModel(build_model(name, shape, classes, seed=seed), tensors, "canonical"), state


def test_copies_start_different_and_copy_zero_is_the_runs_initial_model():
    _, state = _model("mlp", (5,), 3, count=3)
    base = build_model("mlp", (5,), 3, seed=0).state_dict()
    for name, value in base.items():
        np.testing.assert_array_equal(state[f"canonical.0.{name}"], value.numpy())
    for k in (1, 2):
        for name in base:
            assert not np.array_equal(state[f"canonical.{k}.{name}"], state[f"canonical.0.{name}"])
    assert copy_seed(5, 0) == 5 and copy_seed(5, 1) != copy_seed(5, 2) != 5
    again = initial_stacked_state("mlp", (5,), 3, 0, 3, 0, "canonical")
    assert all(np.array_equal(again[k], state[k]) for k in state)  # seeded


def test_canonical_layers_split_trunk_from_copies():
    model = build_model("mlp", (5,), 3, seed=0)
    names = list(model.state_dict())
    trainable = [n for n, _ in model.named_parameters()]
    assert copied_entries(names, trainable, 1) == ["net.5.weight", "net.5.bias"]
    assert copied_entries(names, trainable, 0) == names
    with pytest.raises(ValueError, match="layers with weights"):
        copied_entries(names, trainable, 4)
    state = initial_stacked_state("mlp", (5,), 3, 0, 2, 1, "canonical")
    trunk, entries, count = parse_stacked(list(state), "canonical")
    assert trunk == ["net.1.weight", "net.1.bias", "net.3.weight", "net.3.bias"]
    assert entries == ["net.5.weight", "net.5.bias"] and count == 2


def test_parse_stacked_refuses_malformed_layouts():
    base = {"w": np.zeros(2), "b": np.zeros(1)}
    good = stack_state(base, [base, base], ["w", "b"], "canonical")
    assert parse_stacked(list(good), "canonical")[2] == 2
    with pytest.raises(ValueError, match="no canonical"):
        parse_stacked(["w", "b"], "canonical")
    with pytest.raises(ValueError, match="numbered"):
        parse_stacked(["canonical.0.w", "canonical.2.w"], "canonical")
    with pytest.raises(ValueError, match="other entries"):
        parse_stacked(["canonical.0.w", "canonical.1.b"], "canonical")


def test_interpolation_is_the_model_with_interpolated_parameters():
    model, state = _model("mlp", (5,), 3, count=3)
    c = torch.tensor([0.2, 0.5, 0.3])
    x = torch.randn(7, 5)
    reference = build_model("mlp", (5,), 3)
    literal = {
        name: sum(float(c[k]) * torch.as_tensor(state[f"canonical.{k}.{name}"]) for k in range(3))
        for name in reference.state_dict()
    }
    reference.load_state_dict(literal)
    person = PersonalizedModel(model, c, "interpolate")
    torch.testing.assert_close(person(x), reference(x))
    exported = build_model("mlp", (5,), 3)
    exported.load_state_dict(model.personalized_state(c))
    torch.testing.assert_close(exported(x), reference(x))


def test_the_three_output_mixtures_are_their_formulas():
    model, state = _model("logreg", (4,), 3, count=2)
    c = torch.tensor([0.7, 0.3], dtype=torch.float64)
    x = torch.randn(9, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    weights = [torch.as_tensor(state[f"canonical.{k}.linear.weight"]).double() for k in range(2)]
    biases = [torch.as_tensor(state[f"canonical.{k}.linear.bias"]).double() for k in range(2)]
    z = [x @ weights[k].T + biases[k] for k in range(2)]
    model = model.double()
    outputs = model.outputs(x)
    torch.testing.assert_close(outputs[0], z[0])
    # logit: Σ c_k z_k
    torch.testing.assert_close(mixture_scores(outputs, c, "logit"), 0.7 * z[0] + 0.3 * z[1])
    # prob (Eq. 7): log Σ c_k softmax(z_k)
    probs = 0.7 * torch.softmax(z[0], 1) + 0.3 * torch.softmax(z[1], 1)
    torch.testing.assert_close(mixture_scores(outputs, c, "prob"), torch.log(probs))
    person = PersonalizedModel(model, c, "mix", "prob")
    torch.testing.assert_close(person.loss(x, y), -torch.log(probs[torch.arange(9), y]).mean())
    # loss (O3.4 as a negative log-likelihood): Σ c_k CE(z_k, y), linear in c
    person = PersonalizedModel(model, c, "mix", "loss")
    expected = 0.7 * F.cross_entropy(z[0], y) + 0.3 * F.cross_entropy(z[1], y)
    torch.testing.assert_close(person.loss(x, y), expected)


def test_membership_gradients_match_closed_forms():
    """docs/papers/ppfl.md §2.4: PPFL2 ∇_c ℓ = θᵀ-projections of the output gradient; PPFL1 (prob)
    ∂ℓ/∂c_k = −p_k(y|x) / Σ_j c_j p_j(y|x); loss mixture ∂/∂c_k = CE_k."""
    model, state = _model("logreg", (4,), 3, count=3)
    model = model.double()
    x = torch.randn(11, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (11,))
    c0 = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    w = [torch.as_tensor(state[f"canonical.{k}.linear.weight"]).double() for k in range(3)]
    b = [torch.as_tensor(state[f"canonical.{k}.linear.bias"]).double() for k in range(3)]
    z = [x @ w[k].T + b[k] for k in range(3)]

    def grad(form, mix="prob"):
        c = c0.clone().requires_grad_(True)
        PersonalizedModel(model, c, form, mix).loss(x, y).backward()
        return c.grad

    # PPFL2: z(c) = Σ c_k z_k (linear layer), dℓ/dc_k = mean_j (softmax(z) − e_y)·z_k
    mixed = sum(c0[k] * z[k] for k in range(3))
    residual = torch.softmax(mixed, 1) - F.one_hot(y, 3).double()
    expected = torch.stack([(residual * z[k]).sum(1).mean() for k in range(3)])
    torch.testing.assert_close(grad("interpolate"), expected)
    # PPFL1, probability mixture
    p_y = torch.stack([torch.softmax(z[k], 1)[torch.arange(11), y] for k in range(3)], 1)
    expected = (-p_y / (p_y @ c0)[:, None]).mean(0)
    torch.testing.assert_close(grad("mix", "prob"), expected)
    # loss mixture: the per-copy losses
    expected = torch.stack([F.cross_entropy(z[k], y) for k in range(3)])
    torch.testing.assert_close(grad("mix", "loss"), expected)


def test_training_moves_the_copies_and_the_trunk_not_the_bases_own_entries():
    model, _ = _model("mlp", (5,), 3, count=2, layers=1)
    names = {id(p) for p in model.shared_parameters()}
    assert len(model.shared_parameters()) == 4 + 2 * 2  # trunk (2 layers) + 2 heads
    base_head = dict(model.base.named_parameters())["net.5.weight"]
    assert id(base_head) not in names and not base_head.requires_grad
    before = {k: v.clone() for k, v in model.stacked_state().items()}
    person = PersonalizedModel(model, torch.tensor([0.5, 0.5]), "mix", "logit")
    optimizer = torch.optim.SGD(model.shared_parameters(), lr=0.5)
    person.loss(torch.randn(8, 5), torch.randint(0, 3, (8,))).backward()
    optimizer.step()
    after = model.stacked_state()
    assert list(after) == list(before)
    assert all(not torch.equal(before[k], after[k]) for k in after)  # trunk and both heads


def test_k1_interpolation_and_logit_mixing_are_the_plain_model_bit_for_bit():
    model, _ = _model("mlp", (5,), 3, count=1)
    plain = build_model("mlp", (5,), 3, seed=0)
    x = torch.randn(6, 5)
    one = torch.tensor([1.0])
    assert torch.equal(PersonalizedModel(model, one, "interpolate")(x), plain(x))
    assert torch.equal(PersonalizedModel(model, one, "mix", "logit")(x), plain(x))


def test_interpolation_refuses_buffers_in_the_copies():
    model, _ = _model("resnet18-cifar-gn", (3, 32, 32), 10, count=2, layers=1)
    assert model.entries == ["fc.weight", "fc.bias"]  # a linear head: fine
    with torch.no_grad():
        model.interpolated_entries(torch.tensor([0.5, 0.5]))
    state = initial_stacked_state("resnet18", (3, 32, 32), 10, 0, 2, 2, "canonical")
    copied = CanonicalModel(
        build_model("resnet18", (3, 32, 32), 10, seed=0),
        {k: torch.as_tensor(v) for k, v in state.items()},
        "canonical",
    )
    assert any("running_mean" in n for n in copied.entries)
    with pytest.raises(ValueError, match="buffer"):
        copied.interpolated_entries(torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize(
    ("name", "shape", "classes", "layers"),
    [
        ("logreg", (5,), 3, 0),
        ("mlp", (5,), 3, 0),
        ("mlp", (5,), 3, 1),  # a trunk
        ("cnn-bn", (1, 28, 28), 10, 0),  # buffers, updated in training mode
        ("char-lstm", (12,), 20, 0),  # an RNN's flattened weights
    ],
)
def test_a_copys_forward_pass_is_the_functional_call_of_its_entries(name, shape, classes, layers):
    """Setting a copy's tensors on the base and restoring them gives functional_call's
    outputs and gradients, updates a copy's buffers as it does, and leaves the base as it
    was (what the next copy's pass sees)."""
    from torch.func import functional_call

    model, _ = _model(name, shape, classes, count=2, layers=layers)
    twin, _ = _model(name, shape, classes, count=2, layers=layers)
    before = {k: v.clone() for k, v in model.base.state_dict().items()}
    torch.manual_seed(0)
    x = torch.randint(0, 20, (7, *shape)) if name == "char-lstm" else torch.randn(7, *shape)
    y = torch.randint(0, classes, (7,))
    for k in range(2):
        got = model.output(k, x)
        want = functional_call(twin.base, twin.copy_entries(k), (x,))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        first = model.copy_entries(k)[next(n for n in model.entries if "weight" in n)]
        other = twin.copy_entries(k)[next(n for n in twin.entries if "weight" in n)]
        (g,) = torch.autograd.grad(F.cross_entropy(got, y), first)
        (h,) = torch.autograd.grad(F.cross_entropy(want, y), other)
        torch.testing.assert_close(g, h, rtol=0, atol=0)
    for name_, value in model.stacked_state().items():
        torch.testing.assert_close(value, twin.stacked_state()[name_], rtol=0, atol=0)
    after = model.base.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(after[k] is not model.copy_entries(0).get(k) for k in after)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "count", "layers"),
    [
        ("logreg", (5,), 3, 4, 0),
        ("logreg", (2, 3), 3, 2, 0),  # flattened input
        ("mlp-128", (5,), 3, 3, 0),
        ("mlp", (5,), 3, 3, 1),  # a shared trunk, then the copied last layer
        ("mlp-128", (1, 4, 4), 10, 4, 1),
    ],
)
def test_the_batched_pass_over_the_copies_is_each_copys_own(name, shape, classes, count, layers):
    """A model with a linear plan runs its K copies as one batched pass: the same outputs
    as each copy's own pass, and the same gradients in every copy and in the trunk."""
    model, _ = _model(name, shape, classes, count=count, layers=layers)
    assert model._plan is not None
    torch.manual_seed(1)
    x, y = torch.randn(9, *shape), torch.randint(0, classes, (9,))
    batched = model.stacked_outputs(x)
    one_by_one = torch.stack([model.output(k, x) for k in range(count)])
    torch.testing.assert_close(batched, one_by_one, rtol=1e-6, atol=1e-6)
    weights = torch.rand(count)
    parameters = model.shared_parameters()
    assert bool(model.trunk_parameters()) == bool(layers)  # the trunk's gradients too
    got = torch.autograd.grad(mixture_loss(batched, y, weights, "prob"), parameters)
    separate = list(one_by_one.unbind(0))
    want = torch.autograd.grad(mixture_loss(separate, y, weights, "prob"), parameters)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "layers"),
    [
        ("cnn", (1, 28, 28), 10, 1),  # no linear plan
        ("mlp-128", (1, 28, 28), 10, 0),  # copies of 101,770 parameters: too large
    ],
)
def test_other_models_pass_copy_by_copy(name, shape, classes, layers):
    model, _ = _model(name, shape, classes, count=2, layers=layers)
    assert model._plan is None
    x = torch.randn(3, *shape)
    torch.testing.assert_close(
        model.stacked_outputs(x),
        torch.stack([model.output(k, x) for k in range(2)]),
        rtol=0,
        atol=0,
    )


def test_the_batched_pass_takes_layers_without_bias():
    class NoBias(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 3, bias=False)

        def forward(self, x):
            return self.linear(x)

        def linear_plan(self):
            return [("linear", "linear")]

    torch.manual_seed(2)
    state = {f"canonical.{k}.linear.weight": torch.randn(3, 4) for k in range(3)}
    model = CanonicalModel(NoBias(), state, "canonical")
    assert model._plan is not None
    x = torch.randn(5, 4)
    want = torch.stack([x @ state[f"canonical.{k}.linear.weight"].T for k in range(3)])
    torch.testing.assert_close(model.stacked_outputs(x), want, rtol=1e-6, atol=1e-6)
