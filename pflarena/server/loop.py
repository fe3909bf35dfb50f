"""The run loop: rounds of training, the evaluation protocol, and the results files.

It drives any :class:`~pflarena.strategies.base.PflStrategy` through Flower's Grid the
way ``Strategy.start`` does, and adds what the project's results need: an evaluation of
every client (or of a ``fraction-evaluate`` sample) every ``eval-every`` rounds, before the
first round and after the last, bytes sent per round, and one ``rounds.jsonl`` line per round
written as it happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflarena.core import keys
from pflarena.core.config import RunConfig
from pflarena.core.phases import mark
from pflarena.core.text import count
from pflarena.server.checkpoint import Checkpoint, save_checkpoint
from pflarena.server.crosseval import run_cross_evaluation
from pflarena.server.metrics import definitions
from pflarena.server.progress_events import RoundDone, StartupPhase, emit
from pflarena.server.results import (
    INTERRUPTED,
    ResultsWriter,
    client_failures,
    read_rounds,
    summarize_rounds,
)
from pflarena.strategies.base import PflStrategy, evaluation_stats, sample_size
from pflarena.strategies.exchange import NO_REPLY, Exchange, record_nbytes, reply_error

__all__ = ["ClientSync", "RunOutcome", "run_rounds", "wait_for_nodes"]


@dataclass
class RunOutcome:
    arrays: ArrayRecord
    rounds: list[dict[str, Any]] = field(default_factory=list)
    #: seconds until the clients were connected and round 0 (or a resumed run's catch-up
    #: evaluation) was done: the clients' start-up and first data build, not the rounds'
    startup_s: float = 0.0


@dataclass
class ClientSync:
    """What the loop tells every client about its state, beside what the strategy accepted
    (client/state.py), and how long a message lives.

    ``state_key`` names the run's client state (kept in ``config.json``, so that a moved,
    copied or extended run finds it; empty: the clients hash the run config); ``held`` maps
    a client id to the state version its last accepted train reply left (``state-version``),
    which the client must still hold; ``ttl`` is each message's time to live (the round
    timeout: an engine gives up on a client, and frees what runs it, when it passes);
    ``checkpointed`` is what the strategy had accepted from each client when the run's last
    checkpoint was written: a resume rolls the client back to that version, so the client
    keeps it and the accepted one, and nothing older (client/state.py).
    """

    state_key: str = ""
    held: dict[int, int] = field(default_factory=dict)
    ttl: float | None = None
    checkpointed: dict[int, int] = field(default_factory=dict)

    def checkpoint_written(self, strategy: PflStrategy) -> None:
        """The checkpoint just written (or resumed from) holds the strategy's ``accepted``."""
        self.checkpointed = dict(strategy.accepted)

    def learn(self, strategy: PflStrategy, exchanges: list[Exchange]) -> None:
        """Note the state version of every train reply the strategy accepted."""
        for exchange in exchanges:
            if exchange.update_id is None:
                continue
            for reply in exchange.replies:
                if reply.has_error() or keys.METRICS not in reply.content.metric_records:
                    continue
                client_id = strategy.client_ids.get(exchange.node_of(reply))
                if client_id is None or strategy.accepted.get(client_id) != exchange.update_id:
                    continue
                version = reply.content.metric_records[keys.METRICS].get(keys.STATE_VERSION)
                if isinstance(version, int) and 0 <= version <= exchange.update_id:
                    self.held[client_id] = version

    def meta(self) -> dict[str, Any]:
        return {"held": {str(client): version for client, version in self.held.items()}}

    def restore(self, meta: dict[str, Any] | None) -> None:
        self.held = {int(c): int(v) for c, v in (meta or {}).get("held", {}).items()}


def state_problem(reply: Message) -> str | None:
    """Why a reply cannot be used because of its client's state (``state-missing``)."""
    if reply.has_error() or keys.METRICS not in reply.content.metric_records:
        return None
    code = reply.content.metric_records[keys.METRICS].get(keys.STATE_MISSING)
    if not code:
        return None
    if code == 2:
        return "client state unreadable: a stored entry of this client's state cannot be read"
    return "client state missing: the state this client's accepted replies left is gone"


