"""The run's multi-step learning-rate schedule (``lr-milestones``, ``lr-gamma``).

Checked against torch's own ``MultiStepLR`` (stepped once after every round), and on the
messages of real runs: every method that declares it honours the schedule sends the
scheduled ``lr`` in every train message of every round; a method that does not is refused.
"""

from __future__ import annotations

import pytest
import torch
from helpers import config, grid_for, run_local

from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.core.presets import load_preset
from pflarena.server.build import parse_config
from pflarena.strategies import builtin_strategies
from pflarena.strategies.base import LocalTraining

SCHEDULED = sorted(
    cls.declaration.name
    for cls in builtin_strategies()
    if "lr-milestones" in cls.declaration.honours
)
#: What a method needs to run at all on the embedded digits.
NEEDS = {
    "fedfomo": {"validation-fraction": 0.2},
    "pfedsv": {"validation-fraction": 0.2},
    "fedrep": {"local-epochs": 2},  # its own epochs; the run default is not "set"
}


@pytest.mark.parametrize(("milestones", "gamma"), [((100, 150), 0.1), ((3, 3, 7), 0.5), ((), 0.1)])
def test_the_factor_is_torchs_multi_step_scheduler(milestones, gamma):
    """Round t's lr equals MultiStepLR's after t − 1 steps, for rounds 1-200 (a repeated
    milestone decays twice, as MultiStepLR's does)."""
    training = LocalTraining(lr=0.3, lr_milestones=milestones, lr_gamma=gamma)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimizer, milestones=list(milestones), gamma=gamma
    )
    for server_round in range(1, 201):
        assert training.to_config(server_round)[keys.LR] == pytest.approx(
            optimizer.param_groups[0]["lr"], rel=1e-12
        )
        optimizer.step()
        scheduler.step()


def test_the_milestones_are_read_and_checked():
    assert config(strategy="fedavg", **{"lr-milestones": " 150,100 "}).milestones() == (100, 150)
    assert config(strategy="fedavg").milestones() == ()
    for bad in ("10,x", "0", "-3", "2.5"):
        with pytest.raises(ConfigError, match="lr-milestones must be rounds >= 1"):
            config(strategy="fedavg", **{"lr-milestones": bad})
    with pytest.raises(ConfigError, match="lr-gamma"):
        config(strategy="fedavg", **{"lr-milestones": "2", "lr-gamma": 1.5})


def test_a_method_that_does_not_honour_the_schedule_refuses_it():
    """FedPG's step size has its own per-round decay (fedpg.lr-decay): a run-level schedule
    there would be ignored on the server's step, so it is refused, naming the key."""
    with pytest.raises(ConfigError, match="lr-milestones=2 set, but fedpg"):
        config(strategy="fedpg", **{"lr-milestones": "2"})


def test_the_ppfl_presets_schedule_every_method():
    """The authors' scripts drop every method's step size at rounds 100 and 150."""
    for name in ("ppfl-synthetic", "ppfl-mnist"):
        preset = load_preset(name)
        for strategy in preset.strategies:
            cfg = parse_config(preset.overrides(strategy) | {"strategy": strategy})
            assert cfg.milestones() == (100, 150) and cfg.lr_gamma == 0.1, (name, strategy)


@pytest.mark.parametrize("method", SCHEDULED)
def test_every_train_message_carries_the_scheduled_lr(method, tmp_path):
    cfg = config(
        strategy=method,
        num_clients=3,
        num_rounds=3,
        lr=0.2,
        eval_every=3,
        **{"lr-milestones": "1,2", "lr-gamma": 0.5},
        **NEEDS.get(method, {}),
    )
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid)
    assert [r["round"] for r in outcome.rounds if "train" in r] == [1, 2, 3]
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    rounds = {int(m.content[keys.CONFIG][keys.SERVER_ROUND]) for m in sent}
    assert {1, 2, 3} <= rounds  # (pFedGT's initial message is round 0's)
    for message in sent:
        if keys.LR not in message.content[keys.CONFIG]:  # an exchange with no local SGD
            continue
        server_round = int(message.content[keys.CONFIG][keys.SERVER_ROUND])
        want = 0.2 * 0.5 ** sum(m < server_round for m in (1, 2))
        assert message.content[keys.CONFIG][keys.LR] == pytest.approx(want), (method, server_round)
