"""FedPer, FedRep, LG-FedAvg and FedBABU: what leaves a client, read from the messages.

On digits the run's model is the MLP ``net`` = (Flatten 0, Linear 1, ReLU 2, Linear 3,
ReLU 4, Linear 5); its parts are named here by hand, not by the split under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MessageType, RecordDict
from helpers import config, grid_for, run_local, stored
from torch.nn import functional as F

from pflarena.client.job import ClientJob, load_node_data
from pflarena.client.state import ClientState, MemoryVersions
from pflarena.core import keys
from pflarena.core.models import build_model
from pflarena.core.training import batches
from pflarena.methods.fedbabu import solver as fedbabu_solver
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config

FIRST = ("net.1.weight", "net.1.bias")
MIDDLE = ("net.3.weight", "net.3.bias")
LAST = ("net.5.weight", "net.5.bias")

#: method -> (entries that travel, entries that must never leave the client, client-state
#: key of the private part or None, extra settings to keep the test short)
CASES = {
    "fedper": (FIRST + MIDDLE, LAST, "fedper/head", {}),
    # local-epochs at its default: FedRep replaces it by its own two epoch counts
    "fedrep": (FIRST + MIDDLE, LAST, "fedrep/head", {"fedrep.head-epochs": 2, "local-epochs": 2}),
    "lgfedavg": (MIDDLE + LAST, FIRST, "lgfedavg/local-layers", {}),
    "fedbabu": (FIRST + MIDDLE, LAST, None, {"fedbabu.finetune-epochs": 1}),
}


def _cfg(method, **overrides):
    return config(
        strategy=method,
        num_clients=3,
        num_rounds=2,
        fraction_train=1.0,
        **(CASES[method][3] | overrides),
    )


@pytest.mark.parametrize("method", sorted(CASES))
def test_only_the_shared_part_leaves_the_client(method, tmp_path):
    """Every upload holds exactly the shared entries (a private one in an ArrayRecord, or a
    full model, fails), no message the server sends holds a private entry, the private part
    is kept in the client's state and trained there, and the round's ``bytes_up`` is the
    shared entries' size times the clients (computed from the initial arrays)."""
    shared, private, state_key, _ = CASES[method]
    cfg = _cfg(method)
    grid = grid_for(cfg)
    uploads = []

    def capture(reply):
        if reply.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            uploads.append(reply)
        return reply

    grid.reply_filter = capture
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert len(uploads) == cfg.num_clients * cfg.num_rounds
    for reply in uploads:
        assert tuple(reply.content[keys.ARRAYS].keys()) == shared
        for record in reply.content.array_records.values():
            assert not set(private) & set(record.keys())
    for message in grid.sent:  # train and evaluate messages: the private part never goes down
        for record in message.content.array_records.values():
            assert not set(private) & set(record.keys())
    initial = initial_arrays(cfg)
    if state_key is not None:
        for context in grid.contexts.values():
            kept = stored(context, state_key)
            assert kept is not None and tuple(kept.keys()) == private
            assert any(
                not np.array_equal(kept[n].numpy(), initial[n].numpy()) for n in private
            )  # trained on the client
    shared_bytes = sum(len(initial[n].data) for n in shared)
    full_bytes = sum(len(initial[n].data) for n in initial.keys())
    for record in outcome.rounds[1:]:
        assert record["bytes_up"] == cfg.num_clients * shared_bytes < cfg.num_clients * full_bytes
        assert record["bytes_down"] == cfg.num_clients * shared_bytes
    # the server's model: the private part is still the initial one
    for name in private:
        np.testing.assert_array_equal(outcome.arrays[name].numpy(), initial[name].numpy())
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0]