def screen_state(
    strategy: PflStrategy, messages: list[Message], replies: list[Message]
) -> tuple[list[Message], list[dict[str, Any]]]:
    """The replies with those whose client lost its state turned into error replies (so no
    strategy uses them), and who those clients are (client id as the reply says, problem).

    The strategy learns such a node's client id (unless the node is known), as from any
    reply: its next messages must say which version the server accepted, or the client
    would take its newest one, which the server never accepted, for its state."""
    sent = {m.metadata.message_id: m for m in messages}
    screened, lost = [], []
    for reply in replies:
        problem = state_problem(reply)
        original = sent.get(reply.metadata.reply_to_message_id)
        if problem is None or original is None:
            screened.append(reply)
            continue
        client = reply.content.metric_records[keys.METRICS].get(keys.CLIENT_ID)
        limit = strategy.num_clients
        in_range = isinstance(client, int) and client >= 0 and (limit is None or client < limit)
        client = client if in_range else None
        if client is not None:
            strategy.client_ids.setdefault(original.metadata.dst_node_id, client)
        lost.append({"client": client, "problem": problem})
        log(WARNING, "node %d: %s", original.metadata.dst_node_id, problem)
        error = Message(Error(code=0, reason=problem), reply_to=original)
        error.metadata.__dict__["_src_node_id"] = original.metadata.dst_node_id
        screened.append(error)
    return screened, lost


class ClientsFailed(RuntimeError):
    """Every client of an exchange replied with an error: the run stops (its next round
    would fail the same way). The message is one line per distinct error with its count;
    ``round_record`` holds who failed, with why (the summary's ``client_failures``)."""

    round_record: dict[str, Any] | None = None


def failed_exchange(
    strategy: PflStrategy, server_round: int, name: str, messages: list[Message], replies: list
) -> dict[str, Any]:
    """What a round records of an exchange every client failed: each client, with why."""
    exchange = Exchange(name, messages, replies)
    problems = [
        _who_failed(strategy, node) | {"exchange": name, "problem": exchange.problem_of(node)}
        for node in exchange.failed
    ]
    if name == "evaluate":
        return {
            "round": server_round,
            "evaluation_failures": {"failures": len(problems), "problems": problems},
        }
    return {"round": server_round, "train": {"problems": problems}}


def report_client_errors(
    name: str, messages: list[Message], replies: list[Message], stop: bool = True
) -> None:
    """Log each distinct error the clients of an exchange replied with once, with the
    number of clients that hit it (not once per client: a run of 2,000 clients failing
    alike gives one line); with ``stop`` (unless ``max-failure-fraction=1``, which lets a run
    go on whatever fails), raise :class:`ClientsFailed` when every client failed so."""
    counts: dict[str, int] = {}
    for reply in replies:
        if reply.has_error():
            reason = " ".join(str(reply.error.reason).split())
            counts[reason] = counts.get(reason, 0) + 1
    if not counts:
        return
    total = len(messages)
    lines = [f"{count} of {total} clients: {reason}" for reason, count in counts.items()]
    shown = lines[:10]
    if len(lines) > 10:
        shown.append(f"... and {len(lines) - 10} other errors")
    for line in shown:
        log(WARNING, "pflarena: %s failed on %s", name, line)
    if stop and sum(counts.values()) == total and total > 0:
        raise ClientsFailed(f"every client failed in {name}: " + "; ".join(shown))


def wait_for_nodes(grid: Grid, count: int, timeout: float, poll: float = 1.0) -> list[int]:
    """Block until ``count`` nodes are connected; raise after ``timeout`` seconds."""
    start = time.monotonic()
    last_log = -1e9
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        waited = time.monotonic() - start
        if waited > timeout:
            raise TimeoutError(
                f"only {len(nodes)} of num-clients={count} clients connected after {timeout:.0f}s; "
                "start more SuperNodes or lower num-clients"
            )
        if waited - last_log >= 10:
            log(INFO, "waiting for clients: %d of %d connected", len(nodes), count)
            last_log = waited
        time.sleep(poll)


