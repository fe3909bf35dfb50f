"""Client-side local solvers, checked against closed forms where there is one."""

import copy

import torch
from flwr.app import ConfigRecord
from helpers import config, grid_for, run_local, stored

from pflarena.client.common import prox_hook
from pflarena.core.models import build_model
from pflarena.methods.ditto.solver import PERSONAL_KEY
from pflarena.methods.local.solver import MODEL_KEY
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy


def test_prox_hook_adds_the_proximal_gradient():
    model = build_model("logreg", (4,), 3, seed=0)
    anchor = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    plain = torch.autograd.grad(loss, list(model.parameters()))
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    prox_hook(anchor, 0.7)(model)
    for p, g, a in zip(model.parameters(), plain, anchor.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g + 0.7 * (p.detach() - a.detach()))


def test_a_prox_hook_without_a_copy_follows_its_anchor_and_one_with_a_copy_does_not():
    """copy=True pulls toward the anchor's values when the hook was made (FedProx trains the
    model it is anchored to); copy=False toward its values when the hook runs, the same
    thing for an anchor that does not change (Ditto's, FedAMP's)."""
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    grads = {}
    for copied in (True, False):
        model = build_model("logreg", (4,), 3, seed=0)
        anchor = build_model("logreg", (4,), 3, seed=1)
        hook = prox_hook(anchor, 0.7, copy=copied)
        made = [p.detach().clone() for p in anchor.parameters()]
        with torch.no_grad():
            for p in anchor.parameters():
                p.add_(1.0)  # the anchor trained after the hook was made
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        plain = [p.grad.clone() for p in model.parameters()]
        hook(model)
        pulled_to = made if copied else [p.detach() for p in anchor.parameters()]
        for p, g, a in zip(model.parameters(), plain, pulled_to, strict=True):
            torch.testing.assert_close(p.grad, g + 0.7 * (p.detach() - a))
        grads[copied] = [p.grad for p in model.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(grads[True], grads[False], strict=True))


def _distance_to_global_after_one_round(strategy, **kw):
    cfg = config(strategy=strategy, local_epochs=3, **kw)
    grid = grid_for(cfg)
    arrays = initial_arrays(cfg)
    messages = list(build_strategy(cfg).configure_train(1, arrays, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    return sum(
        float(((r.content["arrays"][k].numpy() - arrays[k].numpy()) ** 2).sum())
        for r in replies
        for k in arrays.keys()
    )


def test_fedprox_proximal_term_keeps_updates_closer():
    free = _distance_to_global_after_one_round("fedprox", **{"fedprox.mu": 0.0})
    pulled = _distance_to_global_after_one_round("fedprox", **{"fedprox.mu": 5.0})
    assert pulled < 0.5 * free


def test_local_and_ditto_models_persist_in_client_state(tmp_path):
    for strategy, key in (("local", MODEL_KEY), ("ditto", PERSONAL_KEY)):
        cfg = config(strategy=strategy, num_rounds=2)
        grid = grid_for(cfg)
        run_local(cfg, tmp_path / strategy, grid=grid)
        assert all(stored(ctx, key) is not None for ctx in grid.contexts.values())


def test_ditto_large_lambda_ties_personal_to_global(tmp_path):
    """With a very strong pull the personal model tracks the received global model."""

    def personal_gap(lam):
        cfg = config(strategy="ditto", num_rounds=1, **{"ditto.lambda": lam}, lr=0.01)
        grid = grid_for(cfg)
        run_local(cfg, tmp_path / f"l{lam}", grid=grid)
        init = initial_arrays(cfg)
        gaps = []
        for ctx in grid.contexts.values():
            personal = stored(ctx, PERSONAL_KEY)
            gaps.append(
                sum(
                    float(((personal[k].numpy() - init[k].numpy()) ** 2).sum()) for k in init.keys()
                )
            )
        return sum(gaps)

    assert personal_gap(50.0) < 0.2 * personal_gap(0.0)


def test_fedavg_ft_finetuning_leaves_no_trace(tmp_path):
    cfg = config(strategy="fedavg-ft", num_rounds=1, **{"fedavg-ft.finetune-epochs": 3})
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert all(len(ctx.state.array_records) == 0 for ctx in grid.contexts.values())
    evaluation = outcome.rounds[-1]["evaluation"]
    # Fine-tuning on local data beats the un-tuned global model on local test data.
    assert evaluation["personalized"]["mean"] > evaluation["global"]["mean"]


def test_each_message_seeds_torchs_global_rng_the_same_way_in_any_process():
    """Dropout (the ``tf-cnn`` model) draws from torch's global RNG. The ClientApp seeds it
    per message from (run seed, client, round, phase), so a client's draws do not depend on
    what its process ran before; catches a missing or process-dependent seeding."""
    from pflarena.client.app import _job

    cfg = config(strategy="fedavg")
    grid = grid_for(cfg)
    messages = list(
        build_strategy(cfg).configure_train(1, initial_arrays(cfg), ConfigRecord(), grid)
    )
    draws = []
    for disturb, msg in [(0, messages[0]), (1, messages[0]), (0, messages[1])]:
        torch.manual_seed(disturb)
        torch.rand(17)  # whatever the process did before
        _job(msg, grid.contexts[msg.metadata.dst_node_id], train=True)
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], draws[1])  # same message, different history
    assert not torch.equal(draws[0], draws[2])  # another client draws differently
