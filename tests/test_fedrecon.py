"""FedRecon: the support/query split, fresh local layers, and local parameters neither
uploaded nor kept, read from the messages and from the client state on disk."""

from __future__ import annotations

import torch
from helpers import config, run_resumable, stateful_grid

from pflarena.algorithms.heads import reset_layers
from pflarena.core import keys
from pflarena.core.model_split import split_state
from pflarena.core.models import build_model
from pflarena.methods.fedrecon.solver import support_query


def test_support_and_query_are_disjoint_and_cover_the_split_or_both_are_all():
    generator = torch.Generator().manual_seed(0)
    support, query = support_query(10, 0.3, generator)
    assert len(support) == 3 and len(query) == 7
    assert set(support.tolist()) | set(query.tolist()) == set(range(10))
    assert not set(support.tolist()) & set(query.tolist())
    support, query = support_query(10, 1.0, generator)
    assert support.tolist() == query.tolist() == list(range(10))


def test_reset_layers_draws_fresh_values_for_the_named_layers_only():
    """Catches a reset that keeps the old values, touches other layers, or is not seeded."""
    model = build_model("mlp", (64,), 10, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reset_layers(model, ["net.5"], seed=1)
    after = model.state_dict()
    assert not torch.equal(after["net.5.weight"], before["net.5.weight"])
    assert all(torch.equal(after[k], before[k]) for k in before if not k.startswith("net.5"))
    again = build_model("mlp", (64,), 10, seed=0)
    reset_layers(again, ["net.5"], seed=1)
    assert torch.equal(again.state_dict()["net.5.weight"], after["net.5.weight"])


def _state_files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_local_parameters_are_neither_uploaded_nor_kept(tmp_path):
    """From the messages: train and evaluate messages carry exactly the body (g) down, every
    train reply exactly the body up, so the head (l) never travels; from the client state on
    disk, read after every reply: nothing is ever written. And an evaluation by a client that
    trained equals one by a client that never did (l is rebuilt from scratch). Catches a
    head sent either way, a head kept across rounds, and a reconstruction that starts from
    anything the client kept."""
    cfg = config(
        strategy="fedrecon",
        num_clients=3,
        num_rounds=3,
        fraction_train=1.0,
        **{"fedrecon.support-fraction": 0.5},
    )
    state_dir = tmp_path / "state"
    grid = stateful_grid(cfg, state_dir, 1_000_003)
    split = split_state(build_model(cfg.model_name(), (64,), 10), 1)
    replies = []

    def inspect(reply):
        assert _state_files(state_dir) == [], "a client kept state"
        replies.append(reply)
        return reply

    grid.reply_filter = inspect
    outcome, _ = run_resumable(cfg, tmp_path / "run", grid)
    assert outcome.rounds[-1]["round"] == 3
    assert all(r["train"]["failures"] == 0 for r in outcome.rounds[1:])
    for message in grid.sent:
        assert list(message.content[keys.ARRAYS].keys()) == list(split.body)
    train_replies = [r for r in replies if keys.TRAIN_LOSS in r.content[keys.METRICS]]
    assert len(train_replies) == 9
    for reply in train_replies:
        assert list(reply.content.array_records) == [keys.ARRAYS]
        assert list(reply.content[keys.ARRAYS].keys()) == list(split.body)
    # an evaluation of the last round, by a client that trained and by a fresh one
    last_evaluate = [m for m in grid.sent if m.metadata.message_type == "evaluate"][-1]
    node = last_evaluate.metadata.dst_node_id
    trained = grid.client_app(last_evaluate, grid.contexts[node]).content[keys.METRICS]
    fresh_grid = stateful_grid(cfg, tmp_path / "fresh", 1_000_003)
    fresh = fresh_grid.client_app(last_evaluate, fresh_grid.contexts[node]).content[keys.METRICS]
    assert trained[keys.PERSONALIZED_CORRECT] == fresh[keys.PERSONALIZED_CORRECT]
    assert trained[keys.PERSONALIZED_LOSS_SUM] == fresh[keys.PERSONALIZED_LOSS_SUM]
    assert trained[keys.PERSONALIZED_CORRECT] > 0.2 * trained[keys.PERSONALIZED_COUNT]
