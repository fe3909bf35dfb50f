"""What every pflarena strategy shares: seeded sampling, reply checks, the evaluation protocol.

:class:`PflStrategy` is a Flower :class:`~flwr.serverapp.strategy.Strategy`; it can be
driven by Flower's own ``Strategy.start`` or by pflarena's run loop, which adds results
files. A subclass carries its method's :class:`~pflarena.core.methods.MethodDeclaration`
(``declaration``), builds itself from a run in :meth:`PflStrategy.from_setup`, and
implements the server-side math in ``aggregate_train``. A round that needs more than one
send-and-receive (an initialisation, a line search, a block schedule) overrides
:meth:`PflStrategy.train_round` and calls ``send`` once per exchange (an
:class:`~pflarena.strategies.exchange.Exchange`, re-exported here with :data:`Send` and
:func:`direct_send`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from pflarena.core import keys
from pflarena.core.evaluation import AccuracyStats, accuracy_stats
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.seeds import derive_seed
from pflarena.core.text import count
from pflarena.core.versions import ClientPool
from pflarena.strategies.exchange import (
    Exchange,
    Send,
    direct_send,
    record_nbytes,
    reply_error,
)
from pflarena.strategies.replies import (
    ClientEvaluation,
    ClientSizes,
    array_problem,
    examples_problem,
    metric_problem,
    read_client_id,
    read_evaluation,
    records_read,
    unread_records_problem,
    vector_problem,
)

if TYPE_CHECKING:
    from pflarena.core.config import RunConfig

__all__ = [
    "ClientEvaluation",
    "ClientSizes",
    "array_problem",
    "vector_problem",
    "Exchange",
    "LocalTraining",
    "MultiExchangeStrategy",
    "PflStrategy",
    "Send",
    "StrategySetup",
    "direct_send",
    "record_nbytes",
    "sample_size",
]

#: The models' worth of memory an aggregation works in beside the replies (see
#: :meth:`PflStrategy.working_footprint`).
WORKING_MODELS = 12
#: The JSON a checkpoint holds per client of the federation: its node's id (a 64-bit
#: number in a deployment and in Flower's simulation) with its client id, the update the
#: server last accepted from it, and the state version it must hold
#: (``{"15015663516352844772": 3549, ...}``, ``{"3549": 100101, ...}`` twice: 62 bytes).
CHECKPOINT_BYTES_PER_CLIENT = 64


def sample_size(num_nodes: int, fraction: float, minimum: int = 1) -> int:
    """How many of ``num_nodes`` a ``fraction`` of them is: its floor, at least ``minimum``,
    at most all of them (the training sample, an evaluation's sample)."""
    return min(num_nodes, max(minimum, math.floor(fraction * num_nodes)))


@dataclass(frozen=True)
class LocalTraining:
    """Local-solver hyperparameters sent to clients with every train message.

    ``lr`` follows a multi-step schedule: it is multiplied by ``lr_gamma`` after each round
    in ``lr_milestones`` (torch's ``MultiStepLR`` stepped once per round), so a message of
    round t carries ``lr · lr_gamma^#{m in lr_milestones : m < t}``.
    """

    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1

    def lr_factor(self, server_round: int) -> float:
        """The schedule's factor in ``server_round`` (1 before the first milestone)."""
        return self.lr_gamma ** sum(m < server_round for m in self.lr_milestones)

    def lr_at(self, server_round: int) -> float:
        """The local learning rate of ``server_round``'s messages."""
        return self.lr * self.lr_factor(server_round)

    def to_config(self, server_round: int) -> dict[str, int | float]:
        """The settings of a message of ``server_round`` (``lr`` scheduled)."""
        return {
            keys.LOCAL_EPOCHS: self.local_epochs,
            keys.BATCH_SIZE: self.batch_size,
            keys.LR: self.lr_at(server_round),
            keys.MOMENTUM: self.momentum,
            keys.WEIGHT_DECAY: self.weight_decay,
        }


@dataclass(frozen=True)
class StrategySetup:
    """What a strategy is built from: the run, its method's parameters, the model's layout.

    Parameters
    ----------
    cfg
        The validated run config.
    params
        The method's validated parameters (``cfg.params(declaration)``).
    trainable
        Names of the model's trainable parameters, in ``state_dict`` order.
    server_data
        The server-held dataset when the run has one (``server-fraction`` > 0), else None.
    state_dir
        Where the strategy's per-client pools live (``<output-dir>/server-state``); None
        keeps them in memory.
    """

    cfg: RunConfig
    params: MethodParams
    trainable: tuple[str, ...] = ()
    server_data: Any = None
    state_dir: Path | None = None

    def common(self, declaration: MethodDeclaration) -> dict[str, Any]:
        """The keyword arguments every :class:`PflStrategy` takes, from the run config."""
        cfg = self.cfg
        return {
            "training": LocalTraining(
                local_epochs=cfg.local_epochs,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                momentum=cfg.momentum,
                weight_decay=cfg.weight_decay,
                lr_milestones=cfg.milestones(),
                lr_gamma=cfg.lr_gamma,
            ),
            "fraction_train": cfg.fraction_train or declaration.default_fraction_train,
            "min_train_nodes": cfg.min_train_clients,
            "seed": cfg.seed,
            "num_clients": cfg.num_clients,
            "state_dir": self.state_dir,
            "state_io": cfg.state_io,
        }


class PflStrategy(Strategy):
    """Base class of pflarena strategies.

    Parameters
    ----------
    training
        Local-solver hyperparameters sent with every train message.
    fraction_train
        Fraction of the connected clients sampled each round (at least ``min_train_nodes``);
        ``None`` takes the declaration's ``default_fraction_train``.
    min_train_nodes
        Lower bound on the number of clients sampled for training.
    seed
        Seeds the client sampler, so the same clients are chosen in every run with the
        same seed once each node's client id is known (it is learnt from the replies).
    """

    #: The method this strategy implements: name, reference, parameters, solver, needs.
    declaration: ClassVar[MethodDeclaration]
    #: Whether training replies carry an ArrayRecord that must be checked.
    expects_arrays: ClassVar[bool] = True
    #: State of the method's own that checkpoints keep without code of its own: attribute
    #: name → checkpoint key. An attribute holding an array is kept under the key; one
    #: holding a name → array dict, under ``key + name`` for each entry (a key that ends
    #: with ``/``). ``None`` or an empty dict keeps nothing, and a checkpoint without the key
    #: leaves the attribute as the constructor set it.
    checkpointed: ClassVar[Mapping[str, str]] = {}
    #: Plain values (an int, a float, a bool, a string, or None) that checkpoints keep in
    #: their JSON part: attribute name → path there, ``/`` between the levels
    #: (``{"epsilon": "fedfomo/epsilon"}`` is ``meta["fedfomo"]["epsilon"]``). JSON gives
    #: back an int, a float, a bool, a string or None as written (a numpy scalar is written
    #: as its Python value); where the constructor set an int or a float, the restored value
    #: is converted to its type. A checkpoint without the path leaves the attribute as the
    #: constructor set it. State that is neither (dicts keyed by int, which JSON keys by
    #: string; RNG states; networks and their optimisers) extends :meth:`checkpoint_state`
    #: and :meth:`restore_state` by hand, merging into its own part of the JSON
    #: (``meta.setdefault(name, {}).update(...)``) so that a declared value there stays.
    checkpointed_values: ClassVar[Mapping[str, str]] = {}
    #: The models' worth a training reply carries, and what :meth:`server_footprint` says
    #: they are (SCAFFOLD's Δy and Δc: ``(2, "Δy and Δc: two models each")``).
    reply_models: ClassVar[tuple[int, str]] = (1, "a model each")
    #: The models' worth a client keeps in its state between messages, at the run's
    #: ``state-precision``, and what :meth:`client_footprint` says they are (Ditto's
    #: ``(1, "its personal model")``); 0 for a method whose clients keep nothing.
    client_models: ClassVar[tuple[int, str]] = (0, "")
    #: The models' worth the server keeps per client on disk in its pools
    #: (``server-state/``: FedAMP's latest models), and what they are.
    pool_models: ClassVar[tuple[int, str]] = (0, "")
    #: The JSON a checkpoint keeps per sampled client per round, where a method records
    #: something of each client every round for its results (IFCA's cluster choices).
    checkpoint_round_bytes: ClassVar[int] = 0

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> PflStrategy:
        """Build the strategy for a run.

        The default passes the method's validated parameters and the common arguments;
        override when the constructor needs more (pFedGT: the model's layout).
        """
        if "params" not in inspect.signature(cls.__init__).parameters:
            raise TypeError(
                f"{cls.__name__}.__init__ must take the method's parameters as `params` and pass "
                "them on (`super().__init__(params, **kwargs)`), or be left out: the parameters "
                f"are {cls.declaration.params.__name__}'s fields, read as self.params.<field> "
                "(docs/guide.md, 'Adding a method')"
            )
        return cls(setup.params, **setup.common(cls.declaration))

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """What this method's server holds in memory at once for ``federation``
        (:mod:`pflarena.core.footprint`), from its validated ``params``: here the round's
        training replies (:attr:`reply_models` each) and the working copies. A method that
        keeps more per client (a pool read whole, a matrix of clients × clients, a network as
        wide as the federation) adds its own terms, so that a run too large for the machine
        is refused before it starts."""
        models, what = cls.reply_models
        return [
            Footprint(
                f"the round's {count(federation.sampled, 'reply', 'replies')} ({what})",
                models * federation.sampled * federation.model_bytes,
            ),
            *cls.working_footprint(federation),
        ]

    @staticmethod
    def working_footprint(federation: Federation) -> list[Footprint]:
        """The new model and the float64 copies its entries are computed in: whatever the
        sample, the aggregations read a reply's entry at a time
        (:mod:`pflarena.strategies.aggregation`). Twelve models' worth covers the most
        measured (FedDyn's step, tests/test_footprint.py)."""
        return [
            Footprint(
                f"the new model and its float64 working copies ({WORKING_MODELS} models)",
                WORKING_MODELS * federation.model_bytes,
            )
        ]

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """What one client keeps in its state between messages, one version of it
        (:mod:`pflarena.client.state`), from the method's validated ``params``: here
        :attr:`client_models` models at the run's ``state-precision``. A method that keeps a
        part of the model (a head), an agent or a vector per peer says so here, so that
        ``pflarena run --check`` states what the clients' state will take on disk and a run
        that would fill its disk is refused before it starts
        (:func:`pflarena.server.build.disk_estimate`)."""
        models, what = cls.client_models
        return [Footprint(what, models * federation.state_bytes(), models)] if models else []

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The arrays this method's checkpoint holds (``checkpoint.npz``:
        :mod:`pflarena.server.checkpoint`) for ``federation``, from its validated ``params``:
        here the server's model. A method that checkpoints more (a control variate, a matrix
        of clients × clients, a hypernetwork, an agent) adds its own terms, sized as in
        :meth:`server_footprint`, so that the disk a run needs counts its checkpoint
        (:func:`pflarena.server.build.disk_estimate`)."""
        return [Footprint("the server's model", federation.model_bytes)]

    @classmethod
    def checkpoint_records(cls, params: Any, federation: Federation) -> float:
        """The bytes of the checkpoint's JSON part for ``federation``: the run's
        bookkeeping, :data:`CHECKPOINT_BYTES_PER_CLIENT` a client, and what the method
        records per sampled client and round (:attr:`checkpoint_round_bytes`)."""
        f = federation
        per_round = cls.checkpoint_round_bytes * f.sampled * max(f.num_rounds, 0)
        return CHECKPOINT_BYTES_PER_CLIENT * f.num_clients + per_round

    @classmethod
    def initial_versions(cls, params: Any) -> int:
        """The state versions a client writes before its first training: none, except
        where every client stores something before the first round (pFedGT's
        ``c-init = round``)."""
        return 0

    @property
    def method(self) -> str:
        """The method's name (sent to clients in every message)."""
        return self.declaration.name

    @property
    def has_global_model(self) -> bool:
        """Whether the method has a global model to report global accuracy for."""
        return self.declaration.global_model

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        training: LocalTraining | None = None,
        fraction_train: float | None = None,
        min_train_nodes: int = 1,
        seed: int = 0,
        num_clients: int | None = None,
        state_dir: Path | None = None,
        state_io: str = "direct",
        **method_params: Any,
    ) -> None:
        declared = self.declaration.params
        if params is None:
            # keyword form, ``Ditto(lambda_=0.5)``: the declaration's model validates the
            # values and supplies every default (defaults are written only there)
            params = declared(**method_params)
        elif method_params:
            raise TypeError(
                f"{type(self).__name__}: pass the method's parameters either as a "
                f"{declared.__name__} or as keywords, not both "
                f"(got {sorted(method_params)} beside params)"
            )
        elif not isinstance(params, declared):
            raise TypeError(
                f"{type(self).__name__} takes {declared.__name__}, got {type(params).__name__}"
            )
        #: the method's parameters (the declaration's pydantic model: validated, frozen)
        self.params = params
        if fraction_train is None:
            fraction_train = self.declaration.default_fraction_train
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        self.training = training or LocalTraining()
        self.fraction_train = fraction_train
        self.min_train_nodes = min_train_nodes
        self.seed = seed
        #: the federation's size, when known: replies claiming another client id are refused
        self.num_clients = num_clients
        #: each client's samples per split, where the server knows them (set by
        #: ``build_strategy``): counts a reply claims are checked against them
        self.client_sizes: ClientSizes | None = None
        self.state_dir = state_dir
        self.state_io = state_io
        self._pools: dict[str, ClientPool] = {}
        #: the round being trained (set by the run loop and by ``configure_train``)
        self.server_round = 0
        self._rng = np.random.default_rng(seed)
        #: (node id, why) of the latest evaluation's unusable replies
        self.last_eval_failures: list[tuple[int, str]] = []
        #: node id -> client id (partition id or shard id), learnt from replies.
        self.client_ids: dict[int, int] = {}
        #: per-client results of the latest evaluation, by client id.
        self.last_evaluation: dict[int, ClientEvaluation] = {}
        #: the method's own figures from the latest evaluation (:meth:`evaluation_details`)
        self.last_eval_details: dict[str, Any] = {}
        #: node ids sampled in the latest training round.
        self.last_sampled: list[int] = []
        #: the share of the connected clients the next evaluation tests: set by the run loop
        #: before each evaluation (``fraction-evaluate``, or 1 where it tests every client)
        self.evaluate_fraction = 1.0
        #: node ids whose latest training reply was an error or was rejected.
        self.last_failed: list[int] = []
        #: why each of ``last_failed``'s rejected replies was unusable, by node
        self.last_problems: dict[int, str] = {}
        self._round_arrays: ArrayRecord | None = None
        self._sent: list[Message] = []
        self._train_update_id: int | None = None
        #: client id -> the update id of its last usable reply: the state version the
        #: client must hold (the run loop tells every client its own, client/state.py)
        self.accepted: dict[int, int] = {}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What the strategy needs to continue a run: arrays, and JSON-able values.

        The base class keeps the sampler's RNG state, the nodes' client ids and the update
        each client last had accepted; a method with state of its own extends both parts.
        """
        for pool in self._pools.values():  # what a resume from here no longer needs
            pool.checkpoint(self.server_round)
        meta = {
            "round": self.server_round,
            "pools": sorted(self._pools),
            "rng": self._rng.bit_generator.state,
            "client_ids": {str(node): client for node, client in self.client_ids.items()},
            "accepted": {str(client): update for client, update in self.accepted.items()},
        }
        for attribute, path in self.checkpointed_values.items():
            *levels, last = path.split("/")
            part = meta
            for level in levels:
                part = part.setdefault(level, {})
            value = getattr(self, attribute)
            part[last] = value.item() if isinstance(value, np.generic) else value
        return self._declared_state(), meta

    def _declared_state(self) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        for attribute, key in self.checkpointed.items():
            value = getattr(self, attribute)
            if value is None:
                continue
            if key.endswith("/"):
                arrays |= {f"{key}{name}": np.array(v) for name, v in value.items()}
            else:
                arrays[key] = np.array(value)
        return arrays

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Undo :meth:`checkpoint_state`."""
        self._rng.bit_generator.state = meta["rng"]
        self.server_round = int(meta["round"])
        for name in meta["pools"]:  # forget what was written after the checkpoint
            self.pool(name).rollback(self.server_round)
        self.client_ids = {int(node): int(client) for node, client in meta["client_ids"].items()}
        self.accepted = {int(client): int(update) for client, update in meta["accepted"].items()}
        for attribute, key in self.checkpointed.items():
            if key.endswith("/"):
                entries = {
                    k[len(key) :]: np.array(v) for k, v in arrays.items() if k.startswith(key)
                }
                if entries:
                    setattr(self, attribute, entries)
            elif key in arrays:
                current = getattr(self, attribute)
                value = np.array(arrays[key])
                if isinstance(current, np.ndarray):
                    if value.shape != current.shape:
                        raise ValueError(
                            f"the checkpoint's {key!r} is {value.shape}, this run's {current.shape}"
                        )
                    value = value.astype(current.dtype)
                setattr(self, attribute, value)
        for attribute, path in self.checkpointed_values.items():
            part: Any = meta
            for level in path.split("/"):
                if not isinstance(part, dict) or level not in part:
                    break
                part = part[level]
            else:
                current = getattr(self, attribute)
                if part is not None and type(current) in (int, float):
                    part = type(current)(part)
                setattr(self, attribute, part)

    def pool(self, name: str) -> ClientPool:
        """A per-client store of arrays on the server (pFedSV's models, FedPG's gradients).

        On disk under ``state_dir`` (so a simulation's memory does not grow with its
        clients), versioned by round, and kept consistent with the checkpoints: write with
        ``pool.put(client_id, self.server_round, {...})``, read with ``pool.get``.
        """
        if name not in self._pools:
            self._pools[name] = ClientPool(
                self.state_dir / name if self.state_dir else None,
                direct=self.state_io == "direct",
            )
        return self._pools[name]

    # ------------------------------------------------------------------ rounds
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One training round: every exchange it needs, then the new server arrays.

        The default is Flower's single exchange: ``configure_train``, send, and
        ``aggregate_train``. A method whose round has several exchanges overrides this and
        calls ``send(name, messages)`` for each; the run loop records the bytes and failures
        of every exchange under its name. ``last_sampled`` must name the round's clients.
        """
        messages = list(self.configure_train(server_round, arrays, ConfigRecord(), grid))
        exchange = send("train", messages)
        self._sent, self._train_update_id = exchange.messages, exchange.update_id
        result = self.aggregate_train(server_round, exchange.replies)
        exchange.rejected = [n for n in self.last_failed if n not in exchange.errors]
        exchange.problems |= {
            n: self.last_problems[n] for n in exchange.rejected if n in self.last_problems
        }
        return result

    # ------------------------------------------------------------------ sampling
    def ordered_nodes(self, grid: Grid) -> list[int]:
        """Connected node ids, ordered by client id (unknown ids last, by node id)."""
        nodes = list(grid.get_node_ids())
        return sorted(nodes, key=lambda n: (n not in self.client_ids, self.client_ids.get(n, n)))

    def num_to_sample(self, num_nodes: int) -> int:
        return sample_size(num_nodes, self.fraction_train, self.min_train_nodes)

    def sample_train_nodes(self, grid: Grid) -> list[int]:
        """Sample ``num_to_sample`` connected nodes uniformly without replacement."""
        nodes = self.ordered_nodes(grid)
        if not nodes:
            return []
        chosen = self._rng.choice(len(nodes), size=self.num_to_sample(len(nodes)), replace=False)
        return [nodes[i] for i in sorted(chosen)]

    def evaluation_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """The nodes the evaluation of ``server_round`` tests: every connected node, or, with
        ``evaluate_fraction`` below 1, that share of them (at least one), drawn uniformly
        without replacement. The draw has a stream of its own, seeded by the run's seed and
        the round, so that it is the same in every run with the seed (and after a resume)
        and leaves the training sampler's draws as they are without it."""
        nodes = self.ordered_nodes(grid)
        if self.evaluate_fraction >= 1.0 or not nodes:
            return nodes
        size = sample_size(len(nodes), self.evaluate_fraction)
        rng = np.random.default_rng(derive_seed(self.seed, server_round, "evaluation-sample"))
        chosen = rng.choice(len(nodes), size=size, replace=False)
        return [nodes[i] for i in sorted(chosen)]

    # ------------------------------------------------------------------ messages
    def round_config(self, server_round: int) -> dict:
        """What every train message of ``server_round`` carries: the round, the method, its
        solver and the round's local-training settings (a multi-exchange method's messages
        start from it)."""
        return {
            keys.SERVER_ROUND: server_round,
            keys.METHOD: self.method,
            keys.SOLVER: self.declaration.solver,
            **self.training.to_config(server_round),
        }

    def train_config(self, server_round: int, node_id: int) -> dict:
        """The ConfigRecord contents of one train message (override to add keys)."""
        return self.round_config(server_round)

    def method_config(self, **values: Any) -> dict[str, Any]:
        """Method values for a message, under their run-config names (``<method>.<key>``).

        A solver reads them back with ``job.param(key)``, so a method's own settings need no
        shared key constants.
        """
        return {f"{self.method}.{key}": value for key, value in values.items()}

    def params_config(self, *, exclude: Iterable[str] = ()) -> dict[str, Any]:
        """The method's parameters for a message, by their declared keys (``method_config``).

        ``exclude`` names fields the solver does not need (server-side settings).
        """
        return self.method_config(**self.params.model_dump(by_alias=True, exclude=set(exclude)))

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        """The RecordDict sent to ``node_id`` for training (override to add records)."""
        return RecordDict({keys.ARRAYS: arrays, keys.CONFIG: ConfigRecord(config)})

    def evaluate_config(self, server_round: int) -> dict:
        """The ConfigRecord contents of evaluate messages (override to add keys)."""
        return {
            keys.SERVER_ROUND: server_round,
            keys.METHOD: self.method,
            keys.SOLVER: self.declaration.solver,
            keys.HAS_GLOBAL: self.has_global_model,
            keys.BATCH_SIZE: self.training.batch_size,
        }

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients and send each the current server arrays and the solver config."""
        self.server_round = server_round
        self._round_arrays = arrays
        nodes = self.sample_train_nodes(grid)
        self.last_sampled = nodes
        log(
            INFO,
            "configure_train: sampled %d of %d clients",
            len(nodes),
            len(list(grid.get_node_ids())),
        )
        messages = []
        for node_id in nodes:
            node_config = {**dict(config), **self.train_config(server_round, node_id)}
            content = self.train_content(server_round, node_id, arrays, node_config)
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)
            )
        self._sent = messages  # message ids are set when the grid sends them
        return messages

    def evaluate_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """What every client gets to evaluate: the global model, or nothing without one;
        methods of several server models (IFCA, FedEM, PPFL, CFL) send them all."""
        return arrays if self.has_global_model else ArrayRecord()

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask the round's clients to evaluate (:meth:`evaluation_nodes`: every connected
        client, or the run's ``fraction-evaluate`` sample); one record,
        :meth:`evaluate_arrays` and :meth:`evaluate_config`, shared by every message."""
        record = RecordDict(
            {
                keys.ARRAYS: self.evaluate_arrays(arrays),
                keys.CONFIG: ConfigRecord({**dict(config), **self.evaluate_config(server_round)}),
            }
        )
        return [
            Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node_id)
            for node_id in self.evaluation_nodes(grid, server_round)
        ]

    # ------------------------------------------------------------------ replies
    def valid_replies(
        self, exchange: Exchange, check: Callable[[RecordDict], str | None]
    ) -> list[Message]:
        """The usable replies of an exchange, in client-id order; the rest are logged.

        A reply is unusable when it is an error, its metrics are missing or not finite, it
        claims a client id out of range or one another node of the exchange claims, its
        ``num-examples`` cannot be true (:func:`~pflarena.strategies.replies.examples_problem`),
        ``check`` (the method's own layout) rejects it, or it holds an ArrayRecord that
        ``check`` did not examine or a MetricRecord besides ``metrics``: a reply holds
        what the server reads and nothing else. Those are added to
        ``exchange.rejected``; usable replies teach the strategy their node's client id and
        make their update the client's accepted state.
        """
        valid = []
        claimed: dict[int, int] = {}
        for msg in exchange.replies:
            node_id = exchange.node_of(msg)
            if msg.has_error():
                log(
                    WARNING,
                    "%s: client on node %d failed: %s",
                    exchange.name,
                    node_id,
                    msg.error.reason,
                )
                continue
            client_id = read_client_id(msg.content, self.num_clients)
            problem = metric_problem(msg.content)
            if problem is None and isinstance(client_id, str):
                problem = client_id
            if (
                problem is None
                and client_id is not None
                and claimed.get(client_id, node_id) != node_id
            ):
                problem = f"client id {client_id} is already claimed by node {claimed[client_id]}"
            if problem is None:
                problem = examples_problem(
                    msg.content,
                    client_id if isinstance(client_id, int) else None,
                    self.client_sizes,
                )
            if problem is None:
                with records_read() as read:
                    problem = check(msg.content)
                if problem is None:
                    problem = unread_records_problem(msg.content, read)
            if problem is not None:
                log(WARNING, "%s: rejected reply from node %d: %s", exchange.name, node_id, problem)
                exchange.rejected.append(node_id)
                exchange.problems[node_id] = problem
                continue
            if isinstance(client_id, int):
                claimed[client_id] = node_id
                self.client_ids[node_id] = client_id
                if exchange.update_id is not None:
                    self.accepted[client_id] = exchange.update_id
            valid.append(msg)
        # Replies arrive in whatever order the clients finish (Ray actors, SuperNodes);
        # aggregating them in client-id order makes the floating-point sums, and so the
        # run, the same every time.
        valid.sort(key=lambda m: self.client_ids.get(exchange.node_of(m), exchange.node_of(m)))
        return valid

    def valid_train_replies(self, replies: Iterable[Message]) -> list[Message]:
        """The usable replies to this round's train messages; ``last_failed`` the rest."""
        exchange = Exchange("train", self._sent, list(replies), update_id=self._train_update_id)
        valid = self.valid_replies(exchange, self.check_train_reply)
        self.last_failed = exchange.errors + exchange.rejected
        self.last_problems = dict(exchange.problems)
        log(INFO, "aggregate_train: %d results, %d failures", len(valid), len(self.last_failed))
        return valid

    def check_train_reply(self, content: RecordDict) -> str | None:
        """Why a training reply's records are unusable, or ``None`` (override for other
        layouts; the metrics and client id are checked for every method)."""
        if not self.expects_arrays:
            return None
        return array_problem(content, self._round_arrays, keys.ARRAYS)

    @staticmethod
    def train_metrics(replies: Sequence[Message]) -> MetricRecord | None:
        """Example-weighted mean training loss and the number of clients that trained."""
        if not replies:
            return None
        metrics = [msg.content.metric_records[keys.METRICS] for msg in replies]
        weights = np.array([float(m.get(keys.NUM_EXAMPLES, 1)) for m in metrics])
        losses = np.array([float(m.get(keys.TRAIN_LOSS, float("nan"))) for m in metrics])
        return MetricRecord(
            {
                keys.TRAIN_LOSS: float(np.sum(weights * losses) / max(weights.sum(), 1.0)),
                "clients-trained": len(replies),
            }
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Personalized and global accuracy statistics over every client that replied."""
        results: dict[int, ClientEvaluation] = {}
        reported: dict[int, MetricRecord] = {}
        failures: list[tuple[int, str]] = []
        for msg in replies:
            node_id = msg.metadata.src_node_id
            if msg.has_error():
                failures.append((node_id, reply_error(msg)))
                continue
            evaluation = read_evaluation(msg.content, node_id, self.num_clients, self.client_sizes)
            if not isinstance(evaluation, str) and evaluation.client_id in results:
                evaluation = f"client id {evaluation.client_id} reported by two nodes"
            if isinstance(evaluation, str):
                failures.append((node_id, evaluation))
                continue
            if keys.CLIENT_ID in msg.content.metric_records[keys.METRICS]:
                self.client_ids[node_id] = evaluation.client_id
            results[evaluation.client_id] = evaluation
            reported[evaluation.client_id] = msg.content.metric_records[keys.METRICS]
        for node_id, reason in failures:
            log(WARNING, "evaluation failed on node %d: %s", node_id, reason)
        self.last_eval_failures = failures
        self.last_evaluation = dict(sorted(results.items()))
        self.last_eval_details = self.evaluation_details(dict(sorted(reported.items())))
        if not results:
            return None
        personalized, global_ = evaluation_stats(list(results.values()))
        out = {f"personalized-{k}": v for k, v in personalized.as_dict().items()}
        if global_ is not None:
            out.update({f"global-{k}": v for k, v in global_.as_dict().items()})
        return MetricRecord(out)

    def evaluation_details(self, reported: dict[int, MetricRecord]) -> dict[str, Any]:
        """The method's own figures from an evaluation's usable replies (``reported``: each
        client's metrics, by client id), JSON-able; the run loop writes them to the round's
        ``evaluation.method`` in ``rounds.jsonl``. Empty (nothing written) by default."""
        return {}

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        """Method-specific results for ``summary.json`` (its ``method`` entry); none here."""
        return {}

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """Write method-specific results files (pFedSV's relevance matrix) at the run's end."""
        return []

    def summary(self) -> None:
        log(INFO, "\t├── method: %s (global model: %s)", self.method, self.has_global_model)
        log(
            INFO,
            "\t├── sampling: fraction %.2f, at least %d, seed %d",
            self.fraction_train,
            self.min_train_nodes,
            self.seed,
        )
        log(INFO, "\t└── local training: %s", self.training)


def evaluation_stats(
    results: Sequence[ClientEvaluation],
) -> tuple[AccuracyStats, AccuracyStats | None]:
    """Personalized and (where every client reported one) global accuracy statistics."""
    personalized = accuracy_stats(
        [r.personalized_correct for r in results],
        [r.personalized_count for r in results],
        [r.personalized_loss_sum for r in results],
    )
    if any(r.global_count is None for r in results):
        return personalized, None
    global_ = accuracy_stats(
        [r.global_correct for r in results],
        [r.global_count for r in results],
        [r.global_loss_sum for r in results],
    )
    return personalized, global_


class MultiExchangeStrategy(PflStrategy):
    """Base class of a method whose round is several exchanges (``train_round`` overridden).

    Flower's ``Strategy.start`` drives exactly one train exchange per round through
    ``configure_train`` and ``aggregate_train``, so it cannot run such a method; pflarena's
    run loop (``pflarena run``, ``flwr run .``) does. Calling ``aggregate_train`` says so.
    """

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        raise RuntimeError(
            f"{self.method} exchanges several times per round (train_round); run it with "
            "pflarena's loop, not Flower's Strategy.start"
        )