def _send(
    grid: Grid,
    strategy: PflStrategy,
    messages: list[Message],
    timeout: float,
    lost: list[dict[str, Any]] | None = None,
    stop: bool = True,
    server_round: int | None = None,
) -> tuple[list[Message], int, int]:
    """Send evaluation ``messages`` and receive; the usable and error replies and the bytes
    down and up. ``stop``: raise :class:`ClientsFailed` when every client failed (with what
    ``server_round`` records of it, when given)."""
    down = sum(record_nbytes(m.content) for m in messages)
    replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
    try:
        report_client_errors("evaluate", messages, replies, stop)
    except ClientsFailed as failed:
        if server_round is not None:
            failed.round_record = failed_exchange(
                strategy, server_round, "evaluate", messages, replies
            )
        raise
    replies, found = screen_state(strategy, messages, replies)
    if lost is not None:
        lost.extend(found)
    up = sum(record_nbytes(m.content) for m in replies if not m.has_error())
    missing = len(messages) - len(replies)
    if missing:
        log(WARNING, "%d of %d clients did not reply within %.0fs", missing, len(messages), timeout)
    return replies, down, up


def _evaluate(
    grid: Grid,
    strategy: PflStrategy,
    server_round: int,
    arrays: ArrayRecord,
    cfg: RunConfig,
    template: ArrayRecord,
    sync: ClientSync | None = None,
    fraction: float = 1.0,
) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """The protocol's evaluation of every client (``fraction`` below 1: of that share of
    them, :meth:`~pflarena.strategies.base.PflStrategy.evaluation_nodes`), and the
    cross-evaluation when asked for; returns the record and the traffic
    (``eval_bytes_down``, ``cross_eval_bytes_*``)."""
    timeout = cfg.round_timeout
    strategy.evaluate_fraction = fraction
    messages = with_sync(
        strategy,
        list(strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid)),
        None,
        sync,
    )
    lost: list[dict[str, Any]] = []
    replies, down, _ = _send(
        grid,
        strategy,
        messages,
        timeout,
        lost,
        stop=cfg.max_failure_fraction < 1,
        server_round=server_round,
    )
    traffic: dict[str, Any] = {"eval_bytes_down": down}
    if server_round == 0 and (data_s := _client_time(replies, keys.DATA_TIME, max)):
        traffic["data_s"] = data_s  # the slowest client's first data build
    strategy.aggregate_evaluate(server_round, replies)
    results = list(strategy.last_evaluation.values())
    failures = strategy.last_eval_failures
    silent = _silent_nodes(messages, replies)
    missing = len(silent)
    if not results and server_round == 0:
        raise RuntimeError(
            f"no client could evaluate the initial model ({len(failures)} of {len(messages)} "
            f"replies unusable, {missing} missing); first problem: "
            f"{failures[0][1] if failures else 'no reply'}"
        )
    # every client that failed, with why: those whose reply was unusable, those with none
    problems = [
        _who_failed(strategy, node) | {"problem": reason}
        for node, reason in [
            *_evaluation_failures(messages, replies, failures),
            *((node, NO_REPLY) for node in silent),
        ]
    ]
    first = failures[0][1] if failures else NO_REPLY
    try:
        check_eval_failures(
            cfg,
            server_round,
            len(failures) + missing,
            len(messages),
            first + _lost_state_text(lost),
        )
    except TooManyFailures as stop:
        stop.round_record = {
            "round": server_round,
            "evaluation_failures": {"failures": len(problems), "problems": problems},
        }
        raise
    if not results:
        if problems:  # no usable evaluation, and who failed it, with why
            traffic["evaluation_failures"] = {"failures": len(problems), "problems": problems}
        return None, traffic
    personalized, global_ = evaluation_stats(results)
    record = {
        "personalized": personalized.as_dict(),
        "global": global_.as_dict() if global_ is not None else None,
        "per_client": {
            str(r.client_id): {
                "personalized": r.personalized_accuracy,
                "test_samples": r.personalized_count,
            }
            for r in results
        },
        "failures": len(failures) + missing,
    }
    if fraction < 1.0:  # a fraction-evaluate sample: how many were asked, of how many
        connected = len(list(grid.get_node_ids()))
        record["sample"] = {"asked": len(messages), "connected": connected, "fraction": fraction}
    if problems:
        record["problems"] = problems
    if lost:
        record["state_problems"] = lost
    if strategy.last_eval_details:
        record["method"] = strategy.last_eval_details
    if cfg.cross_eval_clients > 0 and cross_evaluates(cfg, server_round):
        cross = run_cross_evaluation(
            grid,
            strategy,
            cfg,
            server_round,
            arrays,
            template,
            send=lambda msgs: _send(grid, strategy, with_sync(strategy, msgs, None, sync), timeout),
        )
        record["cross"] = cross.record
        traffic |= {
            "cross_eval_bytes_down": cross.bytes_down,
            "cross_eval_bytes_up": cross.bytes_up,
        }
    return record, traffic


