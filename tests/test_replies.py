"""Hostile and malformed replies: each is logged, counted as a failure, and the run goes on.

Also a stock Flower ClientApp, written the way Flower's quickstart writes one, joined to a
pflarena FedAvg server.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from helpers import build_strategy, config, grid_for, run_local

from pflarena.client.app import app as pflarena_app
from pflarena.core import keys
from pflarena.strategies.replies import read_evaluation

# --------------------------------------------------------------------------- tampering


def _first_reply_tampered(grid, tamper, message_type: str):
    """A reply filter that applies ``tamper`` to the first reply of the given kind."""
    done = []

    def reply_filter(reply):
        is_train = keys.TRAIN_STEPS in reply.content.metric_records.get(keys.METRICS, {})
        kind = "train" if is_train else "evaluate"
        if (
            not done
            and not reply.has_error()
            and kind == message_type
            and grid.sent[-1].metadata.message_type.endswith(kind)
        ):
            done.append(reply.metadata.src_node_id)
            tamper(reply.content)
        return reply

    return reply_filter, done


def _set_metric(name, value):
    def tamper(content):
        content[keys.METRICS][name] = value

    return tamper


def _drop(key):
    def tamper(content):
        del content[key]

    return tamper


def _array(fn):
    def tamper(content):
        record = content[keys.ARRAYS]
        name = next(iter(record.keys()))
        record[name] = fn(record[name].numpy())

    return tamper


TRAIN_TAMPERING = {
    "no metrics": _drop(keys.METRICS),
    "no arrays": _drop(keys.ARRAYS),
    "NaN metric": _set_metric(keys.TRAIN_LOSS, float("nan")),
    "infinite metric": _set_metric(keys.NUM_EXAMPLES, float("inf")),
    "no num-examples weight": _set_metric(keys.NUM_EXAMPLES, 0),
    "client id out of range": _set_metric(keys.CLIENT_ID, 99),
    "client id of the wrong type": _set_metric(keys.CLIENT_ID, 1.5),
    "metric of the wrong type": _set_metric(keys.NUM_EXAMPLES, [1, 2]),
    "wrong array shape": _array(lambda a: Array(np.zeros((2, 2), a.dtype))),
    "wrong array dtype": _array(lambda a: Array(a.astype(np.float64))),
    "NaN array": _array(lambda a: Array(np.full_like(a, np.nan))),
}


#: what the round's record says about each tampered reply
TRAIN_PROBLEMS = {
    "no metrics": "no MetricRecord 'metrics'",
    "no arrays": "no ArrayRecord 'arrays'",
    "NaN metric": "NaN or infinite",
    "infinite metric": "NaN or infinite",
    "no num-examples weight": "num-examples",
    "client id out of range": "client id",
    "client id of the wrong type": "client id",
    "metric of the wrong type": "num-examples",
    "wrong array shape": "shape",
    "wrong array dtype": "dtype",
    "NaN array": "NaN or infinity",
}


@pytest.mark.parametrize("tampering", list(TRAIN_TAMPERING))
def test_malformed_train_reply_is_a_failure_and_the_run_goes_on(tampering, tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=2, fraction_train=1.0)
    grid = grid_for(cfg)
    grid.reply_filter, done = _first_reply_tampered(grid, TRAIN_TAMPERING[tampering], "train")
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert done, "nothing was tampered with"
    first, second = outcome.rounds[1]["train"], outcome.rounds[2]["train"]
    assert (first["clients"], first["failures"]) == (3, 1)
    assert (second["clients"], second["failures"]) == (4, 0)
    assert outcome.rounds[1]["exchanges"][0]["failures"] == 1
    # the record says which client failed and why; a round without failures says nothing
    [problem] = first["problems"]
    assert problem["client"] == strategy.client_ids[done[0]]
    assert problem["exchange"] == "train"
    assert problem["problem"].startswith("unusable reply: ")
    assert TRAIN_PROBLEMS[tampering] in problem["problem"]
    assert "problems" not in second


def test_two_nodes_claiming_one_client_id_one_is_refused(tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=1, fraction_train=1.0)
    grid = grid_for(cfg)

    def impostor(reply):
        metrics = reply.content.metric_records.get(keys.METRICS)
        if metrics is not None and reply.metadata.src_node_id == grid.node_ids[3]:
            metrics[keys.CLIENT_ID] = 0  # node 3 claims client 0
        return reply

    grid.reply_filter = impostor
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert outcome.rounds[1]["train"]["failures"] == 1
    assert outcome.rounds[0]["evaluation"]["failures"] == 1
    assert sorted(outcome.rounds[1]["evaluation"]["per_client"]) == ["0", "1", "2"]


EVALUATE_TAMPERING = {
    "no metrics": _drop(keys.METRICS),
    "NaN metric": _set_metric(keys.PERSONALIZED_LOSS_SUM, float("nan")),
    "count of the wrong type": _set_metric(keys.PERSONALIZED_COUNT, [3, 4]),
    "more correct than samples": _set_metric(keys.PERSONALIZED_CORRECT, 10**6),
    "client id out of range": _set_metric(keys.CLIENT_ID, -1),
    "no client id": lambda content: content[keys.METRICS].__delitem__(keys.CLIENT_ID),
}


@pytest.mark.parametrize("tampering", list(EVALUATE_TAMPERING))
def test_malformed_evaluate_reply_is_a_failure_and_the_run_goes_on(tampering, tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=1, fraction_train=1.0)
    grid = grid_for(cfg)
    grid.reply_filter, done = _first_reply_tampered(grid, EVALUATE_TAMPERING[tampering], "evaluate")
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert done
    assert outcome.rounds[0]["evaluation"]["failures"] == 1
    assert outcome.rounds[0]["evaluation"]["personalized"]["num_clients"] == 3
    [problem] = outcome.rounds[0]["evaluation"]["problems"]
    assert problem["problem"]
    assert outcome.rounds[1]["evaluation"]["failures"] == 0
    assert "problems" not in outcome.rounds[1]["evaluation"]


# --------------------------------------------------------------------------- stock Flower
stock_app = ClientApp()


@stock_app.train()
def stock_train(msg: Message, context: Context) -> Message:
    """Flower's quickstart shape: train, reply with the arrays and num-examples."""
    arrays = msg.content["arrays"]
    updated = ArrayRecord({k: Array(v.numpy() * 0.99) for k, v in arrays.items()})
    metrics = MetricRecord({"train_loss": 1.0, "num-examples": 50})
    return Message(content=RecordDict({"arrays": updated, "metrics": metrics}), reply_to=msg)


