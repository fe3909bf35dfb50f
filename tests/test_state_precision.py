"""``state-precision``: the models a client keeps in its state, in float32 or float16."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, grid_for, run_local, stored

from pflarena.client.solvers.ditto import PERSONAL_KEY
from pflarena.core.config import ConfigError


def _personal_models(precision: str, tmp_path) -> tuple[list[dict], float]:
    cfg = config(strategy="ditto", num_clients=4, num_rounds=3, state_precision=precision)
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path / precision, grid=grid)
    models = [stored(context, PERSONAL_KEY) for context in grid.contexts.values()]
    accuracy = outcome.rounds[-1]["evaluation"]["personalized"]["mean"]
    return [{n: a.numpy() for n, a in m.items()} for m in models], accuracy


def test_float16_keeps_the_personal_models_at_half_the_bytes_and_close(tmp_path):
    """Ditto's personal models are stored in float16 (half the bytes of float32's), load
    back into float32 models, and the run ends where float32's does to within float16's
    rounding of the weights, compounded over 3 rounds of training: the weights within 5 % of
    their largest and the accuracy within 3 points."""
    full, full_accuracy = _personal_models("float32", tmp_path)
    half, half_accuracy = _personal_models("float16", tmp_path)
    for f, h in zip(full, half, strict=True):
        assert {n: a.dtype for n, a in f.items()} == {n: np.dtype(np.float32) for n in f}
        assert {n: a.dtype for n, a in h.items()} == {n: np.dtype(np.float16) for n in h}
        assert sum(a.nbytes for a in h.values()) * 2 == sum(a.nbytes for a in f.values())
        for name in f:
            scale = float(np.abs(f[name]).max()) or 1.0
            assert np.abs(h[name].astype(np.float32) - f[name]).max() <= 0.05 * scale, name
    assert abs(half_accuracy - full_accuracy) <= 0.03


def test_an_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="state-precision"):
        config(strategy="ditto", state_precision="bfloat16")