def _evaluation_failures(
    messages: list[Message], replies: list[Message], failures: list[tuple[int, str]]
) -> list[tuple[int, str]]:
    """The strategy's evaluation ``failures`` (node, why) with each error reply's node found
    through the message it answers: an error reply the SuperLink makes for a node that went
    away comes from the SuperLink, whose id the strategy would record for every such node."""
    exchange = Exchange("evaluate", messages, replies)
    answered = {reply.metadata.src_node_id for reply in replies if not reply.has_error()}
    return [(exchange.node_of(r), reply_error(r)) for r in replies if r.has_error()] + [
        (node, why) for node, why in failures if node in answered
    ]


def _silent_nodes(messages: list[Message], replies: list[Message]) -> list[int]:
    """The nodes of ``messages`` that sent no reply (within the round timeout)."""
    answered = {reply.metadata.reply_to_message_id for reply in replies}
    return [m.metadata.dst_node_id for m in messages if m.metadata.message_id not in answered]


def _who_failed(strategy: PflStrategy, node_id: int) -> dict[str, Any]:
    """A failed client as a round's ``problems`` name it: its client id, and where that is
    not known (a node that never replied usefully) its node id, so that the summary can
    tell such nodes apart (``client_failures``)."""
    client = strategy.client_ids.get(node_id)
    return {"client": client} if client is not None else {"client": None, "node": node_id}


def evaluation_fraction(cfg: RunConfig, server_round: int) -> float:
    """The share of the clients the evaluation of ``server_round`` tests: ``fraction-evaluate``,
    except at round 0 unless ``initial-evaluation`` is ``sample`` (and then only where the
    engine knows each node's client: :func:`learn_client_ids`) and at the last round unless
    ``final-evaluation`` is ``sample``, which test every client."""
    if server_round == 0:
        return cfg.fraction_evaluate if cfg.initial_evaluation == "sample" else 1.0
    if server_round == cfg.num_rounds and cfg.final_evaluation == "all":
        return 1.0
    return cfg.fraction_evaluate


def learn_client_ids(grid: Grid, strategy: PflStrategy) -> bool:
    """Tell ``strategy`` which client each node holds before any message, where ``grid``
    knows it (the in-process engine's simulated nodes, ``known_client_ids``); whether it
    could. Round 0's evaluation of every client is otherwise where the strategy learns
    them, and two things need every client's id before the first round: the training
    sampler's order (reproducible for a seed, whatever the node ids) and the per-client
    server state of methods such as pFedHN."""
    known = getattr(grid, "known_client_ids", None)
    ids = known() if callable(known) else None
    if ids is None:
        return False
    strategy.client_ids.update(ids)
    return True


def cross_evaluates(cfg: RunConfig, server_round: int) -> bool:
    """Whether the evaluation of ``server_round`` includes the cross-evaluation."""
    every = cfg.cross_eval_every
    return every == 0 or server_round % every == 0 or server_round == cfg.num_rounds


