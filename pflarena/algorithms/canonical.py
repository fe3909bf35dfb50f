"""K copies of part of a model on a shared trunk, and the ways to combine them per client.

PPFL's canonical models (docs/papers/ppfl.md §2), FedEM's mixture components and IFCA's cluster
models are all "K copies of (part of) the run's model". This module holds that layout and
the forward passes built on it:

* **Layout.** A *stacked state* holds the base model's state entries that are not copied
  (the trunk θ_com) under their own names, then copy k's entries under
  ``<prefix>.<k>.<name>`` for k = 0..K−1. It is what travels in an ``ArrayRecord``.
  The copied entries are every state entry (parameters and buffers) of the last
  ``layers`` layers that have weights, or of the whole model (``layers = 0``: no trunk,
  the paper's MNIST and synthetic settings).
* **Initialisation.** Copy 0 is the run's initial model (seeded by the run seed); copy
  k ≥ 1 is the same architecture initialised with a seed derived from the run seed and k,
  so the copies differ and can separate (docs/papers/ppfl.md §9.13: identical copies with uniform
  memberships get identical gradients forever).
* **Forms** (§2.3). PPFL2, ``interpolate``: one model whose copied parameters are
  ``Σ_k c_k θ_k`` (tensor by tensor), Fig. 2b and Eq. 8. PPFL1, ``mix``: the K copies'
  outputs combined with weights c, Fig. 2a and Eq. 7, in three readings (docs/papers/ppfl.md §9.1):
  ``logit`` (the weighted sum of the outputs), ``prob`` (the weighted sum of the class
  probabilities, Eq. 7 for a GLM; also FedEM's prediction) and ``loss`` (the weighted sum of
  the copies' losses, Appendix O3.4 with the sign fixed, §9.2; it predicts like ``prob``).

A copy's forward pass puts its tensors on one instance of the base architecture, so any
model of the zoo works without a hand-written PPFL variant. A small model made of linear
layers and ReLUs (``logreg``; ``mlp`` and ``mlp-128`` on small inputs:
:func:`~pflarena.core.models.linear_plan`, :data:`BATCHED_PASS_MAX_PARAMETERS`) runs its K
copies as one batched pass instead, the same function with K times fewer operations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

# copied_entries lives with the split, which needs no torch (a run config's check uses it)
from pflarena.core.model_split import copied_entries, layer_owners
from pflarena.core.models import build_model

__all__ = [
    "CanonicalModel",
    "Form",
    "PersonalizedModel",
    "Mix",
    "copied_entries",
    "copy_name",
    "copy_seed",
    "initial_stacked_state",
    "mixture_loss",
    "mixture_scores",
    "parse_stacked",
    "stack_state",
    "weighted_layers",
]

#: The batched pass stacks every copy's weights on each step: it pays for small copies, whose
#: K passes cost more in dispatch than in arithmetic, and not for large ones. Measured per
#: SGD step with K = 4 (prob mixture, batch 128): a logistic regression of 302 parameters
#: per copy 10 % faster batched, an MLP of 101,770 (mlp-128 on MNIST) 12 % slower.
BATCHED_PASS_MAX_PARAMETERS = 16_384

Form = Literal["interpolate", "mix"]
Mix = Literal["logit", "prob", "loss"]


def weighted_layers(trainable: Sequence[str]) -> list[str]:
    """The module prefixes that own trainable parameters, in state order
    (:func:`pflarena.core.model_split.layer_owners`)."""
    return layer_owners(trainable)


def copy_name(prefix: str, index: int, name: str) -> str:
    """The stacked-state name of copy ``index``'s entry ``name``."""
    return f"{prefix}.{index}.{name}"


