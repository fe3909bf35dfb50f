"""Fed-ROD: the balanced-softmax loss against its formula by hand, the head helpers against a
hand-written forward pass, and the personalized head never leaving its client."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import config, grid_for, run_local, stored
from torch.nn import functional as F

from pflarena.algorithms.heads import feature_size, first_head_layer, head_forward, head_input
from pflarena.core import keys
from pflarena.core.model_split import split_state
from pflarena.core.models import build_model
from pflarena.methods.fedrod.solver import (
    PERSONAL_KEY,
    balanced_softmax_loss,
    class_counts,
    personalized_logits,
)
from pflarena.server.app import initial_arrays


def _bsm_by_hand(logits: np.ndarray, y: np.ndarray, counts: np.ndarray, gamma: float) -> float:
    """−log(N_y^γ e^{g_y} / Σ_c N_c^γ e^{g_c}), term by term, classes with N_c = 0 left out."""
    losses = []
    for row, label in zip(logits, y, strict=True):
        denominator = sum(
            counts[c] ** gamma * np.exp(row[c]) for c in range(len(row)) if counts[c] > 0
        )
        losses.append(-np.log(counts[label] ** gamma * np.exp(row[label]) / denominator))
    return float(np.mean(losses))


@pytest.mark.parametrize("gamma", [1.0, 0.25])
def test_the_balanced_softmax_loss_is_its_formula_with_an_absent_class(gamma):
    """Catches a missing or wrong log-count shift, γ applied wrongly, and an absent class
    (N_c = 0) that is not dropped from the sum or that turns the loss or gradient NaN."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4))
    y = np.array([0, 1, 1, 3, 0, 0])  # class 2 is absent from this client
    counts = class_counts(torch.tensor(y), 4).numpy()
    assert counts.tolist() == [3, 2, 0, 1]
    leaf = torch.tensor(logits, requires_grad=True)
    loss = balanced_softmax_loss(leaf, torch.tensor(y), torch.tensor(counts), gamma)
    assert float(loss.detach()) == pytest.approx(_bsm_by_hand(logits, y, counts, gamma), rel=1e-12)
    loss.backward()
    assert torch.isfinite(leaf.grad).all()
    assert torch.all(leaf.grad[:, 2] == 0)  # an absent class gets no gradient
    # the log-count shift matters: the plain cross-entropy differs
    assert float(loss.detach()) != pytest.approx(
        float(F.cross_entropy(leaf.detach(), torch.tensor(y))), rel=1e-3
    )


def test_gamma_zero_is_the_plain_cross_entropy():
    logits = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 0, 1, 1, 1])
    loss = balanced_softmax_loss(logits, y, class_counts(y, 3), 0.0)
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)


def _mlp_by_hand(state: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's features at its last layer and its logits, written out."""
    h = torch.relu(x @ state["net.1.weight"].T + state["net.1.bias"])
    z = torch.relu(h @ state["net.3.weight"].T + state["net.3.bias"])
    return z, z @ state["net.5.weight"].T + state["net.5.bias"]


def test_head_input_and_head_forward_match_a_hand_written_forward_pass():
    """Catches features taken at the wrong layer and a second head not run on them."""
    model = build_model("mlp", (64,), 10, seed=0).double()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    layer = first_head_layer(model, 1)
    assert layer == "net.5"
    with head_input(model, layer) as seen:
        logits = model(x)
    z, expected = _mlp_by_hand(model.state_dict(), x)
    torch.testing.assert_close(seen[-1], z)
    torch.testing.assert_close(logits, expected)
    other = build_model("mlp", (64,), 10, seed=5).double().state_dict()
    personal = {n: other[n] for n in split_state(model, 1).head}
    out = head_forward(model, layer, x, z * 0.5, personal)
    torch.testing.assert_close(out, (z * 0.5) @ other["net.5.weight"].T + other["net.5.bias"])
    # g + p: the generic head and the personal head on the same features
    torch.testing.assert_close(
        personalized_logits(model, layer, personal, x),
        expected + z @ other["net.5.weight"].T + other["net.5.bias"],
    )
    assert feature_size(model, layer, x[:1]) == 200
    # a two-layer head: the activation between its layers is applied
    state = model.state_dict()
    head2 = {n: other[n] for n in split_state(model, 2).head}
    h = torch.relu(x @ state["net.1.weight"].T + state["net.1.bias"])
    out2 = head_forward(model, first_head_layer(model, 2), x, h, head2)
    hidden = torch.relu(h @ other["net.3.weight"].T + other["net.3.bias"])
    torch.testing.assert_close(out2, hidden @ other["net.5.weight"].T + other["net.5.bias"])


def test_the_personal_head_never_appears_in_an_upload(tmp_path):
    """From the messages: every train reply holds one record, exactly the model's entries
    (body and generic head), and none of its arrays equals the personal head the client
    holds at that moment (which has trained away from its start). Catches a personal head
    sent instead of, or next to, the generic one."""
    cfg = config(strategy="fedrod", num_clients=3, num_rounds=2, fraction_train=1.0)
    grid = grid_for(cfg)
    head = split_state(build_model(cfg.model_name(), (64,), 10), 1).head
    seen = []

    def record(reply):
        if keys.TRAIN_LOSS in reply.content.get(keys.METRICS, {}):
            personal = stored(grid.contexts[reply.metadata.src_node_id], PERSONAL_KEY)
            seen.append((reply, {n: personal[n].numpy().copy() for n in head}))
        return reply

    grid.reply_filter = record
    outcome = run_local(cfg, tmp_path, grid)
    assert all(r["train"]["failures"] == 0 for r in outcome.rounds[1:])
    assert len(seen) == 6
    initial = initial_arrays(cfg)
    names = list(initial.keys())
    for reply, personal in seen:
        assert list(reply.content.array_records) == [keys.ARRAYS]
        upload = reply.content[keys.ARRAYS]
        assert list(upload.keys()) == names
        assert not np.allclose(personal["net.5.weight"], initial["net.5.weight"].numpy())
        for array in upload.values():
            values = array.numpy()
            for kept in personal.values():
                assert values.shape != kept.shape or not np.allclose(values, kept)
