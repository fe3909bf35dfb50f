"""SplitGP: entropy, the inference rule, the two-exit loss and the λ mix by hand; the
messages of a run (what goes up, the smashed-data bytes, the server's averages) and a
client's personalized evaluation recomputed from them with a hand-written forward pass."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import config, grid_for, run_local, stored

from pflarena.client.job import load_node_data
from pflarena.core import keys
from pflarena.core.model_split import split_state
from pflarena.core.models import build_model
from pflarena.methods.splitgp import keys as splitgp_keys
from pflarena.methods.splitgp.solver import (
    AUX_KEY,
    CLIENT_KEY,
    entropy,
    personalize,
    splitgp_loss,
    splitgp_predict,
)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_entropy_rule_loss_and_mix_by_hand():
    """Catches an entropy in the wrong base or sign, the rule's comparison reversed, the
    exits' weights swapped, and λ applied to the average instead of the local model."""
    client = np.array([[4.0, 0.0, 0.0], [0.1, 0.0, 0.2], [0.0, 0.0, 9.0]])
    server = np.array([[0.0, 3.0, 0.0], [0.0, 3.0, 0.0], [5.0, 0.0, 0.0]])
    p = _softmax(client)
    by_hand = -(p * np.log(p)).sum(axis=1)
    torch.testing.assert_close(entropy(torch.tensor(client)), torch.tensor(by_hand))
    threshold = 0.5  # rows 0 and 2 are confident (entropy < 0.5), row 1 is not
    assert by_hand[0] < threshold < by_hand[1] and by_hand[2] < threshold
    logits, offloaded = splitgp_predict(torch.tensor(client), torch.tensor(server), threshold)
    assert offloaded.tolist() == [False, True, False]
    assert logits.argmax(dim=1).tolist() == [0, 1, 2]
    _, none = splitgp_predict(torch.tensor(client), torch.tensor(server), math.log(3))
    _, every = splitgp_predict(torch.tensor(client), torch.tensor(server), 0.0)
    assert not none.any() and every.all()
    y = np.array([0, 1, 1])
    ce = lambda z: float(np.mean(-np.log(_softmax(z)[np.arange(3), y])))  # noqa: E731
    loss = splitgp_loss(torch.tensor(client), torch.tensor(server), torch.tensor(y), 0.3)
    assert float(loss) == pytest.approx(0.3 * ce(client) + 0.7 * ce(server), rel=1e-12)
    local = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(5)}
    average = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(9)}
    mixed = personalize(local, average, 0.2)
    torch.testing.assert_close(mixed["w"], torch.tensor([0.2 * 1 + 0.8 * 3, 0.2 * 2 + 0.8 * 6]))
    assert int(mixed["n"]) == 9  # integer counters: the average's
    assert torch.equal(personalize(None, average, 0.2)["w"], average["w"])


