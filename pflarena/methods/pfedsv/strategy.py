"""pFedSV: clients value their peers' models with Shapley values and aggregate the best.

"Rethinking Personalized Client Collaboration in Federated Learning" (docs/methods/pfedsv.md).
Each round is two exchanges (§3.2):

1. ``train``: the sampled clients train their personalized models locally and upload them
   with a ranked request for peers (:func:`pflarena.methods.pfedsv.solver.select_peers`).
   The server stores each upload in its pool of latest models.
2. ``personalize``: each client that uploaded gets the models of the first k peers of its
   request that the pool holds (never its own), values them with Shapley values on its
   validation split, and aggregates; it replies with metrics (and, unless
   ``report-relevance`` is off, its relevance vector, for the run's relevance picture).

The server only stores and routes models; it never sees validation data, and sees Shapley
values only in the reported relevance vectors. Clients know each other by pseudonyms (a
seeded permutation of the client ids, §9.21). In the D+C variant the server also averages
the uploaded feature extractors and sends that one extractor plus k classifier heads. In
the private variant each upload is ``r + clip(θ − r, C) + N(0, σ²C²)`` on the public
reference r (the client's previous upload, θ⁰ at first), the client asks for every peer
and chooses among them locally, its replies carry no other data-dependent field, and the run
reports the (ε, δ) of all its uploads under replace adjacency (sensitivity 2C) from opacus'
RDP accountant (docs/papers/pfedsv.md §11).

The reading of the paper, decisions and measurements: docs/methods/pfedsv.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from pydantic import Field

from pflarena.core import drawing, keys
from pflarena.core.footprint import FLOAT64, Federation, Footprint, stored_versions
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.model_split import layer_owners, split_names
from pflarena.methods.pfedsv import keys as pfedsv_keys
from pflarena.strategies.aggregation import as_record, weighted_mean
from pflarena.strategies.base import (
    MultiExchangeStrategy,
    Send,
    StrategySetup,
    array_problem,
    vector_problem,
)

__all__ = ["DP_ADJACENCY", "DP_SENSITIVITY", "PFedSV", "PFedSVParams", "dp_epsilon", "split_head"]

MODELS = "models"  # the server pool's record: each client's latest upload
#: the checkpoint's relevance rows (one per client that reported, N float64) and their clients
RELEVANCE_ROWS, RELEVANCE_CLIENTS = "pfedsv/relevance", "pfedsv/relevance-clients"
REQUEST, RELEVANCE = pfedsv_keys.REQUEST, pfedsv_keys.RELEVANCE
FEATURES, PEER_PREFIX = pfedsv_keys.FEATURES, pfedsv_keys.PEER_PREFIX


class PFedSVParams(MethodParams):
    """pFedSV's parameters; defaults are the paper's settings and the resolutions of docs/papers/pfedsv.md §9."""

    initial_k: int = Field(5, ge=1, description="k₀: peers downloaded while exploring")
    max_k: int = Field(
        0, ge=0, description="cap on k once exploration is over (0: none; 10 for 100 clients)"
    )
    top_k_rule: Literal["explore", "literal"] = Field(
        "explore",
        description="'explore': keep ≥1 exploration slot until every peer was valued "
        "(docs/papers/pfedsv.md §3.4); 'literal': top-k of the relevance, k = #positive",
    )
    alpha: float = Field(0.5, ge=0, lt=1, description="moving-average factor α of Eq. 5")
    permutations_per_player: int = Field(
        3,
        ge=0,
        description="R = this × |S| sampled orderings (0: exact; exact is used anyway when "
        "it needs fewer utility evaluations)",
    )
    distance_ref: Literal["round-start", "current-self-median", "none"] = Field(
        "round-start",
        description="Eq. 6's distances: from the client's model at the round's start "
        "(docs/papers/pfedsv.md §9.1); current-self-median: the peers' from the own trained model, the own model's "
        "the median of those; or none (weights ∝ SV)",
    )
    validation_subsample: int = Field(
        0,
        ge=0,
        description="Shapley utilities on this many validation images, drawn afresh each "
        "round (0: the whole split, as the paper; not in the paper, it trades accuracy of the "
        "values for time)",
    )
    empty_value: Literal["zero", "chance"] = Field(
        "zero", description="v(∅): 0 (paper) or chance accuracy 1/classes"
    )
    guard: Literal["none", "validation"] = Field(
        "none",
        description="none (paper): the weighted aggregate is the personalized model; "
        "validation (not in the paper): keep the own trained model when the aggregate "
        "validates below it",
    )
    variant: Literal["D", "D+C"] = Field(
        "D", description="D: download k full models; D+C: one averaged feature extractor + k heads"
    )
    head_layers: int = Field(1, ge=1, description="D+C: layers with weights in the classifier head")
    pool: Literal["latest", "current-round"] = Field(
        "latest",
        description="peers offered: every client's latest upload, or this round's only",
    )
    dp_noise: float = Field(
        0.0,
        ge=0,
        description="noise multiplier σ of the private variant: each upload is r + clip(θ − r, "
        "C) + N(0, σ²C²) on the client's previous upload r (0: off)",
    )
    dp_clip: float = Field(1.0, gt=0, description="L2 clip C of θ − r in the private variant")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="δ of the reported (ε, δ)")
    report_relevance: bool = Field(
        True,
        description="clients send their relevance vectors (the run's relevance picture; "
        "reveals their valuations to the server)",
    )


#: settings only the server uses: the solver is sent the others (:meth:`PFedSV.client_settings`)
SERVER_SIDE = {"variant", "head_layers", "pool", "dp_delta"}


def split_head(names: Sequence[str], trainable: Sequence[str], layers: int) -> list[str]:
    """The state entries of the classifier head: those of the last ``layers`` weighted layers.

    ``trainable`` (in state order) tells the layers apart by their module prefix; every
    state entry of those modules (buffers too) belongs to the head
    (:func:`pflarena.core.model_split.split_names`).
    """
    owners = layer_owners(trainable)
    if layers >= len(owners):
        raise ValueError(
            f"pfedsv.head-layers={layers} leaves no feature extractor: the model has "
            f"{len(owners)} layers with weights"
        )
    return list(split_names(names, trainable, layers).head)


#: the private variant's neighbouring relation and the sensitivity of each release under it
DP_ADJACENCY = "replace"
DP_SENSITIVITY = 2.0  # × C: clip(θ − r) and clip(θ' − r) both lie in the ball of radius C


def _rdp_accountant() -> type:
    """opacus' ``RDPAccountant`` class, imported without the handler opacus puts on the root
    logger: ``opacus.utils.module_utils`` calls ``logging.basicConfig`` at import, and Flower's
    logger, which propagates to the root logger, then printed every line twice."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        from opacus.accountants import RDPAccountant
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
    return RDPAccountant