def _client_time(replies: list[Message], key: str = keys.TRAIN_TIME, reduce: Any = sum) -> float:
    """Summed wall time (or, ``key=keys.TRAIN_CPU``, CPU time) the clients report for their
    local solvers this round (``reduce=max``: the longest)."""
    return reduce(
        (
            float(m.content.metric_records[keys.METRICS].get(key, 0.0))
            for m in replies
            if not m.has_error() and keys.METRICS in m.content.metric_records
        ),
        **({} if reduce is sum else {"default": 0.0}),
    )


def with_sync(
    strategy: PflStrategy,
    messages: list[Message],
    update_id: int | None,
    client_sync: ClientSync | None = None,
) -> list[Message]:
    """The messages, each with its client's sync record (client/state.py).

    A node whose client id is not known yet gets no ``accepted`` (its newest state stands);
    train messages carry the ``update-id`` their writes become; with ``client_sync`` each
    also carries the run's ``state-key``, the version its client must hold (``holds``) and
    the time to live. The other records are the strategy's own objects, not copies.
    """
    stamped = []
    for msg in messages:
        node_id = msg.metadata.dst_node_id
        sync: dict[str, int | str] = {}
        client_id = strategy.client_ids.get(node_id)
        if client_id is not None:
            sync[keys.ACCEPTED] = strategy.accepted.get(client_id, 0)
            if client_sync is not None:
                sync[keys.HOLDS] = client_sync.held.get(client_id, 0)
                sync[keys.CHECKPOINTED] = client_sync.checkpointed.get(client_id, 0)
        if update_id is not None:
            sync[keys.UPDATE_ID] = update_id
        if client_sync is not None and client_sync.state_key:
            sync[keys.STATE_KEY] = client_sync.state_key
        content = RecordDict({**dict(msg.content.items()), keys.SYNC: ConfigRecord(sync)})
        ttl = client_sync.ttl if client_sync is not None else None
        stamped.append(
            Message(
                content=content,
                message_type=msg.metadata.message_type,
                dst_node_id=node_id,
                ttl=ttl,
            )
        )
    return stamped


#: Exchanges a round may have: update ids are ``round * MAX_EXCHANGES + index``.
MAX_EXCHANGES = 100


class RoundExchanges:
    """The ``send`` a strategy's round gets: sends, receives, and keeps every exchange."""

    def __init__(
        self,
        grid: Grid,
        strategy: PflStrategy,
        server_round: int,
        timeout: float,
        sync: ClientSync | None = None,
        stop: bool = True,
    ):
        self.grid, self.strategy, self.timeout = grid, strategy, timeout
        self.stop = stop  # every client failing an exchange stops the run (ClientsFailed)
        self.server_round = server_round
        self.sync = sync
        self.exchanges: list[Exchange] = []
        #: clients whose reply was not used because their state is gone or unreadable
        self.state_problems: list[dict[str, Any]] = []

    def __call__(self, name: str, messages: list[Message]) -> Exchange:
        if len(self.exchanges) + 1 >= MAX_EXCHANGES:
            raise RuntimeError(f"more than {MAX_EXCHANGES - 1} exchanges in one round")
        update_id = self.server_round * MAX_EXCHANGES + len(self.exchanges) + 1
        messages = with_sync(self.strategy, messages, update_id, self.sync)
        replies = (
            list(self.grid.send_and_receive(messages, timeout=self.timeout)) if messages else []
        )
        try:
            report_client_errors(name, messages, replies, self.stop)
        except ClientsFailed as stop:
            stop.round_record = failed_exchange(
                self.strategy, self.server_round, name, messages, replies
            )
            raise
        replies, lost = screen_state(self.strategy, messages, replies)
        self.state_problems += [entry | {"exchange": name} for entry in lost]
        exchange = Exchange(name, messages, replies, update_id=update_id)
        if exchange.missing:
            log(
                WARNING,
                "%s: %d of %d clients did not reply within %.0fs",
                name,
                len(exchange.missing),
                len(messages),
                self.timeout,
            )
        self.exchanges.append(exchange)
        return exchange


