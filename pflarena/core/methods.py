"""How a method declares itself: its name, reference, parameters and what it needs.

A method (one of the papers' or a baseline) is a strategy class, a client solver module
and a :class:`MethodDeclaration`, written once next to the strategy. Everything else comes
from the declaration: the run-config keys (``<method>.<param>``) and their validation,
``pflarena run`` flags, the defaults in ``[tool.flwr.app.config]`` (a test keeps them in
sync), ``pflarena methods`` and ``docs/methods.md``.

This module is torch-free and knows no method: the strategies package holds the list of
declared methods (:mod:`pflarena.strategies`), and the run config is validated against it
on the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "PLUGINS_ENV",
    "TRAINING_SETTINGS",
    "MethodDeclaration",
    "MethodParams",
    "hyphenate",
    "plugin_modules",
]

#: The common local-training settings of a run. A method declares which of them its
#: solver honours; a run that sets one it ignores is refused.
TRAINING_SETTINGS: tuple[str, ...] = (
    "local-epochs",
    "batch-size",
    "lr",
    "momentum",
    "weight-decay",
    "lr-milestones",
    "lr-gamma",
)


#: Environment variable naming plug-in modules (comma-separated) that declare more methods;
#: the server loads their strategies, a client accepts them as solvers.
PLUGINS_ENV = "PFLARENA_PLUGINS"


def plugin_modules() -> list[str]:
    """The module names in ``PFLARENA_PLUGINS``."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def hyphenate(name: str) -> str:
    """``personal_epochs`` -> ``personal-epochs``; a trailing ``_`` (``lambda_``) is dropped."""
    return name.rstrip("_").replace("_", "-")


class MethodParams(BaseModel):
    """Base class of a method's parameters: a pydantic model with defaults, ranges and docs.

    Fields use underscores; the run config uses the hyphenated names under the method's
    namespace (``Ditto``'s ``personal_epochs`` is ``ditto.personal-epochs``). Give every
    field a one-line ``description``: it becomes the flag's help and the docs.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # no NaN or infinity in any setting
        populate_by_name=True,
        alias_generator=hyphenate,
    )

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The hyphenated keys (without the method prefix) and their default values."""
        return cls().model_dump(by_alias=True)

    def run_problems(self, cfg: Any) -> list[str]:
        """Problems of these values in the context of a whole run (``cfg``: its RunConfig).

        Checked before anything starts, for the run's own method only; override for rules
        that involve common keys (pFedGT: one γ_i per client).
        """
        return []


@dataclass(frozen=True)
class MethodDeclaration:
    """Everything the platform needs to know about a method.

    Parameters
    ----------
    name
        The value of ``strategy=`` and the prefix of the method's run-config keys.
    kind
        ``"paper"`` for the five seed papers, ``"baseline"`` for what they compare against,
        ``"plugin"`` for methods loaded from ``PFLARENA_PLUGINS``.
    reference
        The paper (authors, title, venue, year) or other source.
    summary
        One line saying what the method does.
    solver
        The client solver: a module path whose ``train(job)`` and ``evaluate(job)`` answer
        this method's messages (``pflarena.client.solvers.<name>`` for built-in methods).
    params
        The method's parameters; :class:`MethodParams` itself when it has none.
    global_model
        Whether the method has a global model to report global accuracy for.
    default_fraction_train
        Fraction of clients sampled per round when the run leaves ``fraction-train`` at 0.
    honours
        The :data:`TRAINING_SETTINGS` its solver uses; a run that sets another is refused.
    needs_validation
        The solver needs each client's validation split (``validation-fraction`` > 0).
    needs_server_data
        The strategy needs a server-held dataset (``server-fraction`` > 0).
    """

    name: str
    kind: Literal["paper", "baseline", "plugin"]
    reference: str
    summary: str
    solver: str
    params: type[MethodParams] = MethodParams
    global_model: bool = True
    default_fraction_train: float = 1.0
    honours: frozenset[str] = frozenset(TRAINING_SETTINGS)
    needs_validation: bool = False
    needs_server_data: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.honours) - set(TRAINING_SETTINGS)
        if unknown:
            raise ValueError(
                f"method {self.name!r} honours unknown settings {sorted(unknown)}; "
                f"known: {', '.join(TRAINING_SETTINGS)}"
            )
        if not 0.0 < self.default_fraction_train <= 1.0:
            raise ValueError(
                f"method {self.name!r}: default_fraction_train must be in (0, 1], "
                f"got {self.default_fraction_train}"
            )
        if not self.name or any(ch in self.name for ch in ". =\"'"):
            raise ValueError(f"method name {self.name!r} must be non-empty, without . = or quotes")

    def defaults(self) -> dict[str, Any]:
        """The method's run-config keys (``<name>.<param>``) and their defaults."""
        return {f"{self.name}.{key}": value for key, value in self.params.defaults().items()}

    def param_docs(self) -> list[tuple[str, Any, str, str]]:
        """``(key, default, type, description)`` of every parameter, in declaration order."""
        rows = []
        for field_name, field in self.params.model_fields.items():
            annotation = field.annotation
            type_name = getattr(annotation, "__name__", None) or str(annotation)
            rows.append(
                (
                    f"{self.name}.{hyphenate(field_name)}",
                    field.default,
                    type_name.replace("typing.", ""),
                    _with_bounds(field.description or "", field.metadata),
                )
            )
        return rows


def _with_bounds(description: str, metadata: list[Any]) -> str:
    bounds = []
    for item in metadata:
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                bounds.append(f"{symbol} {value}")
    return f"{description} ({', '.join(bounds)})" if bounds else description