@pytest.mark.parametrize("method", sorted(CASES))
def test_the_server_averages_the_uploads_and_keeps_the_rest(method):
    """The new server model's shared entries are the uploads' weighted mean (the method's
    default weighting, recomputed here with numpy), its private entries the old ones."""
    shared, private, _, _ = CASES[method]
    cfg = _cfg(method, alpha=0.3)
    strategy = build_strategy(cfg)
    grid = grid_for(cfg)
    arrays = initial_arrays(cfg)
    replies = list(grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    new, _ = strategy.aggregate_train(1, replies)
    counts = np.array([float(r.content[keys.METRICS][keys.NUM_EXAMPLES]) for r in replies])
    assert len(set(counts)) > 1  # unequal clients: the two weightings differ
    weights = counts if strategy.params.weighting == "examples" else np.ones(len(replies))
    expected_weighting = {"fedper": "examples", "fedrep": "examples"}.get(method, "uniform")
    assert strategy.params.weighting == expected_weighting
    for name in shared:
        stacked = np.stack(
            [r.content[keys.ARRAYS][name].numpy().astype(np.float64) for r in replies]
        )
        mean = np.tensordot(weights / weights.sum(), stacked, axes=1)
        np.testing.assert_allclose(new[name].numpy(), mean, rtol=1e-6, atol=1e-7)
    for name in private:
        np.testing.assert_array_equal(new[name].numpy(), arrays[name].numpy())
    assert list(new.keys()) == list(arrays.keys())


@pytest.mark.parametrize(("head_epochs", "body_epochs"), [(2, 0), (0, 1)])
def test_fedrep_trains_only_the_part_of_each_phase(head_epochs, body_epochs):
    """With body epochs 0 the uploaded body is the received one bit for bit and the head
    moved; with head epochs 0 the stored head is the initial one and the body moved. A
    phase that trains the whole model, or the wrong part, fails."""
    cfg = _cfg("fedrep", **{"fedrep.head-epochs": head_epochs, "fedrep.body-epochs": body_epochs})
    strategy = build_strategy(cfg)
    grid = grid_for(cfg)
    arrays = initial_arrays(cfg)
    replies = list(grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    for reply, context in zip(replies, grid.contexts.values(), strict=True):
        body = reply.content[keys.ARRAYS]
        head = stored(context, "fedrep/head")
        body_moved = any(
            not np.array_equal(body[n].numpy(), arrays[n].numpy()) for n in body.keys()
        )
        head_moved = any(not np.array_equal(head[n].numpy(), arrays[n].numpy()) for n in LAST)
        assert body_moved == (body_epochs > 0)
        assert head_moved == (head_epochs > 0)


def _job(cfg, content: RecordDict) -> ClientJob:
    node = {"partition-id": 0, "num-partitions": cfg.num_clients}
    device = torch.device("cpu")
    state = ClientState(MemoryVersions(RecordDict()), None, None, prune=False)
    return ClientJob(cfg, load_node_data(cfg, node, device), state, content, device)


def test_fedbabu_trains_the_body_under_the_fixed_head():
    """One client's upload equals plain SGD on the body alone with the head held at its
    initialisation, written here with torch (the same batches): a solver that also trains
    the head (whose upload would hide it, the head staying home) gives another body."""
    cfg = _cfg("fedbabu", local_epochs=2)
    strategy = build_strategy(cfg)
    grid = grid_for(cfg)
    message = next(iter(strategy.configure_train(1, initial_arrays(cfg), ConfigRecord(), grid)))
    job = _job(cfg, message.content)
    upload = fedbabu_solver.train(job)[0][keys.ARRAYS]
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
    body = [p for name, p in model.named_parameters() if name not in LAST]
    optimizer = torch.optim.SGD(body, lr=cfg.lr)
    x, y = job.data.x_train, job.data.y_train
    generator = job.generator("train")
    for _ in range(cfg.local_epochs):
        for idx in batches(len(y), cfg.batch_size, generator=generator):
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
    reference = model.state_dict()
    assert tuple(upload.keys()) == FIRST + MIDDLE
    for name in upload.keys():
        torch.testing.assert_close(torch.as_tensor(upload[name].numpy()), reference[name])


def test_fedbabu_head_stays_at_its_initialisation_and_moves_only_in_fine_tuning(tmp_path):
    """After federated rounds the global model's head is the initial head bit for bit (a
    head trained or averaged in training fails) while the body moved; the fine-tuned
    personalized model's head differs from it; with 0 fine-tuning epochs the personalized
    model is the global one."""
    cfg = _cfg("fedbabu")
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid)
    initial = initial_arrays(cfg)
    for name in LAST:
        np.testing.assert_array_equal(outcome.arrays[name].numpy(), initial[name].numpy())
    assert not np.array_equal(
        outcome.arrays["net.1.weight"].numpy(), initial["net.1.weight"].numpy()
    )
    for finetune, head_moves in ((1, True), (0, False)):
        strategy = build_strategy(
            parse_config(cfg.to_run_config() | {"fedbabu.finetune-epochs": finetune})
        )
        message = next(iter(strategy.configure_evaluate(3, outcome.arrays, ConfigRecord(), grid)))
        job = _job(cfg, message.content)
        global_state = fedbabu_solver.global_model(job).state_dict()
        for name in LAST:
            np.testing.assert_array_equal(global_state[name].numpy(), initial[name].numpy())
        tuned = fedbabu_solver.personalized_model(job).state_dict()
        for part in (LAST, FIRST):  # the whole model is fine-tuned, head and body
            moved = any(not torch.equal(tuned[n], global_state[n]) for n in part)
            assert moved == head_moves, (finetune, part)
    evaluation = outcome.rounds[-1]["evaluation"]
    assert evaluation["global"] is not None


def test_a_one_layer_model_is_refused_before_the_run_with_the_reason():
    for method in CASES:
        with pytest.raises(Exception, match="swallow the whole model"):
            config(strategy=method, model="logreg")
    with pytest.raises(Exception, match="lgfedavg.global-layers=3"):
        config(strategy="lgfedavg", **{"lgfedavg.global-layers": 3})