@stock_app.evaluate()
def stock_evaluate(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"eval_loss": 2.0, "eval_acc": 0.25, "num-examples": 40})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def _mixed(stock_nodes):
    def client_app(msg, context):
        app = stock_app if context.node_id in stock_nodes else pflarena_app
        return app(msg, context)

    return client_app


def test_a_stock_flower_client_joins_a_fedavg_server(tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=2, fraction_train=1.0)
    grid = grid_for(cfg)
    stock_node = grid.node_ids[2]
    grid.client_app = _mixed({stock_node})
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert [r["train"]["failures"] for r in outcome.rounds[1:]] == [0, 0]  # its update is used
    evaluation = outcome.rounds[-1]["evaluation"]
    assert evaluation["failures"] == 0
    per_client = evaluation["per_client"]
    assert per_client[str(stock_node)] == {"personalized": 0.25, "test_samples": 40}
    assert {"0", "1", "3"} <= set(per_client)


def test_no_client_able_to_evaluate_stops_at_round_0_naming_what_was_missing(tmp_path):
    silent = ClientApp()

    @silent.evaluate()
    def evaluate(msg, context):
        return Message(content=RecordDict({"metrics": MetricRecord({"foo": 1})}), reply_to=msg)

    cfg = config(strategy="fedavg", num_clients=2, num_rounds=1)
    grid = grid_for(cfg)
    grid.client_app = silent
    with pytest.raises(
        RuntimeError,
        match=r"no client could evaluate.*neither pflarena's counts nor an accuracy.*\['foo'\]",
    ):
        run_local(cfg, tmp_path, grid=grid)


