"""The server side of a method whose server model is K models of the run's architecture.

IFCA's k cluster models, FedEM's M mixture components, PPFL's K canonical models (on a
shared trunk) and CFL's clusters travel as one stacked state, ``<prefix>.<k>.<name>``
(:mod:`pflarena.algorithms.canonical`): the first round's arrays, the run's initial model,
become copy 0 and K − 1 fresh seeded copies; every evaluation sends the stack, from which
each client picks or mixes its own. :class:`StackedModelsStrategy` is that wiring, written
once; each method says how many copies (:meth:`~StackedModelsStrategy.copies`) and what its
rounds do.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord

from pflarena.algorithms.canonical import initial_stacked_state
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodParams
from pflarena.core.model_split import copied_entries
from pflarena.core.models import ModelShape
from pflarena.strategies.base import MultiExchangeStrategy, StrategySetup

__all__ = ["StackedModelsStrategy"]


class StackedModelsStrategy(MultiExchangeStrategy):
    """K stacked models of the run's architecture under :attr:`prefix`."""

    #: the stacked entries' prefix, ``<prefix>.<k>.<name>`` (a name of the method's keys)
    prefix: ClassVar[str]

    @classmethod
    def from_setup(cls, setup: StrategySetup, **extra: Any) -> StackedModelsStrategy:
        return cls(
            setup.params,
            model=ModelShape.of_run(setup.cfg, setup.cfg.data_info()),
            **extra,
            **setup.common(cls.declaration),
        )

    def __init__(
        self, params: MethodParams | None = None, *, model: ModelShape | None = None, **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        #: the run's model, of which the server builds the fresh copies
        self.model = model or ModelShape()

    @classmethod
    def copies(cls, params: Any) -> tuple[int, int]:
        """How many models (K), and how many of the model's last weighted layers each copy
        holds (0: the whole model; PPFL's canonical layers), from the method's validated
        ``params``. Here: one whole model, the run's (a method with more overrides this;
        CFL's clusters grow from this one as they split)."""
        return 1, 0

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The stacked state: the trunk once and the copied entries K times."""
        count, layers = cls.copies(params)
        if layers == 0:
            return [Footprint(f"the server's {count} models", count * federation.model_bytes)]
        copied = set(copied_entries(tuple(federation.entries), federation.trainable, layers))
        trunk = federation.entry_bytes(n for n in federation.entries if n not in copied)
        return [
            Footprint(
                f"the server's trunk and {count} copies of its last {layers} layers",
                trunk + count * federation.entry_bytes(copied),
            )
        ]

    def is_stacked(self, arrays: ArrayRecord) -> bool:
        return any(name.startswith(self.prefix + ".") for name in arrays.keys())

    def stacked(self, arrays: ArrayRecord) -> ArrayRecord:
        """The K models as a stacked state: ``arrays`` itself once it is one, else built
        from them (the loop's round-0 arrays, the run's initial model)."""
        return arrays if self.is_stacked(arrays) else self.initial_stack(arrays)

    def initial_stack(self, arrays: ArrayRecord) -> ArrayRecord:
        """The run's initial model as copy 0 and K − 1 fresh copies seeded by the run's seed
        (:func:`~pflarena.algorithms.canonical.initial_stacked_state`: the clients build the
        same)."""
        count, layers = self.copies(self.params)
        stacked = initial_stacked_state(
            self.model.name,
            self.model.input_shape,
            self.model.num_classes,
            self.seed,
            count,
            layers,
            self.prefix,
            base={n: arrays[n].numpy() for n in arrays.keys()},
        )
        return ArrayRecord({n: Array(np.ascontiguousarray(v)) for n, v in stacked.items()})

    def evaluate_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """Every client evaluates its own pick or mixture of the K models: all go down,
        one record shared by every message."""
        return self.stacked(arrays)
