"""Local solver for pFedSV: local training, then a Shapley game over the peers' models.

A round has two exchanges (docs/papers/pfedsv.md §3.2):

``train``
    The client trains its personalized model θ_i^{(t−1)*} for E epochs into θ_i^t, keeps
    θ_i^t, and uploads it (with Gaussian noise in the private variant, §3.6) together with
    its request: the peers it wants, best first (:func:`select_peers`, §3.4).
``personalize``
    The server sends the k requested peers' models (in the D+C variant: the averaged feature
    extractor and the k peers' classifier heads). The client values {own model} ∪ peers
    with Shapley values on its validation split (utility: accuracy of the coalition's plain
    parameter average, v(∅) = 0; :func:`pflarena.methods.pfedsv.shapley.shapley_values`), updates
    its relevance vector (Eq. 5), and aggregates the positively valued models weighted by
    SV / distance (Eq. 6-7, :func:`aggregation_weights`) into θ_i^{t*}.

Peers are known by pseudonyms (``pids``) the server assigns; the client's relevance vector
and explored set are indexed by them. Client state: the personalized model, the model
trained this round, and the relevance vector with the explored set.

How it runs: docs/methods/pfedsv.md; the reading of the paper, decisions and measurements:
docs/papers/pfedsv.md.
"""

from __future__ import annotations

import copy
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from torch import nn

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.training import train_epochs
from pflarena.methods.pfedsv import keys as pfedsv_keys
from pflarena.methods.pfedsv.shapley import shapley_values

__all__ = [
    "FEATURES",
    "PEER_PREFIX",
    "PERSONAL_KEY",
    "RELEASE_KEY",
    "RELEVANCE",
    "RELEVANCE_KEY",
    "REQUEST",
    "TRAINED_KEY",
    "aggregation_weights",
    "clip_and_noise",
    "evaluate",
    "personalized_model",
    "private_release",
    "select_peers",
    "train",
    "update_relevance",
    "validation_subsample",
]

PERSONAL_KEY = "pfedsv/personal-model"  # θ_i^{t*}: trained from, evaluated, the distance ref
TRAINED_KEY = "pfedsv/trained-model"  # θ_i^t: this round's locally trained model (clean)
RELEVANCE_KEY = "pfedsv/relevance"  # φ^i and the explored set, indexed by pid
RELEASE_KEY = "pfedsv/release"  # private variant: the client's latest release (public)
CHOSEN_KEY = "pfedsv/chosen"  # private variant: the peers chosen this round (kept local)

REQUEST = pfedsv_keys.REQUEST
RELEVANCE = pfedsv_keys.RELEVANCE
FEATURES = pfedsv_keys.FEATURES
PEER_PREFIX = pfedsv_keys.PEER_PREFIX


