"""Hostile clients against every registered method: each forged reply costs only its sender.

One run per method: in round 1 each of the first nodes forges its first train reply that
can carry the forgery (an extra ArrayRecord or MetricRecord, an extra array, a finite but
huge value, an impossible ``num-examples``), and one node forges its first evaluation (1e9
correct of 1e9). Every forged reply must be rejected with its reason in ``rounds.jsonl``,
every honest reply accepted, and the run must finish. The checks are the shared ones of
``PflStrategy.valid_replies`` and ``aggregate_evaluate``, so no method can opt out.
"""

from __future__ import annotations

import numpy as np
import pflarena_test_methods
import pytest
from flwr.app import Array, ArrayRecord, MessageType, MetricRecord
from helpers import build_strategy, grid_for, run_local

from pflarena.core import keys
from pflarena.core.federation import load_server_data
from pflarena.server.build import parse_config
from pflarena.strategies import builtin_strategies

METHODS = sorted(cls.declaration.name for cls in builtin_strategies()) + sorted(
    cls.declaration.name for cls in pflarena_test_methods.PFLARENA_STRATEGIES
)
#: What a method needs to run at all on the embedded digits.
NEEDS = {
    "fedfomo": {"validation-fraction": 0.2},
    "pfedsv": {"validation-fraction": 0.2},
    "page": {"server-fraction": 0.1},
}
#: Methods whose one round costs several seconds more than the others (the lead's full run).
SLOW = {"apfl", "dapfl", "fedbabu", "fedem", "pfedme", "ppfl"}


def _first_record(content) -> ArrayRecord | None:
    return next(iter(content.array_records.values()), None)


def _extra_record(content) -> bool:
    content["smuggled"] = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    return True


def _extra_metrics(content) -> bool:
    # Flower's aggregate_arrayrecords weighs by the first MetricRecord it finds
    content["smuggled"] = MetricRecord({keys.NUM_EXAMPLES: 10**6})
    return True


def _extra_array(content) -> bool:
    record = _first_record(content)
    if record is None:
        return False
    record["smuggled"] = Array(np.zeros(3, np.float32))
    return True


def _huge_value(content) -> bool:
    record = _first_record(content)
    if record is None:
        return False
    for name in record.keys():
        values = record[name].numpy()
        if values.dtype.kind == "f" and values.size:
            huge = values.copy()
            huge.reshape(-1)[0] = np.finfo(values.dtype).max / 1.1  # finite: 3e38 in float32
            record[name] = Array(huge)
            return True
    return False


def _many_examples(content) -> bool:
    metrics = content.metric_records.get(keys.METRICS)
    if metrics is None or keys.NUM_EXAMPLES not in metrics:
        return False
    metrics[keys.NUM_EXAMPLES] = 10**12
    return True


#: forgery -> (tamper(content) -> whether it applied, what the rejection says)
TRAIN_FORGERIES = {
    "extra ArrayRecord": (_extra_record, "unexpected ArrayRecord"),
    "extra MetricRecord": (_extra_metrics, "unexpected MetricRecord"),
    "extra array": (_extra_array, "smuggled"),
    "finite but huge value": (_huge_value, "norm"),
    "num-examples of 1e12": (_many_examples, "exceeds"),
}


def _perfect_evaluation(content) -> bool:
    metrics = content.metric_records[keys.METRICS]
    for name in (keys.PERSONALIZED_CORRECT, keys.PERSONALIZED_COUNT, keys.NUM_EXAMPLES):
        metrics[name] = 10**9
    return True


class Forger:
    """A reply filter: node ``i`` of ``forgeries`` forges its first train reply (of
    round 1) that can carry the forgery; the last node forges its first evaluation."""

    def __init__(self, grid, forgeries: dict) -> None:
        self.grid = grid
        self.train = dict(zip(grid.node_ids, forgeries.items(), strict=False))
        self.evaluator = grid.node_ids[len(forgeries)]
        self.forged: dict[int, str] = {}  # node -> forgery

    def __call__(self, reply):
        node = reply.metadata.src_node_id
        if reply.has_error() or node in self.forged:
            return reply
        kind = reply.metadata.message_type
        if kind == MessageType.TRAIN and node in self.train:
            name, (tamper, _) = self.train[node]
            if tamper(reply.content):
                self.forged[node] = name
        elif kind == MessageType.EVALUATE and node == self.evaluator:
            _perfect_evaluation(reply.content)
            self.forged[node] = "1e9 correct of 1e9"
        return reply


@pytest.mark.parametrize(
    "method",
    [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in METHODS],
)
def test_forged_replies_are_rejected_and_cost_only_their_sender(method, tmp_path, monkeypatch):
    monkeypatch.setenv("PFLARENA_PLUGINS", pflarena_test_methods.__name__)
    values = {
        "strategy": method,
        "dataset": "digits",
        "num-clients": len(TRAIN_FORGERIES) + 2,
        "num-rounds": 1,
        "fraction-train": 1.0,
        "lr": 0.1,
        "max-failure-fraction": 1.0,  # most clients forge: the round must still go on
        **NEEDS.get(method, {}),
    }
    cfg = parse_config(values)
    grid = grid_for(cfg)
    forger = Forger(grid, TRAIN_FORGERIES)
    grid.reply_filter = forger
    strategy = build_strategy(cfg, load_server_data(cfg.federation_spec()))
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)

    assert forger.forged.get(forger.evaluator) == "1e9 correct of 1e9"
    # every train forgery that this method's replies can carry was made (an extra
    # ArrayRecord, an extra MetricRecord and a count always can; arrays where it sends any)
    made = set(forger.forged.values())
    assert {"extra ArrayRecord", "extra MetricRecord"} <= made

    client_of = {node: grid.node_ids.index(node) for node in grid.node_ids}
    problems: dict[int, list[str]] = {}
    for record in outcome.rounds:
        for part in ("train", "evaluation"):
            for problem in (record.get(part) or {}).get("problems", []):
                problems.setdefault(problem["client"], []).append(problem["problem"])
    forged_clients = {client_of[node]: name for node, name in forger.forged.items()}
    # a node rejected before it ever had a reply accepted is recorded without a client id
    unknown = problems.pop(None, [])
    for client, name in forged_clients.items():
        expected = TRAIN_FORGERIES[name][1] if name in TRAIN_FORGERIES else "test samples"
        said = problems.get(client, []) + (unknown if client == client_of[forger.evaluator] else [])
        assert any(expected in text for text in said), (name, problems, unknown)
    assert all("test samples" in text for text in unknown), unknown
    honest = set(problems) - set(forged_clients)
    assert not honest, {c: problems[c] for c in honest}
    # the forged evaluation is not in the accuracy: its client is missing from round 0's
    first = outcome.rounds[0]["evaluation"]
    assert str(client_of[forger.evaluator]) not in first["per_client"]
    assert first["personalized"]["mean"] < 1.0
    assert len(outcome.rounds) == 2 and outcome.rounds[1]["train"]["clients"] >= 1