def test_a_run_uploads_the_client_side_and_the_evaluation_follows_the_paper(tmp_path):
    """From the messages of a two-round run on digits (MLP, server side = the last two
    layers):

    * every train reply holds φ_k (the body), κ_k and θ_k (the head), nothing else;
    * its smashed-data bytes are those of z (n × 200 float32) and the labels (int64) per
      epoch up, of z's gradient down;
    * the server's new model and κ̄ are the example-weighted averages of the replies;
    * a client's personalized evaluation, recomputed with numpy from its stored φ_k, κ_k,
      the server's averages and the rule, gives the counts it reported.

    Catches a private part missing from or added to the upload, a wrong average, a
    personalized start without the λ mix, and an inference that does not follow the rule."""
    lam, threshold = 0.3, 2.2  # early in training the client side is unsure: offload most
    cfg = config(
        strategy="splitgp",
        num_clients=3,
        num_rounds=2,
        fraction_train=1.0,
        local_epochs=2,
        **{"splitgp.lambda": lam, "splitgp.entropy-threshold": threshold},
    )
    grid = grid_for(cfg)
    split = split_state(build_model(cfg.model_name(), (64,), 10), 2)
    train_replies, evaluations = [], {}

    def record(reply):
        metrics = reply.content[keys.METRICS]
        if keys.TRAIN_LOSS in metrics:
            train_replies.append(reply)
        elif keys.PERSONALIZED_CORRECT in metrics:
            evaluations[int(metrics[keys.CLIENT_ID])] = metrics
        return reply

    grid.reply_filter = record
    outcome = run_local(cfg, tmp_path, grid)
    assert all(r["train"]["failures"] == 0 for r in outcome.rounds[1:])
    assert len(train_replies) == 6
    for reply in train_replies:
        content = reply.content
        assert set(content.array_records) == {
            keys.ARRAYS,
            splitgp_keys.AUX,
            splitgp_keys.SERVER_SIDE,
        }
        assert list(content[keys.ARRAYS].keys()) == list(split.body)
        assert list(content[splitgp_keys.SERVER_SIDE].keys()) == list(split.head)
        assert list(content[splitgp_keys.AUX].keys()) == ["weight", "bias"]
        metrics = content[keys.METRICS]
        n = metrics[keys.NUM_EXAMPLES]
        assert metrics[splitgp_keys.SMASHED_UP] == 2 * n * (200 * 4 + 8)
        assert metrics[splitgp_keys.SMASHED_DOWN] == 2 * n * 200 * 4
        assert metrics[splitgp_keys.CLIENT_LOSS] > 0 and metrics[splitgp_keys.SERVER_LOSS] > 0
    last = train_replies[3:]
    # the server's round totals of that traffic, under the names the results files keep
    server = outcome.rounds[-1]["train"]["server"]
    for name in ("splitgp-smashed-bytes-up", "splitgp-smashed-bytes-down"):
        assert server[name] == sum(r.content[keys.METRICS][name] for r in last)
    # the server's averages after round 2, from round 2's replies
    weights = np.array([r.content[keys.METRICS][keys.NUM_EXAMPLES] for r in last], float)
    weights /= weights.sum()

    def average(record, name):
        return sum(w * r.content[record][name].numpy() for w, r in zip(weights, last, strict=True))

    final_eval = [m for m in grid.sent if m.metadata.message_type == "evaluate"][-1].content
    model = {n: a.numpy() for n, a in final_eval[keys.ARRAYS].items()}
    aux = {n: a.numpy() for n, a in final_eval[splitgp_keys.AUX].items()}
    for name in split.body:
        np.testing.assert_allclose(model[name], average(keys.ARRAYS, name), rtol=1e-5, atol=1e-7)
    for name in split.head:
        np.testing.assert_allclose(
            model[name], average(splitgp_keys.SERVER_SIDE, name), rtol=1e-5, atol=1e-7
        )
    np.testing.assert_allclose(aux["weight"], average(splitgp_keys.AUX, "weight"), rtol=1e-5)

    # one client's personalized evaluation, by hand
    node = grid.node_ids[1]
    phi = {n: a.numpy() for n, a in stored(grid.contexts[node], CLIENT_KEY).items()}
    kappa = {n: a.numpy() for n, a in stored(grid.contexts[node], AUX_KEY).items()}
    w1 = lam * phi["net.1.weight"] + (1 - lam) * model["net.1.weight"]
    b1 = lam * phi["net.1.bias"] + (1 - lam) * model["net.1.bias"]
    wk = lam * kappa["weight"] + (1 - lam) * aux["weight"]
    bk = lam * kappa["bias"] + (1 - lam) * aux["bias"]
    data = load_node_data(cfg, {"partition-id": 1, "num-partitions": 3}, torch.device("cpu"))
    x, y = data.x_test.numpy().reshape(len(data.y_test), -1).astype(np.float64), data.y_test.numpy()
    z = np.maximum(x @ w1.T + b1, 0)
    client_logits = z @ wk.T + bk
    hidden = np.maximum(z @ model["net.3.weight"].T + model["net.3.bias"], 0)
    server_logits = hidden @ model["net.5.weight"].T + model["net.5.bias"]
    p = _softmax(client_logits)
    offload = -(p * np.log(p)).sum(axis=1) > threshold
    chosen = np.where(offload[:, None], server_logits, client_logits)
    reported = evaluations[1]
    assert reported[keys.PERSONALIZED_CORRECT] == int((chosen.argmax(axis=1) == y).sum())
    assert reported[splitgp_keys.OFFLOADED] == int(offload.sum())
    client_right = int((client_logits.argmax(axis=1) == y).sum())
    assert reported[splitgp_keys.CLIENT_SIDE_CORRECT] == client_right
    assert 0 < offload.sum() < len(y)  # the rule chose both exits

    # rounds.jsonl: the split of the test samples, per client and over the clients
    details = outcome.rounds[-1]["evaluation"]["method"]
    assert details["per_client"]["1"] == {
        "offloaded": pytest.approx(offload.mean()),
        "client-side": pytest.approx(client_right / len(y)),
    }
    counts = {c: m[keys.PERSONALIZED_COUNT] for c, m in evaluations.items()}
    sent = sum(m[splitgp_keys.OFFLOADED] for m in evaluations.values())
    assert details["offloaded"] == pytest.approx(sent / sum(counts.values()))
    accuracies = [m[splitgp_keys.CLIENT_SIDE_CORRECT] / counts[c] for c, m in evaluations.items()]
    assert details["client-side-mean"] == pytest.approx(np.mean(accuracies))


