"""``state-precision``: the models a client keeps in its state, in float32 or float16."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, grid_for, run_local, stored

from pflarena.core.config import ConfigError
from pflarena.methods.ditto.solver import PERSONAL_KEY


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


def test_a_model_from_arrays_is_theirs_in_the_models_dtypes():
    """model_from fills a skeleton with the arrays' own tensors: the same values as a copy
    of the initial model loaded with them, float32 where the arrays are float16, and its
    values are its own (training it changes nothing it was built from)."""
    import torch
    from flwr.app import ArrayRecord, RecordDict

    from pflarena.client.job import ClientJob, load_node_data
    from pflarena.client.state import ClientState
    from pflarena.core.versions import MemoryVersions

    cfg = config(strategy="ditto", model="small-cnn-bn")  # BatchNorm: int64 buffers too
    device = torch.device("cpu")
    node = {"partition-id": 0, "num-partitions": cfg.num_clients}
    state = ClientState(MemoryVersions(RecordDict()), None, None, prune=False)
    job = ClientJob(cfg, load_node_data(cfg, node, device), state, RecordDict(), device)
    source = job.new_model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p))
    arrays = ArrayRecord(source.state_dict())
    model = job.model_from(arrays)
    expected = job.new_model()
    expected.load_state_dict(source.state_dict())
    for (name, value), reference in zip(
        model.state_dict().items(), expected.state_dict().values(), strict=True
    ):
        assert value.dtype == reference.dtype and torch.equal(value, reference), name
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert torch.equal(next(job.model_from(arrays).parameters()), next(source.parameters()))
    half = ArrayRecord(
        {n: v.half() if v.is_floating_point() else v for n, v in source.state_dict().items()}
    )
    from_half = job.model_from(half)
    assert {v.dtype for v in from_half.state_dict().values()} == {
        v.dtype for v in expected.state_dict().values()
    }
    first = next(from_half.parameters())
    assert torch.equal(first, next(source.parameters()).half().float())