def copy_seed(seed: int, index: int) -> int:
    """The initialisation seed of copy ``index``: the run seed for copy 0, else one derived
    from (seed, index) by SHA-256, so copies never share an initialisation."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/copy/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def stack_state(
    base: Mapping[str, np.ndarray],
    copies: Sequence[Mapping[str, np.ndarray]],
    entries: Sequence[str],
    prefix: str,
) -> dict[str, np.ndarray]:
    """The stacked state: ``base``'s entries outside ``entries`` (the trunk), then each copy's."""
    chosen = set(entries)
    missing = chosen - set(base)
    if missing:
        raise ValueError(f"copied entries {sorted(missing)} are not in the model's state")
    out = {name: value for name, value in base.items() if name not in chosen}
    for index, copy in enumerate(copies):
        for name in entries:
            out[copy_name(prefix, index, name)] = copy[name]
    return out


def initial_stacked_state(
    model_name: str,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int,
    count: int,
    layers: int,
    prefix: str,
    base: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The initial stacked state of ``count`` copies (server and clients build the same).

    ``base`` is the run's initial model state when the caller has it (the server's arrays);
    copy 0 is that model, copy k ≥ 1 a fresh initialisation seeded by :func:`copy_seed`.
    """
    if count < 1:
        raise ValueError(f"the number of copies must be >= 1, got {count}")
    shape = tuple(input_shape)
    template = build_model(model_name, shape, num_classes, seed=seed)
    if base is None:
        base = {k: v.detach().cpu().numpy() for k, v in template.state_dict().items()}
    trainable = [n for n, p in template.named_parameters() if p.requires_grad]
    entries = copied_entries(list(base), trainable, layers)
    copies: list[Mapping[str, np.ndarray]] = [base]
    for index in range(1, count):
        model = build_model(model_name, shape, num_classes, seed=copy_seed(seed, index))
        copies.append({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    return stack_state(base, copies, entries, prefix)


def parse_stacked(names: Sequence[str], prefix: str) -> tuple[list[str], list[str], int]:
    """``(trunk names, copied entry names, K)`` of a stacked state's names.

    Raises ValueError when the copies do not hold the same entries in the same order.
    """
    marker = prefix + "."
    trunk = [n for n in names if not n.startswith(marker)]
    per_copy: dict[int, list[str]] = {}
    for name in names:
        if not name.startswith(marker):
            continue
        index, _, entry = name[len(marker) :].partition(".")
        if not index.isdigit() or not entry:
            raise ValueError(f"stacked state entry {name!r} is not {prefix}.<k>.<name>")
        per_copy.setdefault(int(index), []).append(entry)
    if not per_copy:
        raise ValueError(f"the state holds no {prefix}.<k>.* entries")
    count = max(per_copy) + 1
    if sorted(per_copy) != list(range(count)):
        raise ValueError(f"copies {sorted(per_copy)} are not numbered 0..{count - 1}")
    entries = per_copy[0]
    for index in range(1, count):
        if per_copy[index] != entries:
            raise ValueError(f"copy {index} holds other entries than copy 0")
    return trunk, entries, count


class CanonicalModel(nn.Module):
    """K copies of part of ``base`` on its shared trunk, loaded from a stacked state.

    Parameters
    ----------
    base
        A model of the run's architecture. Its state is set to the stacked state's trunk;
        its own copied entries are never used (each forward pass substitutes a copy's).
    state
        A stacked state (:func:`stack_state`) as tensors.
    prefix
        The stacked state's copy prefix (``canonical``, ``component``, ``cluster``).
    """

    def __init__(self, base: nn.Module, state: Mapping[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        trunk, entries, count = parse_stacked(list(state), prefix)
        base_state = base.state_dict()
        unknown = [n for n in [*trunk, *entries] if n not in base_state]
        if unknown:
            raise ValueError(f"stacked entries {unknown[:3]} are not in the model's state")
        self.base = base
        self.prefix = prefix
        self.entries = entries
        self.count = count
        params = dict(base.named_parameters())
        self._parameter_names = frozenset(params)
        self.trunk_names = [n for n in trunk if n in params]
        with torch.no_grad():
            for name in trunk:
                base_state[name].copy_(state[name])
        device = next(iter(base_state.values())).device
        self.copies = nn.ModuleList()
        for index in range(count):
            holder = nn.Module()
            for position, name in enumerate(entries):
                value = state[copy_name(prefix, index, name)].detach().clone().to(device)
                if name in params:
                    holder.register_parameter(
                        f"p{position}",
                        nn.Parameter(value, requires_grad=params[name].requires_grad),
                    )
                else:
                    holder.register_buffer(f"p{position}", value)
            self.copies.append(holder)
        for name in entries:  # the base's own copied entries take no part in training
            if name in params:
                params[name].requires_grad_(False)
        #: (the base submodule's parameter or buffer table, attribute, the copy's table,
        #: its name there) of each copied entry: a copy's forward pass puts that copy's
        #: tensors in the base's tables in place of its own and restores them after.
        #: functional_call does the same with more generality and about twice the cost per
        #: call on a small model (measured on a logistic regression), and going through
        #: ``nn.Module.__setattr__`` costs a third of a logistic regression's K-copy step;
        #: the K copies pay it on every minibatch.
        self._slots = []
        for position, name in enumerate(entries):
            module_name, _, attribute = name.rpartition(".")
            module = base.get_submodule(module_name)
            kind = "_parameters" if attribute in module._parameters else "_buffers"
            self._slots.append((getattr(module, kind), attribute, kind, f"p{position}"))

        #: the batched pass over the K copies (``None``: one pass per copy)
        self._plan = self._batched_plan(base, set(params)) if count > 1 else None

    def _batched_plan(self, base: nn.Module, parameters: set[str]) -> list[tuple] | None:
        """The base's ``linear_plan`` with each linear step resolved: ``("copied", weight,
        bias)`` with the names of the copy's tensors (bias ``None`` for a layer without
        one), or ``("trunk", module, None)`` for a shared layer. ``None`` when the model has
        no plan, its copies are too large, or a trunk layer follows a copied one."""
        plan = getattr(base, "linear_plan", None)
        if plan is None or set(self.entries) - parameters:
            return None
        if sum(p.numel() for p in self.copies[0].parameters()) > BATCHED_PASS_MAX_PARAMETERS:
            return None
        position = {name: index for index, name in enumerate(self.entries)}
        steps: list[tuple] = []
        copied_seen = False
        for kind, name in plan():
            if kind != "linear":
                steps.append((kind, None, None))
                continue
            weight, bias = f"{name}.weight", f"{name}.bias"
            if weight in position:
                copied_seen = True
                bias_name = f"p{position[bias]}" if bias in position else None
                steps.append(("copied", f"p{position[weight]}", bias_name))
            elif copied_seen:
                return None
            else:
                steps.append(("trunk", base.get_submodule(name), None))
        return steps if copied_seen else None

    # ------------------------------------------------------------------ parameters
    def copy_entries(self, index: int) -> dict[str, torch.Tensor]:
        """Copy ``index``'s entries by their base names."""
        holder = self.copies[index]
        return {name: getattr(holder, f"p{i}") for i, name in enumerate(self.entries)}

    def trunk_parameters(self) -> list[nn.Parameter]:
        """The trunk's trainable parameters, in state order."""
        params = dict(self.base.named_parameters())
        return [params[n] for n in self.trunk_names if params[n].requires_grad]

    def shared_parameters(self) -> list[nn.Parameter]:
        """θ: the trunk's trainable parameters, then every copy's, in stacked-state order."""
        copied = [
            p for holder in self.copies for p in holder.parameters(recurse=False) if p.requires_grad
        ]
        return self.trunk_parameters() + copied

    def stacked_state(self) -> dict[str, torch.Tensor]:
        """The model as a stacked state (what is sent back to the server)."""
        base_state = self.base.state_dict()
        chosen = set(self.entries)
        out = {n: v.detach() for n, v in base_state.items() if n not in chosen}
        for index in range(self.count):
            for name, value in self.copy_entries(index).items():
                out[copy_name(self.prefix, index, name)] = value.detach()
        return out

    # ------------------------------------------------------------------ forward passes
    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Copy ``index``'s model on ``x``: the trunk with that copy's entries."""
        holder = self.copies[index]
        originals = [table[attribute] for table, attribute, _, _ in self._slots]
        try:
            for table, attribute, kind, own in self._slots:
                table[attribute] = getattr(holder, kind)[own]
            return self.base(x)
        finally:
            for (table, attribute, _, _), original in zip(self._slots, originals, strict=True):
                table[attribute] = original

    def outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every copy's output on ``x`` (PPFL1, FedEM, IFCA)."""
        if self._plan is not None:
            return list(self.stacked_outputs(x).unbind(0))
        return [self.output(index, x) for index in range(self.count)]

    def stacked_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Every copy's output on ``x`` as one tensor ``(K, n, ...)``: one batched pass over
        the copies where the model has a linear plan (the same values as :meth:`output`
        up to float rounding, gradients included), else K passes."""
        if self._plan is None:
            return torch.stack([self.output(index, x) for index in range(self.count)])
        h, stacked = x, False
        for kind, weight, bias in self._plan:
            if kind == "flatten":
                h = h.flatten(2 if stacked else 1)
            elif kind == "relu":
                h = torch.relu(h)
            elif kind == "trunk":  # a shared layer before the copied ones
                h = weight(h)
            else:
                weights = torch.stack([c._parameters[weight] for c in self.copies])  # K,out,in
                inputs = h if stacked else h.expand(self.count, *h.shape)
                if bias is None:
                    h = torch.bmm(inputs, weights.transpose(1, 2))
                else:
                    biases = torch.stack([c._parameters[bias] for c in self.copies])
                    h = torch.baddbmm(biases[:, None, :], inputs, weights.transpose(1, 2))
                stacked = True
        return h

    def interpolated_entries(self, membership: torch.Tensor) -> dict[str, torch.Tensor]:
        """PPFL2's personalized entries ``Σ_k c_k θ_k`` (Eq. 8, tensor by tensor)."""
        out: dict[str, torch.Tensor] = {}
        copies = [self.copy_entries(index) for index in range(self.count)]
        for name in self.entries:
            values = [copy[name] for copy in copies]
            if name not in self._parameter_names:
                raise ValueError(
                    f"entry {name!r} is a buffer: parameter interpolation (PPFL2) needs "
                    "copied layers without normalization statistics"
                )
            total = membership[0].to(values[0].dtype) * values[0]
            for weight, value in zip(membership[1:], values[1:], strict=True):
                total = total + weight.to(value.dtype) * value
            out[name] = total
        return out

    def interpolated_output(self, x: torch.Tensor, membership: torch.Tensor) -> torch.Tensor:
        """PPFL2: the one personalized model ``I(φ(x); Σ_k c_k θ_k)`` on ``x``."""
        return functional_call(self.base, self.interpolated_entries(membership), (x,))

    def personalized_state(self, membership: torch.Tensor) -> dict[str, torch.Tensor]:
        """PPFL2's personalized model as a state of the base architecture."""
        state = {n: v.detach().clone() for n, v in self.base.state_dict().items()}
        with torch.no_grad():
            for name, value in self.interpolated_entries(membership).items():
                state[name] = value.detach().clone()
        return state


class PersonalizedModel(nn.Module):
    """One client's personalized model: the copies combined with its membership.

    ``forward`` gives class scores (logits, or log-probabilities for the ``prob`` and
    ``loss`` mixtures), so the common evaluation loop scores it like any other model, and
    :meth:`loss` is the training loss of the chosen form.
    """

    def __init__(
        self, model: CanonicalModel, membership: torch.Tensor, form: Form, mix: Mix = "logit"
    ) -> None:
        super().__init__()
        if form not in ("interpolate", "mix"):
            raise ValueError(f"unknown form {form!r}; use 'interpolate' (PPFL2) or 'mix' (PPFL1)")
        if membership.shape != (model.count,):
            raise ValueError(
                f"membership of shape {tuple(membership.shape)} for {model.count} copies"
            )
        self.model = model
        self.membership = membership
        self.form = form
        self.mix = mix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "interpolate":
            return self.model.interpolated_output(x, self.membership)
        return mixture_scores(self.model.stacked_outputs(x), self.membership, self.mix)

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, reduction: Literal["mean", "sum"] = "mean"
    ) -> torch.Tensor:
        """Cross-entropy of the personalized model (PPFL2, PPFL1 ``logit``/``prob``) or the
        membership-weighted copies' cross-entropies (PPFL1 ``loss``)."""
        if self.form == "interpolate":
            return F.cross_entropy(self.forward(x), y, reduction=reduction)
        return mixture_loss(self.model.stacked_outputs(x), y, self.membership, self.mix, reduction)


def mixture_scores(
    outputs: Sequence[torch.Tensor] | torch.Tensor, weights: torch.Tensor, mix: Mix
) -> torch.Tensor:
    """Class scores of a mixture of the copies' outputs (its cross-entropy is the loss).

    ``logit``: ``Σ_k c_k z_k``. ``prob`` and ``loss``: ``log Σ_k c_k softmax(z_k)`` (log
    probabilities, so ``F.cross_entropy`` of them is ``−log Σ_k c_k p_k(y|x)``). ``weights``
    is one membership ``(K,)`` or one mixture per sample ``(n, K)`` (FedEM's posterior).
    """
    if mix == "logit":
        total = weights[..., 0:1] * outputs[0] if weights.dim() == 2 else weights[0] * outputs[0]
        for index in range(1, len(outputs)):
            w = weights[..., index : index + 1] if weights.dim() == 2 else weights[index]
            total = total + w * outputs[index]
        return total
    if mix in ("prob", "loss"):
        # one log-softmax over the stacked outputs (K, n, C), not K of them
        stacked = outputs if isinstance(outputs, torch.Tensor) else torch.stack(list(outputs))
        log_probs = F.log_softmax(stacked, dim=-1)
        log_w = torch.log(weights.clamp_min(torch.finfo(log_probs.dtype).tiny)).to(log_probs.dtype)
        log_w = log_w.T[:, :, None] if weights.dim() == 2 else log_w[:, None, None]
        return torch.logsumexp(log_probs + log_w, dim=0)
    raise ValueError(f"unknown mix {mix!r}; use 'logit', 'prob' or 'loss'")


def mixture_loss(
    outputs: Sequence[torch.Tensor] | torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    mix: Mix,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """The training loss of a mixture: the negative log-likelihood of :func:`mixture_scores`, or for
    ``loss`` the membership-weighted sum of the copies' cross-entropies (Appendix O3.4 as a
    negative log-likelihood, docs/papers/ppfl.md §9.2), which is linear in c."""
    if mix == "loss":
        if weights.dim() != 1:
            raise ValueError("the loss mixture takes one membership vector (K,)")
        per_copy = torch.stack([F.cross_entropy(z, target, reduction=reduction) for z in outputs])
        return (weights.to(per_copy.dtype) * per_copy).sum()
    scores = mixture_scores(outputs, weights, mix)
    if mix == "logit":
        return F.cross_entropy(scores, target, reduction=reduction)
    # log-probabilities already: the NLL, not a cross-entropy that renormalizes them (which
    # adds log 1ᵀc, zero on the simplex, but with gradient 1 in every coordinate of c)
    return F.nll_loss(scores, target, reduction=reduction)
