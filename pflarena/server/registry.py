"""Strategy registry: the strategy a run config names, built with that config's values."""

from __future__ import annotations

from collections.abc import Callable

from pflarena.core.config import STRATEGY_NAMES, RunConfig
from pflarena.core.datasets import dataset_info
from pflarena.core.models import build_model
from pflarena.core.training import trainable_names
from pflarena.strategies.base import LocalTraining, PflStrategy
from pflarena.strategies.ditto import Ditto
from pflarena.strategies.fedavg import FedAvg
from pflarena.strategies.fedavg_ft import FedAvgFT
from pflarena.strategies.fedprox import FedProx
from pflarena.strategies.local import Local
from pflarena.strategies.pfedgt import PFedGT

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
        "fraction_train": cfg.fraction_train or None,  # 0: the strategy's default
        "min_train_nodes": cfg.min_train_clients,
        "seed": cfg.seed,
    }


def _trainable_names(cfg: RunConfig) -> list[str]:
    info = dataset_info(cfg.dataset)
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    return trainable_names(model)


STRATEGIES: dict[str, Callable[[RunConfig], PflStrategy]] = {
    "local": lambda cfg: Local(**_common(cfg)),
    "fedavg": lambda cfg: FedAvg(**_common(cfg)),
    "fedavg-ft": lambda cfg: FedAvgFT(finetune_epochs=cfg.personal_epochs, **_common(cfg)),
    "fedprox": lambda cfg: FedProx(proximal_mu=cfg.proximal_mu, **_common(cfg)),
    "ditto": lambda cfg: Ditto(
        ditto_lambda=cfg.ditto_lambda, personal_epochs=cfg.personal_epochs, **_common(cfg)
    ),
    "pfedgt": lambda cfg: PFedGT(
        num_clients=cfg.num_clients,
        trainable=_trainable_names(cfg),
        gammas=cfg.client_gammas(),
        mu=cfg.pfedgt_mu,
        rho=cfg.pfedgt_rho,
        message_step=cfg.pfedgt_lambda,
        server_lr=cfg.pfedgt_server_lr,
        variant=cfg.pfedgt_variant,
        c_init=cfg.pfedgt_c_init,
        warm_start=cfg.pfedgt_warm_start,
        message_init=cfg.pfedgt_message_init,
        delta_ref=cfg.pfedgt_delta_ref,
        **_common(cfg),
    ),
}
assert set(STRATEGIES) == set(STRATEGY_NAMES), "config and registry disagree on strategy names"


def build_strategy(cfg: RunConfig) -> PflStrategy:
    return STRATEGIES[cfg.strategy](cfg)