def dp_epsilon(noise: float, uploads: int, delta: float) -> float:
    """ε of ``uploads`` releases of the private variant at ``δ`` (opacus' RDP accountant).

    Each release is ``r + clip(θ − r, C) + N(0, σ²C²)`` on a public reference r (the
    client's previous release), so, given the earlier releases, it is a Gaussian mechanism
    on the clipped difference. Neighbouring inputs: the client's private data (training,
    validation and test splits, and through them everything it computes) replaced by any
    other data of the same sizes; the clipped difference then moves by at most 2C, so the
    noise multiplier relative to the sensitivity is σ/2. The releases compose adaptively
    over all the client's uploads, without subsampling amplification (the server knows who
    was sampled).
    """
    if uploads == 0:
        return 0.0
    if noise <= 0:
        return float("inf")
    accountant = _rdp_accountant()()
    accountant.history = [(noise / DP_SENSITIVITY, 1.0, uploads)]
    return float(accountant.get_epsilon(delta))


class PFedSV(MultiExchangeStrategy):
    """pFedSV (D), (D+C) and +DP: Algorithm 1 with the client's game in its solver.

    Parameters
    ----------
    names
        The model's state entries, in order (the layout of the uploads).
    trainable
        Its trainable parameters, in order (to find the classifier head for D+C).
    params
        :class:`PFedSVParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="pfedsv",
        kind="paper",
        reference="Wu et al., Rethinking Personalized Client Collaboration in Federated "
        "Learning (docs/methods/pfedsv.md)",
        summary="clients value peers' models with Shapley values on their validation split "
        "and aggregate their top-k",
        solver="pflarena.methods.pfedsv.solver",
        params=PFedSVParams,
        global_model=False,
        needs_validation=True,
    )
    pool_models = (1, "its latest model")

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        # φ^i (float64) and the explored flags (one byte) per peer
        return [
            Footprint("its trained and personal models", 2 * federation.state_bytes(), 2),
            Footprint("its relevance vector", 9 * federation.num_clients),
        ]

    checkpointed = {"features": "features/"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The D+C feature extractor (the model's body), and a relevance row of N float64
        per client that has reported one: as many as the clients expected to have trained
        at least once (:func:`~pflarena.core.footprint.stored_versions` of one version)."""
        f, n = federation, federation.num_clients
        terms = super().checkpoint_footprint(params, federation)
        if params.variant == "D+C":
            body = f.split(params.head_layers).body
            terms.append(Footprint("the feature extractor", f.entry_bytes(body)))
        if params.report_relevance and params.dp_noise <= 0:
            rows = stored_versions(f, 1)
            terms.append(
                Footprint(
                    f"the relevance rows ({rows:,.0f} x {n} float64)", rows * (n + 1) * FLOAT64
                )
            )
        return terms

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The relevance rows (a row of N per client, and the matrix drawn from them at the
        end); the round's uploads, held through the personalisation exchange; and the peers'
        models that exchange sends, each read once (k peers a message: ``initial-k``, or
        ``max-k`` where larger; ``top-k-rule=literal`` and an uncapped k can send more)."""
        n, f = federation.num_clients, federation
        k = min(max(n - 1, 0), max(params.initial_k, params.max_k))
        peers = min(n, f.sampled * k)
        return [
            *super().server_footprint(params, federation),
            Footprint(f"the relevance rows and matrix (2 x {n} x {n} float64)",
                      2 * n * n * FLOAT64),
            Footprint(f"the round's uploads, held through the personalisation ({f.sampled})",
                      f.sampled * f.model_bytes),
            Footprint(f"the peers' models the personalisation sends ({peers})",
                      peers * f.model_bytes),
        ]  # fmt: skip

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> PFedSV:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        trainable: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        if self.num_clients is None:
            raise ValueError("pfedsv needs num_clients (the size of the pseudonym space)")
        if self.params.variant == "D+C" and not trainable:
            raise ValueError("pfedsv variant D+C needs the model's trainable parameter names")
        self.trainable = list(trainable)
        #: pseudonym of each client id (a seeded permutation; its own stream, so the
        #: sampler's draws are those of every other method)
        self.pids = [
            int(p) for p in np.random.default_rng([self.seed, 5]).permutation(self.num_clients)
        ]
        self.client_of = {pid: client for client, pid in enumerate(self.pids)}
        #: client id -> its latest reported relevance vector (N float64), by client id of
        #: the peer
        self.relevance: dict[int, np.ndarray] = {}
        #: client id -> number of its uploads used (the private variant's composition)
        self.uploads: dict[int, int] = {}
        #: D+C: the averaged feature extractor of the latest round
        self.features: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ checkpoints
    # The relevance rows are arrays (a row of N per reporting client: in JSON, 20 bytes a
    # value, 250 MB a checkpoint at 3,550 clients); the uploads, keyed by client id, which
    # JSON keys by string: by hand.
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()  # the D+C features: ``checkpointed``
        if self.relevance:
            clients = sorted(self.relevance)
            arrays[RELEVANCE_CLIENTS] = np.array(clients, dtype=np.int64)
            arrays[RELEVANCE_ROWS] = np.stack([self.relevance[c] for c in clients])
        meta["pfedsv"] = {"uploads": {str(c): n for c, n in self.uploads.items()}}
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        own = meta.get("pfedsv", {})
        if RELEVANCE_ROWS in arrays:
            rows = np.asarray(arrays[RELEVANCE_ROWS], dtype=np.float64)
            clients = [int(c) for c in arrays[RELEVANCE_CLIENTS]]
            self.relevance = dict(zip(clients, rows.copy(), strict=True))
        else:  # a checkpoint of an older version kept the rows in its JSON part
            self.relevance = {
                int(c): np.array(r, dtype=np.float64) for c, r in own.get("relevance", {}).items()
            }
        self.uploads = {int(c): int(n) for c, n in own.get("uploads", {}).items()}

    # ------------------------------------------------------------------ messages
    def _config(self, server_round: int, phase: str, **values: Any) -> ConfigRecord:
        return ConfigRecord(
            self.round_config(server_round)
            | {keys.PHASE: phase}
            | self.method_config(**self.client_settings(), **values)
        )

    def client_settings(self) -> dict[str, Any]:
        """The solver's settings by their run-config keys, and the pseudonym space's size."""
        params = self.params
        return params.model_dump(by_alias=True, exclude=SERVER_SIDE) | {
            # the private variant reports nothing that depends on the validation split
            "report-relevance": params.report_relevance and params.dp_noise <= 0,
            "num-peers": self.num_clients,
        }

    def _pid(self, node_id: int) -> int:
        client = self.client_ids.get(node_id)
        return -1 if client is None else self.pids[client]

    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        pool = self.pool(MODELS)
        offered = {self._pid(n) for n in nodes} - {-1}
        if self.params.pool == "latest":
            offered |= {self.pids[c] for c in pool.clients()}
        candidates = sorted(offered)
        first = send(
            keys.PHASE_TRAIN,
            [
                Message(
                    content=RecordDict(
                        {
                            keys.CONFIG: self._config(
                                server_round,
                                keys.PHASE_TRAIN,
                                own=self._pid(n),
                                candidates=candidates,
                            )
                        }
                    ),
                    message_type=MessageType.TRAIN,
                    dst_node_id=n,
                )
                for n in nodes
            ],
        )
        uploaded = self.valid_replies(first, lambda c: self._check_upload(c, arrays))
        if not uploaded:
            return None, None
        uploaders = {first.node_of(m): m for m in uploaded}
        for node, msg in uploaders.items():
            client = self.client_ids[node]
            pool.put(client, server_round, {MODELS: msg.content[keys.ARRAYS]})
            self.uploads[client] = self.uploads.get(client, 0) + 1
        head: list[str] = []
        if self.params.variant == "D+C":
            head = split_head(list(arrays.keys()), self.trainable, self.params.head_layers)
            self.features = weighted_mean(
                [m.content[keys.ARRAYS] for m in uploaded],
                [float(m.content[keys.METRICS][keys.NUM_EXAMPLES]) for m in uploaded],
                [n for n in arrays.keys() if n not in head],
            )
        available = (
            set(pool.clients())
            if self.params.pool == "latest"
            else {self.client_ids[n] for n in uploaders}
        )
        # a peer's model is read once for the round and shared by every message that sends
        # it (one object: the engine serialises it once), not read again per message
        peer_models: dict[int, ArrayRecord] = {}
        messages = [
            self._personalize_message(server_round, node, msg, available, head, peer_models)
            for node, msg in uploaders.items()
        ]
        second = send(pfedsv_keys.PHASE_PERSONALIZE, messages)
        answers = self.valid_replies(second, self._check_answer)
        for msg in answers:
            if RELEVANCE in msg.content.array_records:
                by_pid = msg.content[RELEVANCE][pfedsv_keys.RELEVANCE_VECTOR].numpy()
                self.relevance[self.client_ids[second.node_of(msg)]] = np.asarray(
                    by_pid, dtype=np.float64
                )[self.pids]
        return None, self._round_metrics(uploaded, answers)

    def _check_upload(self, content: RecordDict, reference: ArrayRecord) -> str | None:
        problem = array_problem(content, reference, keys.ARRAYS)
        if problem is not None:
            return problem
        request = content.config_records.get(REQUEST)
        if request is None or any(
            name not in request for name in (pfedsv_keys.REQUEST_PEERS, pfedsv_keys.REQUEST_K)
        ):
            return "no peer request"
        peers, k = request[pfedsv_keys.REQUEST_PEERS], request[pfedsv_keys.REQUEST_K]
        if not isinstance(k, int) or k < 0 or not isinstance(peers, list):
            return f"malformed peer request (k={k!r})"
        if any(not isinstance(p, int) or not 0 <= p < self.num_clients for p in peers):
            return "peer request names an unknown pseudonym"
        return None

    def _check_answer(self, content: RecordDict) -> str | None:
        if RELEVANCE not in content.array_records:
            return None
        return vector_problem(
            content,
            RELEVANCE,
            {
                pfedsv_keys.RELEVANCE_VECTOR: (self.num_clients,),
                pfedsv_keys.RELEVANCE_VALUES: (None,),
                pfedsv_keys.RELEVANCE_PLAYERS: (None,),
            },
        )

    def _personalize_message(
        self,
        server_round: int,
        node: int,
        upload: Message,
        available: set[int],
        head: list[str],
        peer_models: dict[int, ArrayRecord],
    ) -> Message:
        """The k first peers of the node's request that the pool holds, never its own (each
        peer's model from ``peer_models``, read from the pool into it the first time)."""
        client = self.client_ids[node]
        request = upload.content[REQUEST]
        wanted = [self.client_of[p] for p in request[pfedsv_keys.REQUEST_PEERS]]
        peers = [c for c in dict.fromkeys(wanted) if c != client and c in available]
        peers = peers[: int(request[pfedsv_keys.REQUEST_K])]
        pool = self.pool(MODELS)
        content = RecordDict(
            {
                keys.CONFIG: self._config(
                    server_round,
                    pfedsv_keys.PHASE_PERSONALIZE,
                    own=self.pids[client],
                    peers=[self.pids[c] for c in peers],
                )
            }
        )
        for peer in peers:
            if peer not in peer_models:
                model = pool.get(peer, MODELS)
                peer_models[peer] = ArrayRecord({n: model[n] for n in head}) if head else model
            content[f"{PEER_PREFIX}{self.pids[peer]}"] = peer_models[peer]
        if head and self.features is not None:
            content[FEATURES] = as_record(self.features)
        return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)

    def _round_metrics(self, uploaded: list[Message], answers: list[Message]) -> MetricRecord:
        if self.params.dp_noise > 0:  # the private variant's replies carry no private metric
            return MetricRecord(
                {
                    "clients-trained": len(uploaded),
                    "dp-epsilon": dp_epsilon(
                        self.params.dp_noise,
                        max(self.uploads.values(), default=0),
                        self.params.dp_delta,
                    ),
                }
            )
        metrics = self.train_metrics(uploaded)
        assert metrics is not None
        if answers:
            replies = [m.content[keys.METRICS] for m in answers]
            for name in (
                pfedsv_keys.COALITION_SIZE,
                pfedsv_keys.UTILITY_EVALUATIONS,
                pfedsv_keys.SHAPLEY_TIME,
                pfedsv_keys.OWN_WEIGHT,
                pfedsv_keys.KEPT_OWN,
                pfedsv_keys.AGGREGATE_BELOW_OWN,
                pfedsv_keys.TRAINED_TEST_ACCURACY,
            ):
                metrics[f"mean-{name}"] = float(np.mean([float(r[name]) for r in replies]))
        if self.params.dp_noise > 0:
            metrics["dp-epsilon"] = dp_epsilon(
                self.params.dp_noise, max(self.uploads.values(), default=0), self.params.dp_delta
            )
        return metrics

    # ------------------------------------------------------------------ results
    def relevance_matrix(self) -> np.ndarray:
        """Clients × clients: row i is client i's latest relevance of each peer.

        NaN where there is none: rows of clients that never reported, and the diagonal.
        """
        matrix = np.full((self.num_clients, self.num_clients), np.nan)
        for client, row in self.relevance.items():
            matrix[client] = row
        np.fill_diagonal(matrix, np.nan)
        return matrix

    def run_summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"variant": self.params.variant}
        if self.params.dp_noise > 0:
            summary["dp"] = {
                "noise_multiplier": self.params.dp_noise,
                "clip": self.params.dp_clip,
                "adjacency": DP_ADJACENCY,
                "sensitivity": DP_SENSITIVITY * self.params.dp_clip,
                "delta": self.params.dp_delta,
                "max_uploads": max(self.uploads.values(), default=0),
                "epsilon": dp_epsilon(
                    self.params.dp_noise,
                    max(self.uploads.values(), default=0),
                    self.params.dp_delta,
                ),
            }
        return summary

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``relevance.csv`` and the heatmap ``relevance.png`` (when clients reported)."""
        if not self.relevance:
            return []
        matrix = self.relevance_matrix()
        csv = output_dir / "relevance.csv"
        np.savetxt(csv, matrix, delimiter=",", fmt="%.6g", header="row: client, column: peer")
        bound = float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0
        png = drawing.heatmap(
            output_dir / "relevance.png",
            matrix,
            title=f"pFedSV relevance φ after round {self.server_round}",
            colorbar_label="relevance φ of the peer to the client",
            xlabel="peer (client id)",
            ylabel="client id",
            cmap="RdBu",
            vmin=-bound,
            vmax=bound,
            square=True,
            dpi=120,
        )
        return [csv, png]
