"""Strategy registry: the strategy a run config names, built with that config's values."""

from __future__ import annotations

from collections.abc import Callable

from pflarena.core.config import STRATEGY_NAMES, RunConfig
from pflarena.strategies.base import LocalTraining, PflStrategy
from pflarena.strategies.ditto import Ditto
from pflarena.strategies.fedavg import FedAvg
from pflarena.strategies.fedavg_ft import FedAvgFT
from pflarena.strategies.fedprox import FedProx
from pflarena.strategies.local import Local

__all__ = ["STRATEGIES", "build_strategy"]


def _common(cfg: RunConfig) -> dict:
    return {
        "training": LocalTraining(
            local_epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        ),
        "fraction_train": cfg.fraction_train,
        "min_train_nodes": cfg.min_train_clients,
        "seed": cfg.seed,
    }


STRATEGIES: dict[str, Callable[[RunConfig], PflStrategy]] = {
    "local": lambda cfg: Local(**_common(cfg)),
    "fedavg": lambda cfg: FedAvg(**_common(cfg)),
    "fedavg-ft": lambda cfg: FedAvgFT(finetune_epochs=cfg.personal_epochs, **_common(cfg)),
    "fedprox": lambda cfg: FedProx(proximal_mu=cfg.proximal_mu, **_common(cfg)),
    "ditto": lambda cfg: Ditto(
        ditto_lambda=cfg.ditto_lambda, personal_epochs=cfg.personal_epochs, **_common(cfg)
    ),
}
assert set(STRATEGIES) == set(STRATEGY_NAMES), "config and registry disagree on strategy names"


def build_strategy(cfg: RunConfig) -> PflStrategy:
    return STRATEGIES[cfg.strategy](cfg)