class TooManyFailures(RuntimeError):
    """More clients failed in a round than ``max-failure-fraction`` allows.

    ``round_record`` holds what the round recorded up to the stop (its failures, with
    why), which ``rounds.jsonl`` does not get: the summary's ``client_failures`` includes
    it."""

    round_record: dict[str, Any] | None = None


def _stop(cfg: RunConfig, server_round: int, what: str, failed: int, total: int, first: str):
    raise TooManyFailures(
        f"round {server_round}: {failed} of {total} clients failed in {what} (more than "
        f"max-failure-fraction={cfg.max_failure_fraction:g}); first problem: {first or 'unknown'}. "
        f"The run stopped before this round's checkpoint: `pflarena run --resume <output-dir>` "
        f"repeats the round (a crashed simulation actor gets replaced), and "
        f"max-failure-fraction=1 lets a run go on whatever fails"
    )


def _lost_state_text(lost: list[dict[str, Any]]) -> str:
    clients = sorted({str(entry["client"]) for entry in lost})
    return f" (client state missing or unreadable: clients {', '.join(clients)})" if lost else ""


def check_failures(
    cfg: RunConfig,
    server_round: int,
    what: str,
    strategy: PflStrategy,
    exchanges: list[Exchange],
    lost: list[dict[str, Any]] | None = None,
) -> None:
    """Stop the run when too many of the round's sampled clients failed in its exchanges."""
    sampled = set(strategy.last_sampled)
    failed = [n for e in exchanges for n in e.failed if n in sampled]
    unique = set(failed)
    if sampled and len(unique) > cfg.max_failure_fraction * len(sampled):
        first = next(e.problem_of(n) for e in exchanges for n in e.failed if n in sampled)
        _stop(
            cfg, server_round, what, len(unique), len(sampled), first + _lost_state_text(lost or [])
        )


def check_eval_failures(cfg: RunConfig, server_round: int, failed: int, total: int, first: str):
    """Stop the run when too many clients failed the round's evaluation."""
    if total and failed > cfg.max_failure_fraction * total:
        _stop(cfg, server_round, "the evaluation", failed, total, first)


def round_eta(round_times: list[float], remaining: int) -> float | None:
    """Seconds left: the mean time of the rounds run so far (round 0 excluded) times the
    rounds still to run; None before the first round."""
    if not round_times:
        return None
    return sum(round_times) / len(round_times) * remaining


def _train_record(strategy: PflStrategy, exchanges: list[Exchange], metrics: Any) -> dict[str, Any]:
    """The round's ``train`` entry: the sampled clients and those that failed in any exchange,
    with why (``problems``: one entry per failed client and exchange, only when some failed)."""
    sampled = list(strategy.last_sampled)
    failing = {node for exchange in exchanges for node in exchange.failed}
    failed = failing & set(sampled)
    record: dict[str, Any] = {
        "clients": len(sampled) - len(failed),
        "failures": len(failed),
        "loss": float(metrics[keys.TRAIN_LOSS]) if metrics and keys.TRAIN_LOSS in metrics else None,
        "sampled": sorted(strategy.client_ids.get(n, -1) for n in sampled),
        "client_time_s": sum(_client_time(e.replies) for e in exchanges),
        "client_cpu_s": sum(_client_time(e.replies, keys.TRAIN_CPU) for e in exchanges),
        # whatever else the strategy reports about its own state (e.g. pFedGT's ‖θ‖)
        "server": {
            k: float(v)
            for k, v in (metrics or {}).items()
            if k not in (keys.TRAIN_LOSS, "clients-trained") and isinstance(v, (int, float))
        },
    }
    if failing:  # every client that failed in an exchange, sampled or not, with why
        record["problems"] = [
            _who_failed(strategy, node)
            | {"exchange": exchange.name, "problem": exchange.problem_of(node)}
            for exchange in exchanges
            for node in exchange.failed
        ]
    return record