# --------------------------------------------------------------------------- value bounds
def _reply(**arrays):
    return RecordDict({keys.ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()})})


def test_an_update_is_bounded_relative_to_what_the_server_sent():
    from pflarena.strategies.replies import MAX_NORM, NORM_RATIO, array_problem

    rng = np.random.default_rng(0)
    sent = rng.normal(0, 3.0, (40, 25)).astype(np.float32)  # norm ≈ 95 > √1000 ≈ 31.6
    reference = ArrayRecord({"w": Array(sent)})
    bound = NORM_RATIO * float(np.linalg.norm(sent.astype(np.float64)))
    direction = rng.normal(size=sent.shape)
    direction /= np.linalg.norm(direction)
    for scale, accepted in ((0.999, True), (1.001, False)):
        update = (direction * bound * scale).astype(np.float32)
        problem = array_problem(_reply(w=update), reference, keys.ARRAYS)
        assert (problem is None) == accepted, problem
    assert "beyond its bound" in problem
    # a reference of zeros (a delta's template) still allows NORM_RATIO · √size
    zeros = ArrayRecord({"w": Array(np.zeros_like(sent))})
    floor = NORM_RATIO * np.sqrt(sent.size)
    assert (
        array_problem(_reply(w=(direction * floor * 0.99).astype(np.float32)), zeros, "arrays")
        is None
    )
    assert array_problem(_reply(w=(direction * floor * 1.01).astype(np.float32)), zeros, "arrays")
    # and nothing passes MAX_NORM, whatever was sent
    big = ArrayRecord({"w": Array(np.full((4,), MAX_NORM, np.float32))})
    problem = array_problem(_reply(w=np.full((4,), MAX_NORM, np.float32)), big, keys.ARRAYS)
    assert problem is not None and f"at most {MAX_NORM:g}" in problem
    # finite values whose squares overflow float32, and NaN, are named apart
    huge = np.zeros(4, np.float32)
    huge[0] = 3e38
    assert "norm beyond" in array_problem(_reply(w=huge), None, keys.ARRAYS)
    huge[1] = np.nan
    assert "NaN or infinity" in array_problem(_reply(w=huge), None, keys.ARRAYS)


def test_counts_are_checked_against_each_clients_splits():
    from pflarena.strategies.replies import MAX_EXAMPLES, ClientSizes, examples_problem

    sizes = ClientSizes(num_train=(100, 50), num_val=(0, 0), num_test=(30, 20))

    def train(examples, client=1):
        content = RecordDict({keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: examples})})
        return examples_problem(content, client, sizes)

    assert train(50) is None and train(10) is None  # a method may train on part of it
    assert "exceeds client 1's 50 training samples" in train(51)
    assert "whole number" in train(12.5)
    assert train(10**12, client=None) is not None and train(MAX_EXAMPLES, client=None) is None

    def evaluate(correct, count, client=0):
        metrics = {
            keys.CLIENT_ID: client,
            keys.NUM_EXAMPLES: count,
            keys.PERSONALIZED_CORRECT: correct,
            keys.PERSONALIZED_COUNT: count,
            keys.PERSONALIZED_LOSS_SUM: 1.0,
        }
        return read_evaluation(RecordDict({keys.METRICS: MetricRecord(metrics)}), 7, 2, sizes)

    assert evaluate(29, 30).personalized_accuracy == 29 / 30
    assert "not client 0's 30 test samples" in evaluate(10**9, 10**9)
    assert "not client 1's 20 test samples" in evaluate(5, 30, client=1)
    assert "exceeds" in evaluate(31, 30)