# --------------------------------------------------------------------------- the math
def select_peers(
    relevance: np.ndarray,
    explored: np.ndarray,
    candidates: Sequence[int],
    *,
    initial_k: int,
    max_k: int | None,
    rule: str,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """The peers to download (§3.4): a ranked request and how many of it to take.

    Parameters
    ----------
    relevance, explored
        φ^i and the explored mask, indexed by pid.
    candidates
        Pids the server can deliver (the client's own pid excluded).
    initial_k
        k_0, the download number while the client still explores.
    max_k
        Cap on k once exploration is over (``None``: no cap).
    rule
        ``"explore"`` (the default resolution of docs/papers/pfedsv.md §9.3): while some candidate
        is unexplored, keep the best ``k_0 − e`` positively valued peers and explore ``e ≥ 1``
        unexplored ones, ``e = max(1, k_0 − #positive)``; afterwards k = #positive (at
        least 1, at most ``max_k``). ``"literal"``: the paper's text, top-k of φ with
        k = #positive (k_0 while there is none); it stops exploring once k peers are
        positive.
    rng
        Breaks ties (and picks the explored peers) uniformly at random.

    Returns
    -------
    (request, k)
        Every candidate, the chosen k first, then the rest best first as a fallback for
        peers the server cannot deliver.
    """
    if rule not in ("explore", "literal"):
        raise ValueError(f"rule must be 'explore' or 'literal', got {rule!r}")
    pool = np.array(sorted(set(int(c) for c in candidates)), dtype=np.int64)
    if pool.size == 0:
        return [], 0
    score = relevance[pool]
    # rank by score, ties in random order
    rank = pool[np.lexsort((rng.permutation(pool.size), -score))]
    positive = [int(p) for p in rank if relevance[p] > 0]
    unexplored = [int(p) for p in pool if not explored[p]]
    if rule == "literal":
        k = len(positive) if positive else initial_k
        chosen = [int(p) for p in rank[:k]]
    elif unexplored:
        explore = min(len(unexplored), max(1, initial_k - len(positive)))
        keep = positive[: max(0, min(initial_k - explore, len(positive)))]
        picked = rng.choice(len(unexplored), size=explore, replace=False)
        chosen = keep + [unexplored[i] for i in sorted(picked)]
    else:
        k = max(1, len(positive))
        chosen = [int(p) for p in rank[: k if max_k is None else min(k, max_k)]]
    chosen = chosen[: len(pool)]
    rest = [int(p) for p in rank if int(p) not in set(chosen)]
    return chosen + rest, len(chosen)


def update_relevance(relevance: np.ndarray, values: dict[int, float], alpha: float) -> np.ndarray:
    """Eq. 5: φ_j ← α φ_j + (1−α) SV_j for the valued players; the others unchanged."""
    out = relevance.copy()
    for pid, value in values.items():
        out[pid] = alpha * out[pid] + (1.0 - alpha) * value
    return out


def aggregation_weights(
    values: Sequence[float], distances: Sequence[float] | None, floor: float = 1e-12
) -> np.ndarray | None:
    """Eq. 6: ``max(SV_j, 0) / ||θ_j − ref||``, normalized to sum to one.

    ``distances`` ``None`` gives pure SV weights. Returns ``None`` when no model has a
    positive value (the caller keeps its own model, docs/papers/pfedsv.md §9.9).
    """
    positive = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    if distances is not None:
        positive = positive / np.maximum(np.asarray(distances, dtype=np.float64), floor)
    total = positive.sum()
    if not total > 0:
        return None
    return positive / total


def eq6_distances(vectors: Sequence[np.ndarray], reference: np.ndarray | None) -> list[float]:
    """The distances of Eq. 6 for the players ``vectors`` (the client's own model first).

    With a ``reference`` (``distance-ref=round-start``, docs/papers/pfedsv.md §9.1) every player's
    distance, the own model's included, is taken from it (the client's personalized model at the
    round's start). Without one (``current-self-median``) the peers' distances are taken
    from the own trained model, as Eq. 6 prints them, and the own model, whose distance to
    itself is 0, gets the median of the peers' distances.
    """
    if reference is not None:
        return [float(np.linalg.norm(v - reference)) for v in vectors]
    own, peers = vectors[0], vectors[1:]
    to_peers = [float(np.linalg.norm(v - own)) for v in peers]
    return [float(np.median(to_peers)) if to_peers else 1.0, *to_peers]


def clip_and_noise(
    delta: dict[str, torch.Tensor], clip: float, noise: float, generator: torch.Generator
) -> tuple[dict[str, torch.Tensor], float]:
    """Clip an update to L2 norm ``clip`` and add N(0, (noise·clip)²) (docs/papers/pfedsv.md §3.6).

    Returns the noised update and the update's norm before clipping.
    """
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in delta.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    noised = {
        name: t * scale
        + noise * clip * torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)
        for name, t in delta.items()
    }
    return noised, norm


def private_release(
    reference: dict[str, torch.Tensor],
    trained: dict[str, torch.Tensor],
    clip: float,
    noise: float,
    generator: torch.Generator,
) -> tuple[dict[str, torch.Tensor], float]:
    """The private variant's release ``r + clip(θ − r, C) + N(0, σ²C²)``.

    ``reference`` is the public reference r (the client's previous release, the initial
    model at first); ``trained`` is θ. Every floating entry (parameters and buffers) goes
    through the clipped, noised difference; the others (integer counters) are r's, so
    nothing of θ leaves except through the Gaussian mechanism. Returns the release and
    ``‖θ − r‖`` before clipping (which the client keeps to itself).
    """
    floating = [k for k, v in reference.items() if torch.is_floating_point(v)]
    noised, norm = clip_and_noise(
        {k: trained[k] - reference[k] for k in floating}, clip, noise, generator
    )
    return {k: reference[k] + noised[k] if k in noised else reference[k] for k in reference}, norm