def run_rounds(
    grid: Grid,
    cfg: RunConfig,
    strategy: PflStrategy,
    initial_arrays: ArrayRecord,
    writer: ResultsWriter,
    resume: Checkpoint | None = None,
    *,
    state_key: str = "",
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RunOutcome:
    """Run ``cfg.num_rounds`` rounds, writing one ``rounds.jsonl`` line per round.

    Round 0 is an evaluation of the initial models only, on every client (it also tells the
    strategy which client each node holds, which makes client sampling reproducible for a
    seed) unless ``initial-evaluation=sample`` on an engine that knows them without a
    message (:func:`learn_client_ids`); later evaluations test a ``fraction-evaluate``
    sample where the run asks for one (:func:`evaluation_fraction`). After
    every ``checkpoint-every`` rounds (and the last) the state to continue from is saved
    (:mod:`pflarena.server.checkpoint`); with ``resume`` the run continues after that
    checkpoint's round, the rounds before it already in ``writer``'s file. ``state_key``
    names the clients' state (:class:`ClientSync`). ``on_round`` is called with each
    round's record once it is written (an experiment tracker's hook; it must not raise).
    """
    start = time.monotonic()
    # min-available-clients: a client that connects later is sampled from the round after.
    connected = wait_for_nodes(
        grid, cfg.min_available_clients or cfg.num_clients, timeout=cfg.round_timeout
    )
    outcome = RunOutcome(arrays=initial_arrays)
    sync = ClientSync(state_key=state_key, ttl=cfg.round_timeout)

    if resume is None:
        fraction0 = evaluation_fraction(cfg, 0)
        if fraction0 < 1 and not learn_client_ids(grid, strategy):
            log(
                WARNING,
                "pflarena: initial-evaluation=sample, but this engine does not know which "
                "client each node holds before it replies (a deployment's SuperNodes, the Ray "
                "engine): round 0 tests every client",
            )
            fraction0 = 1.0
        tested = count(len(connected), "client")
        if fraction0 < 1:
            size = sample_size(len(connected), fraction0)
            tested = f"a sample of {size} of the {tested}"
        emit(
            StartupPhase(
                f"round 0, the initial models evaluated on {tested} "
                "(each builds its data on its first message)"
            )
        )
        evaluation, traffic = _evaluate(
            grid, strategy, 0, initial_arrays, cfg, initial_arrays, sync, fraction=fraction0
        )
        record0 = {
            "round": 0,
            "elapsed_s": time.monotonic() - start,
            "evaluation": evaluation,
            **traffic,
            "bytes_down": 0,
            "bytes_up": 0,
        }
        writer.append_round(record0)
        outcome.rounds.append(record0)
        emit(RoundDone.from_record(record0, cfg.num_rounds))
        mark("round 0 evaluated")
        if on_round is not None:
            on_round(record0)
        first_round = 1
    else:
        strategy.restore_state(resume.strategy_arrays, resume.strategy_meta)
        sync.restore(resume.loop_meta)
        sync.checkpoint_written(strategy)
        outcome.arrays = resume.arrays
        outcome.rounds = read_rounds(writer.dir / "rounds.jsonl")
        # An unrecorded evaluation tells the strategy which client each node holds now
        # (simulated nodes get new ids on a restart); clients whose node is known roll
        # their state back to what this checkpoint accepted.
        _evaluate(
            grid,
            strategy,
            resume.server_round,
            outcome.arrays,
            cfg.model_copy(update={"cross_eval_clients": 0}),
            initial_arrays,
            sync,
        )
        first_round = resume.server_round + 1
        log(INFO, "pflarena: resumed after round %d", resume.server_round)
    outcome.startup_s = time.monotonic() - start
    round_times: list[float] = []

    for server_round in range(first_round, cfg.num_rounds + 1):
        round_start = time.monotonic()
        strategy.server_round = server_round
        send = RoundExchanges(
            grid, strategy, server_round, cfg.round_timeout, sync, stop=cfg.max_failure_fraction < 1
        )
        new_arrays, metrics = strategy.train_round(server_round, outcome.arrays, grid, send)
        if new_arrays is not None:
            outcome.arrays = new_arrays
        sync.learn(strategy, send.exchanges)
        exchanges = [exchange.stats() for exchange in send.exchanges]
        record: dict[str, Any] = {
            "round": server_round,
            "train": _train_record(strategy, send.exchanges, metrics),
            "exchanges": exchanges,
            "bytes_down": sum(e["bytes_down"] for e in exchanges),
            "bytes_up": sum(e["bytes_up"] for e in exchanges),
            "train_time_s": time.monotonic() - round_start,
        }
        if send.state_problems:
            record["train"]["state_problems"] = send.state_problems
        try:
            check_failures(
                cfg, server_round, "training", strategy, send.exchanges, send.state_problems
            )
        except TooManyFailures as stop:
            stop.round_record = record
            raise
        if server_round % cfg.eval_every == 0 or server_round == cfg.num_rounds:
            evaluation, traffic = _evaluate(
                grid,
                strategy,
                server_round,
                outcome.arrays,
                cfg,
                initial_arrays,
                sync,
                fraction=evaluation_fraction(cfg, server_round),
            )
            record["evaluation"] = evaluation
            record |= traffic
        record["round_time_s"] = time.monotonic() - round_start
        record["elapsed_s"] = time.monotonic() - start
        writer.append_round(record)
        outcome.rounds.append(record)
        if server_round % cfg.checkpoint_every == 0 or server_round == cfg.num_rounds:
            save_checkpoint(
                writer.dir,
                server_round,
                outcome.arrays,
                strategy,
                loop_meta=sync.meta(),
                rounds_sha256=writer.rounds_sha256(),
            )
            sync.checkpoint_written(strategy)
        round_times.append(record["round_time_s"])
        eta = round_eta(round_times, cfg.num_rounds - server_round)
        emit(RoundDone.from_record(record, cfg.num_rounds, eta))
        if on_round is not None:
            on_round(record)
    return outcome


def summary_record(
    cfg: RunConfig,
    rounds: list[dict[str, Any]],
    *,
    status: str,
    wall_time_s: float,
    error: str | None = None,
    startup_s: float | None = None,
    signal: str | None = None,
    stopped: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` contents. ``startup_s``: the part of ``wall_time_s`` until round
    0 was done (the clients' start-up and first data build, the initial evaluation);
    ``rounds_time_s`` is the rest, the rounds' own time. ``signal``: the signal that
    interrupted the run (status ``interrupted``); ``stopped``: what the round that stopped
    the run recorded (:class:`TooManyFailures`), whose failures ``client_failures``
    includes though the round is not one of ``rounds``."""
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "dataset": cfg.data_name(),
        "model": cfg.model_name(),
        "partition": cfg.partition,
        "num_clients": cfg.num_clients,
        "num_rounds": cfg.num_rounds,
        "seed": cfg.seed,
        "status": status,
        "wall_time_s": wall_time_s,
    }
    if startup_s is not None:
        summary["startup_s"] = startup_s
        summary["rounds_time_s"] = max(0.0, wall_time_s - startup_s)
    if cfg.shards_dir:
        summary["shards_dir"] = cfg.shards_dir
    summary |= summarize_rounds(rounds, cfg.num_clients)
    if cfg.min_available_clients:
        # A run that starts without every client: those that never connected, said.
        seen = {str(c) for r in rounds for c in (r.get("train") or {}).get("sampled", [])}
        seen |= {c for r in rounds for c in ((r.get("evaluation") or {}).get("per_client") or {})}
        summary["clients_never_connected"] = [
            c for c in range(cfg.num_clients) if str(c) not in seen
        ]
    if stopped is not None:
        summary["client_failures"] = client_failures([*rounds, stopped], cfg.num_clients)
    summary["metric_definitions"] = definitions()
    if error is not None:
        summary["error"] = error
    if status == INTERRUPTED:
        summary["signal"] = signal
    return summary