def test_a_finished_run_re_evaluated_at_its_own_settings_gives_its_last_round(tmp_path):
    """``benchmarks/splitgp_inference.py`` re-evaluates a finished run's state at other λ and
    thresholds. At the run's own settings it must give the run's last recorded evaluation
    (catches a κ̄ or θ̄ other than the final ones, or another client's state);
    a threshold of 0 offloads every sample and ``inf`` none, where the rule's accuracy is
    the client-side model's own."""
    import importlib.util
    from pathlib import Path

    from pflarena.runtime.launch import simulate
    from pflarena.server.build import parse_config

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "splitgp_inference.py"
    spec = importlib.util.spec_from_file_location("splitgp_inference", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    out = tmp_path / "run"
    lam, threshold = 0.4, 2.2  # after two rounds the rule sends some samples each way
    cfg = parse_config(
        {
            "strategy": "splitgp",
            "num-clients": 3,
            "num-rounds": 2,
            "fraction-train": 0.67,
            "output-dir": str(out),
            "splitgp.lambda": lam,
            "splitgp.entropy-threshold": threshold,
        }
    )
    simulate(cfg, verbosity=0, engine="inprocess")
    last = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()][-1]
    counts = tool.client_counts(out, [lam, 1.0], [0.0, threshold, math.inf])
    recorded = last["evaluation"]["per_client"]
    for client, by_setting in counts.items():
        own = by_setting[(lam, threshold)]
        n = own[keys.PERSONALIZED_COUNT]
        assert own[keys.PERSONALIZED_CORRECT] / n == pytest.approx(
            recorded[str(client)]["personalized"]
        )
        assert own[splitgp_keys.OFFLOADED] / n == pytest.approx(
            last["evaluation"]["method"]["per_client"][str(client)]["offloaded"]
        )
        assert 0 < own[splitgp_keys.OFFLOADED] < n  # both exits chose some samples
        for mixed in (lam, 1.0):
            assert by_setting[(mixed, 0.0)][splitgp_keys.OFFLOADED] == n
            alone = by_setting[(mixed, math.inf)]
            assert alone[splitgp_keys.OFFLOADED] == 0
            assert alone[keys.PERSONALIZED_CORRECT] == alone[splitgp_keys.CLIENT_SIDE_CORRECT]
    assert len(tool.table(counts, [lam, 1.0], [0.0, threshold, math.inf])) == 2 + 6


def test_evaluation_details_leave_out_replies_without_possible_counts():
    """A reply without SplitGP's counts, or with more offloaded or right than it has test
    samples, is left out of ``evaluation.method``; the others are pooled by their samples."""
    from flwr.app import MetricRecord

    from pflarena.server.build import build_strategy

    strategy = build_strategy(config(strategy="splitgp", num_clients=4))

    def reply(count, sent=None, right=None):
        metrics = {keys.PERSONALIZED_COUNT: count}
        if sent is not None:
            metrics |= {splitgp_keys.OFFLOADED: sent, splitgp_keys.CLIENT_SIDE_CORRECT: right}
        return MetricRecord(metrics)

    details = strategy.evaluation_details(
        {
            0: reply(10, 5, 8),
            1: reply(30, 3, 15),
            2: reply(10),
            3: reply(10, 11, 2),
            4: reply(10, 2, 11),
        }
    )
    assert set(details["per_client"]) == {"0", "1"}
    assert details["per_client"]["1"] == {"offloaded": 0.1, "client-side": 0.5}
    assert details["offloaded"] == pytest.approx(8 / 40)
    assert details["client-side-pooled"] == pytest.approx(23 / 40)
    assert details["client-side-mean"] == pytest.approx((0.8 + 0.5) / 2)
    assert strategy.evaluation_details({2: reply(10)}) == {}