def validation_subsample(
    x: torch.Tensor, y: torch.Tensor, size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` validation images drawn uniformly without replacement (all when ``size`` is 0
    or at least the split's size)."""
    if size <= 0 or size >= len(y):
        return x, y
    chosen = torch.randperm(len(y), generator=generator)[:size].to(y.device)
    return x[chosen], y[chosen]


# --------------------------------------------------------------------------- the game
#: Validation images per forward pass of a utility evaluation.
EVAL_CHUNK = 256


@dataclass
class _Game:
    """Client i's coalition game: players are pids, models their state dicts."""

    model: nn.Module
    players: list[int]
    states: dict[int, dict[str, torch.Tensor]]
    x_val: torch.Tensor
    y_val: torch.Tensor
    empty_value: float
    linear_head: tuple[str, str] | None = None  # (weight, bias) names: the logit shortcut

    def __post_init__(self) -> None:
        first = self.states[self.players[0]]
        self.float_keys = [k for k, v in first.items() if torch.is_floating_point(v)]
        self.stacked = {
            k: torch.stack([self.states[p][k] for p in self.players]) for k in self.float_keys
        }
        self.index = {p: i for i, p in enumerate(self.players)}
        self.evaluations = 0
        self._features: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        if self.linear_head is not None:
            self._cache_logits()

    def average(self, coalition: Sequence[int], weights: np.ndarray | None = None) -> dict:
        """The members' (weighted) parameter average; integer buffers from the first."""
        idx = torch.tensor([self.index[p] for p in coalition])
        out = dict(self.states[coalition[0]])
        for k in self.float_keys:
            members = self.stacked[k][idx]
            if weights is None:
                out[k] = members.mean(dim=0)
            else:
                w = torch.as_tensor(weights, dtype=members.dtype, device=members.device)
                out[k] = torch.tensordot(w, members, dims=1)
        return out

    def _cache_logits(self) -> None:
        # With a linear head the logits of the averaged head are the average of each head's
        # logits on the shared features: one forward pass per member instead of one per
        # coalition.
        weight, bias = self.linear_head
        features: list[torch.Tensor] = []
        head = dict(self.model.named_modules())[weight.rsplit(".", 1)[0]]
        hook = head.register_forward_hook(lambda _m, inputs, _o: features.append(inputs[0]))
        self.model.load_state_dict(self.states[self.players[0]])
        self.model.eval()
        with torch.no_grad():
            self.model(self.x_val)
        hook.remove()
        feats = features[0]
        self._logits = torch.stack(
            [feats @ self.states[p][weight].T + self.states[p][bias] for p in self.players]
        )

    def utility(self, coalition: frozenset) -> float:
        if not coalition:
            return self.empty_value
        self.evaluations += 1
        members = sorted(coalition, key=self.index.__getitem__)
        if self._logits is not None:
            idx = torch.tensor([self.index[p] for p in members])
            logits = self._logits[idx].mean(dim=0)
            return int((logits.argmax(dim=1) == self.y_val).sum()) / len(self.y_val)
        return self.accuracy(self.average(members))

    def accuracy(self, state: dict[str, torch.Tensor]) -> float:
        """Validation accuracy of the model with ``state`` (not counted as an evaluation).

        The forward passes take :data:`EVAL_CHUNK` images at a time: on the MNIST CNN the
        activations of 1,024 images (103 MB for the first convolution's output) overflow the
        CPU's caches, and 256-image chunks compute the same logits 1.6 to 2.6 times faster
        (``benchmarks/pfedsv_cost.py``).
        """
        self.model.load_state_dict(state)
        self.model.eval()
        correct = 0
        with torch.inference_mode():
            for s in range(0, len(self.y_val), EVAL_CHUNK):
                logits = self.model(self.x_val[s : s + EVAL_CHUNK])
                correct += int((logits.argmax(1) == self.y_val[s : s + EVAL_CHUNK]).sum())
        return correct / len(self.y_val)


def own_accuracy(game: _Game, utilities: dict[frozenset, float], own: int) -> float:
    """The own model's validation accuracy: v({own}) when the game evaluated it through a
    forward pass of the model (the one-member average is the own state, bit for bit), else
    one more pass (the linear-head shortcut's logits may differ in the last bits)."""
    single = frozenset({own})
    if game._logits is None and single in utilities:
        return utilities[single]
    return game.accuracy(game.states[own])


# --------------------------------------------------------------------------- phases
def _rng(job: ClientJob, purpose: str) -> np.random.Generator:
    return np.random.default_rng(job.generator(purpose).initial_seed())


def _relevance(job: ClientJob, num_peers: int) -> tuple[np.ndarray, np.ndarray]:
    record = job.state.get(RELEVANCE_KEY)
    if record is None:
        return np.zeros(num_peers), np.zeros(num_peers, dtype=bool)
    relevance = record["relevance"].numpy().astype(np.float64)
    explored = record["explored"].numpy().astype(bool)
    if len(relevance) != num_peers:
        raise ValueError(
            f"stored relevance has {len(relevance)} entries, the federation {num_peers} peers"
        )
    return relevance, explored


def _linear_head(model: nn.Module, head: list[str]) -> tuple[str, str] | None:
    """(weight, bias) names when the head is one ``nn.Linear`` layer, else None."""
    modules = {name.rsplit(".", 1)[0] for name in head}
    if len(modules) != 1:
        return None
    (name,) = modules
    layer = dict(model.named_modules())[name]
    if not isinstance(layer, nn.Linear) or layer.bias is None:
        return None
    return f"{name}.weight", f"{name}.bias"


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(job: ClientJob) -> tuple[dict, dict]:
    model = job.state_model_or_initial(PERSONAL_KEY)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.save_state_model(TRAINED_KEY, model)
    upload = _state(model)
    metrics = train_metrics(job, loss, steps)
    private = float(job.param("dp-noise")) > 0
    if private:
        # The release is built on the public reference r (the previous release, θ⁰ at
        # first): the private inputs (training and validation splits, the aggregate this
        # round trained from) enter only through clip(θ − r). Fresh, unpredictable noise: a
        # generator seeded from the run seed would let anyone who knows the config subtract it.
        reference_model = job.state_model_or_initial(RELEASE_KEY)
        upload, _ = private_release(
            _state(reference_model),
            upload,
            float(job.param("dp-clip")),
            float(job.param("dp-noise")),
            torch.Generator().manual_seed(secrets.randbits(63)),
        )
        reference_model.load_state_dict(upload)
        job.save_state_model(RELEASE_KEY, reference_model)
        # only what does not depend on the private data: the id and the training split's
        # size (public under the replace adjacency of the accounting)
        metrics = {k: metrics[k] for k in (keys.CLIENT_ID, keys.NUM_EXAMPLES)}
    num_peers = int(job.param("num-peers"))
    relevance, explored = _relevance(job, num_peers)
    own = int(job.param("own"))
    candidates = [int(c) for c in job.param("candidates") if int(c) != own]
    max_k = int(job.param("max-k"))
    request, k = select_peers(
        relevance,
        explored,
        candidates,
        initial_k=int(job.param("initial-k")),
        max_k=max_k or None,
        rule=str(job.param("top-k-rule")),
        rng=_rng(job, "peers"),
    )
    if private:
        # the choice follows the relevance, i.e. the validation split: it stays on the
        # client, which asks for every candidate (a request that depends on nothing private)
        job.state[CHOSEN_KEY] = ArrayRecord({"peers": Array(np.array(request[:k], dtype=np.int64))})
        request, k = sorted(candidates), len(candidates)
    records = {
        keys.ARRAYS: ArrayRecord({k_: Array(v.cpu().numpy()) for k_, v in upload.items()}),
        REQUEST: ConfigRecord({pfedsv_keys.REQUEST_PEERS: request, pfedsv_keys.REQUEST_K: k}),
    }
    return records, metrics


def _personalize(job: ClientJob) -> tuple[dict, dict]:
    started = time.perf_counter()
    own = int(job.param("own"))
    peers = [int(p) for p in job.param("peers")]
    if own in peers:
        raise ValueError(f"the server sent this client's own model (pid {own}) as a peer")
    private = float(job.param("dp-noise")) > 0
    if private:  # every candidate was sent: play the peers chosen in the train phase
        chosen = job.state.get(CHOSEN_KEY)
        if chosen is None:
            raise RuntimeError("personalize: this client chose no peers this round")
        delivered = set(peers)
        peers = [int(p) for p in chosen["peers"].numpy() if int(p) in delivered]
    trained = job.load_state_model(TRAINED_KEY)
    if trained is None:
        raise RuntimeError("personalize: this client has no model trained this round")
    reference = job.state_model_or_initial(PERSONAL_KEY)
    states = {own: _state(trained)}
    for pid in peers:
        states[pid] = {
            k: torch.from_numpy(np.array(v.numpy())).to(job.device)
            for k, v in job.content[f"{PEER_PREFIX}{pid}"].items()
        }
    head: list[str] = []  # D+C: the entries that differ between players
    if FEATURES in job.content.array_records:  # D+C: one feature extractor for everyone
        features = {
            k: torch.from_numpy(np.array(v.numpy())).to(job.device)
            for k, v in job.content[FEATURES].items()
        }
        head = [k for k in states[own] if k not in features]
        states = {pid: {**features, **{k: s[k] for k in head}} for pid, s in states.items()}
    # the stored model keeps the keys' order of the network
    order = list(trained.state_dict())
    states = {pid: {k: s[k] for k in order} for pid, s in states.items()}

    players = [own, *peers]
    num_classes = job.data.info.num_classes
    x_val, y_val = validation_subsample(
        job.data.x_val,
        job.data.y_val,
        int(job.param("validation-subsample")),
        job.generator("validation-subsample"),
    )
    game = _Game(
        model=copy.deepcopy(trained),
        players=players,
        states=states,
        x_val=x_val,
        y_val=y_val,
        empty_value=1.0 / num_classes if job.param("empty-value") == "chance" else 0.0,
        linear_head=_linear_head(trained, head),
    )
    factor = int(job.param("permutations-per-player"))
    utilities: dict[frozenset, float] = {}
    values = shapley_values(
        game.utility,
        players,
        num_permutations=factor * len(players) if factor > 0 else None,
        rng=_rng(job, "shapley"),
        cache=utilities,
    )
    num_peers = int(job.param("num-peers"))
    relevance, explored = _relevance(job, num_peers)
    relevance = update_relevance(
        relevance, {p: values[p] for p in peers}, float(job.param("alpha"))
    )
    explored[peers] = True
    job.state[RELEVANCE_KEY] = ArrayRecord(
        {"relevance": Array(relevance), "explored": Array(explored.astype(np.uint8))}
    )

    distances = None
    if job.param("distance-ref") != "none":
        measured = head if head else [n for n, p in trained.named_parameters() if p.requires_grad]

        def flat(state: dict[str, torch.Tensor]) -> np.ndarray:
            return np.concatenate(
                [state[k].detach().double().cpu().numpy().ravel() for k in measured]
            )

        ref = flat(_state(reference)) if job.param("distance-ref") == "round-start" else None
        distances = eq6_distances([flat(states[p]) for p in players], ref)
    weights = aggregation_weights([values[p] for p in players], distances)
    personalized = states[own] if weights is None else game.average(players, weights)
    kept_own = weights is None
    # The weighted aggregate is a model no utility evaluated: whether it validates below the
    # client's own trained model is logged; guard=validation (not in the paper) then keeps
    # the own model.
    below_own = not kept_own and game.accuracy(personalized) < own_accuracy(game, utilities, own)
    if below_own and job.param("guard") == "validation":
        personalized, kept_own = states[own], True
    # the post-training θ_i^t's test accuracy is logged beside θ_i^{t*}'s
    # (docs/papers/pfedsv.md §9.8)
    trained_test = job.test(trained)
    trained.load_state_dict(personalized)
    job.save_state_model(PERSONAL_KEY, trained)

    metrics = {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: int(len(job.data.y_train)),
        pfedsv_keys.COALITION_SIZE: len(players),
        pfedsv_keys.UTILITY_EVALUATIONS: game.evaluations,
        pfedsv_keys.SHAPLEY_TIME: time.perf_counter() - started,
        pfedsv_keys.OWN_VALUE: values[own],
        pfedsv_keys.OWN_WEIGHT: 0.0 if weights is None else float(weights[0]),
        pfedsv_keys.KEPT_OWN: int(kept_own),
        pfedsv_keys.AGGREGATE_BELOW_OWN: int(below_own),
        pfedsv_keys.TRAINED_TEST_ACCURACY: trained_test.correct / max(trained_test.count, 1),
    }
    records: dict = {}
    if private:  # everything above depends on the validation or test split
        return records, {k: metrics[k] for k in (keys.CLIENT_ID, keys.NUM_EXAMPLES)}
    if bool(job.param("report-relevance")):
        records[RELEVANCE] = ArrayRecord(
            {
                pfedsv_keys.RELEVANCE_VECTOR: Array(relevance),
                pfedsv_keys.RELEVANCE_VALUES: Array(np.array([values[p] for p in players])),
                pfedsv_keys.RELEVANCE_PLAYERS: Array(np.array(players, dtype=np.int64)),
            }
        )
    return records, metrics


def train(job: ClientJob) -> tuple[dict, dict]:
    if job.phase == keys.PHASE_TRAIN:
        return _train(job)
    if job.phase == pfedsv_keys.PHASE_PERSONALIZE:
        return _personalize(job)
    raise ValueError(f"pfedsv: unknown phase {job.phase!r}")


def personalized_model(job: ClientJob) -> nn.Module:
    """θ_i^{t*}, the client's aggregate of its valued peers (θ⁰ before its first round)."""
    return job.state_model_or_initial(PERSONAL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
