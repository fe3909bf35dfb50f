"""Cross-evaluation: clients' personalized models tested on other clients' test splits.

Off unless ``cross-eval-clients`` > 0, since it moves personalized models off their
clients. At every evaluation of the run (round 0 included), after the protocol's own:

1. **export**: the *owners*, a seeded sample of ``cross-eval-clients`` client ids fixed for
   the run (:func:`cross_owners`), send their personalized model: the model their method's
   ``evaluate`` tests as personalized (the solver's ``personalized_model``). The message is
   the protocol's evaluate message plus the phase, so methods that personalize from the
   global model (FedAvg, FedAvg-FT) get it.
2. **score**: every connected client gets every exported model (one shared record each)
   and tests each on its own test split.

From ``A[i, j]``, owner i's model on client j's test split, the FedPG paper's metrics
(docs/papers/fedpg.md §5.4, §9.14), per owner and with equal weight per client:

- **local** ``A[i, i]``: the protocol's personalized accuracy of that client;
- **synthetic** the mean of ``A[i, j]`` over ``{i} ∪ K_i``, ``K_i`` a seeded draw of
  ``round((m − 1) c)`` other clients (``cross-eval-fraction`` c), fixed for the run
  (:func:`synthetic_partners`): c = 0 is local accuracy, c = 1 global accuracy;
- **global** the mean of ``A[i, j]`` over every client j.

Each has its mean and standard deviation over the owners that were scored. A client that did
not reply is left out of the means it would enter (and counted in ``failures``). The round's
``evaluation.cross`` in ``rounds.jsonl`` holds them, the per-owner values and the matrix;
its traffic is counted apart from the method's and the protocol's (``cross_eval_bytes_down``
and ``_up``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflarena.core import keys
from pflarena.core.config import RunConfig
from pflarena.strategies.base import PflStrategy
from pflarena.strategies.replies import (
    ClientSizes,
    array_problem,
    count_problem,
    metric_problem,
    read_client_id,
)

__all__ = [
    "CrossEvaluation",
    "cross_owners",
    "cross_scores",
    "run_cross_evaluation",
    "synthetic_partners",
]

#: ``send(messages) -> (replies, bytes down, bytes up)``, the run loop's.
Send = Callable[[list[Message]], tuple[list[Message], int, int]]


def cross_owners(num_clients: int, count: int, seed: int) -> list[int]:
    """The client ids whose personalized models are cross-evaluated: ``count`` of
    ``num_clients``, drawn with the run seed, sorted."""
    if not 0 <= count <= num_clients:
        raise ValueError(f"cross-eval-clients must be in [0, {num_clients}], got {count}")
    rng = np.random.default_rng([seed, 0xC505])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def synthetic_partners(num_clients: int, owner: int, fraction: float, seed: int) -> list[int]:
    """K_i: ``round((m − 1) · fraction)`` clients other than ``owner`` (halves round up),
    drawn with the run seed and the owner, sorted."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"cross-eval-fraction must be in [0, 1], got {fraction}")
    others = [j for j in range(num_clients) if j != owner]
    size = math.floor(len(others) * fraction + 0.5)
    rng = np.random.default_rng([seed, 0xC505, owner])
    return sorted(int(j) for j in rng.choice(others, size=size, replace=False))


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "std": None}
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def cross_scores(
    accuracy: dict[int, dict[int, float]],
    num_clients: int,
    fraction: float,
    seed: int,
) -> dict[str, Any]:
    """Local, synthetic and global accuracy per owner, and their mean and std over owners.

    ``accuracy[i][j]`` is owner i's model on client j's test split, for the clients that
    replied. An owner whose own client did not score it has no local accuracy; one with no
    score at all is left out.
    """
    per_owner: dict[str, dict[str, float | None]] = {}
    for owner, row in sorted(accuracy.items()):
        if not row:
            continue
        synthetic = [
            row[j]
            for j in [owner, *synthetic_partners(num_clients, owner, fraction, seed)]
            if j in row
        ]
        per_owner[str(owner)] = {
            "local": row.get(owner),
            "synthetic": float(np.mean(synthetic)) if synthetic else None,
            "global": float(np.mean(list(row.values()))),
        }
    out: dict[str, Any] = {}
    for scope in ("local", "synthetic", "global"):
        out[scope] = _stats([v[scope] for v in per_owner.values() if v[scope] is not None])
    out["per_owner"] = per_owner
    return out


@dataclass
class CrossEvaluation:
    """One cross-evaluation's results and traffic."""

    record: dict[str, Any] | None
    bytes_down: int = 0
    bytes_up: int = 0


def score_problem(
    content: RecordDict, owners: list[int], client: int, sizes: ClientSizes | None
) -> str | None:
    """Why client ``client``'s scores of the ``owners``' models cannot be used: each count is
    its test split's size where the server knows it (as for the protocol's evaluation)."""
    problem = metric_problem(content)
    if problem is not None:
        return problem
    metrics = content.metric_records[keys.METRICS]
    names = (keys.CROSS_OWNERS, keys.CROSS_CORRECT, keys.CROSS_COUNT)
    if any(name not in metrics for name in names):
        return f"a score reply needs {', '.join(names)}"
    got, correct, count = (list(metrics[name]) for name in names)
    if got != owners:
        return f"scored models {got}, was sent {owners}"
    if len(correct) != len(owners) or len(count) != len(owners):
        return "one count per model expected"
    if any(n <= 0 or not 0 <= c <= n for c, n in zip(correct, count, strict=True)):
        return "counts are not counts (correct in [0, count], count > 0)"
    if any(n != int(n) or c != int(c) for c, n in zip(correct, count, strict=True)):
        return "counts must be whole numbers"
    return next(
        (p for n in count if (p := count_problem(keys.CROSS_COUNT, int(n), client, sizes))), None
    )


def run_cross_evaluation(
    grid: Grid,
    strategy: PflStrategy,
    cfg: RunConfig,
    server_round: int,
    arrays: ArrayRecord,
    template: ArrayRecord,
    send: Send,
) -> CrossEvaluation:
    """Export the owners' personalized models, have every client score them.

    ``arrays`` are the server's arrays of the round (sent with the export messages, as with
    the protocol's evaluation); ``template`` is the run's model, which every exported model
    must match in names, shapes and dtypes.
    """
    owners = cross_owners(cfg.num_clients, cfg.cross_eval_clients, cfg.seed)
    node_of = {client: node for node, client in strategy.client_ids.items()}
    connected = set(grid.get_node_ids())
    exporters = [c for c in owners if node_of.get(c) in connected]
    config = ConfigRecord({keys.PHASE: keys.PHASE_CROSS_EXPORT})
    export = [
        m
        for m in strategy.configure_evaluate(server_round, arrays, config, grid)
        if strategy.client_ids.get(m.metadata.dst_node_id) in exporters
    ]
    replies, down, up = send(export)
    models: dict[int, ArrayRecord] = {}
    failures = len(owners) - len(replies)
    problems: list[str] = []
    for msg in replies:
        node = msg.metadata.src_node_id
        client = None if msg.has_error() else read_client_id(msg.content, cfg.num_clients)
        problem = (
            msg.error.reason
            if msg.has_error()
            else metric_problem(msg.content) or array_problem(msg.content, template, keys.ARRAYS)
        )
        if problem is None and (client != strategy.client_ids.get(node) or client not in owners):
            problem = f"claims client {client!r}, expected {strategy.client_ids.get(node)}"
        if problem is not None:
            log(WARNING, "cross-evaluation: export from node %d unusable: %s", node, problem)
            failures += 1
            problems.append(problem)
            continue
        models[int(client)] = msg.content[keys.ARRAYS]
    if not models:
        reason = problems[0] if problems else "no reply"
        if server_round == 0:  # at the start: a setting that cannot work, not a bad round
            raise RuntimeError(
                f"cross-evaluation: none of the {len(export)} owners could export its "
                f"personalized model; first problem: {reason}"
            )
        log(WARNING, "cross-evaluation: no personalized model was exported (%s)", reason)
        return CrossEvaluation(None, down, up)

    scored = sorted(models)
    base = strategy.evaluate_config(server_round) | {keys.PHASE: keys.PHASE_CROSS_SCORE}
    content = RecordDict(
        {
            keys.CONFIG: ConfigRecord(base),
            # one record per model, shared by every message (not copied)
            **{f"{keys.CROSS_PREFIX}{owner}": models[owner] for owner in scored},
        }
    )
    nodes = strategy.ordered_nodes(grid)
    score = [
        Message(content=content, message_type=MessageType.EVALUATE, dst_node_id=n) for n in nodes
    ]
    replies, score_down, score_up = send(score)
    accuracy: dict[int, dict[int, float]] = {owner: {} for owner in scored}
    failures += len(nodes) - len(replies)
    for msg in replies:
        node = msg.metadata.src_node_id
        problem = msg.error.reason if msg.has_error() else metric_problem(msg.content)
        client = None if problem else read_client_id(msg.content, cfg.num_clients)
        if problem is None and not isinstance(client, int):
            problem = f"no usable client id ({client!r})"
        if problem is None:
            problem = score_problem(msg.content, scored, int(client), strategy.client_sizes)
        if problem is not None:
            log(WARNING, "cross-evaluation: scores from node %d unusable: %s", node, problem)
            failures += 1
            continue
        metrics = msg.content.metric_records[keys.METRICS]
        for owner, correct, count in zip(
            scored, metrics[keys.CROSS_CORRECT], metrics[keys.CROSS_COUNT], strict=True
        ):
            accuracy[owner][int(client)] = correct / count
    clients = sorted({j for row in accuracy.values() for j in row})
    record = cross_scores(accuracy, cfg.num_clients, cfg.cross_eval_fraction, cfg.seed)
    record |= {
        "owners": scored,
        "fraction": cfg.cross_eval_fraction,
        "clients": clients,
        # owner × client accuracies (null: that client did not score)
        "matrix": [[accuracy[o].get(j) for j in clients] for o in scored],
        "failures": failures,
    }
    return CrossEvaluation(record, down + score_down, up + score_up)
