"""Each model's state-dict entry names, without torch: what a run config's check needs of
the run's model (a split-model method's body/head split, PPFL's canonical layers).

:data:`LAYOUTS` (``model_layouts.json`` beside this module) holds, for every model of the
zoo (:mod:`pflarena.core.models`), its state-dict entries and trainable parameters in
order, and the input shapes of the registered data sets on which it builds. It is written
from the built models by ``make generated`` (:func:`write_model_layouts`), and a test keeps
it equal to them. A model's names do not depend on its input: the table would not be
written otherwise. A shape the table does not hold (imported shards of another shape, an
input the model cannot read) is answered by building the model, which imports torch and
raises the builder's own error.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LAYOUTS",
    "ModelLayout",
    "known_layout",
    "layout_of",
    "model_layout",
    "model_layouts",
    "run_layout",
    "write_model_layouts",
]

#: The table, written by ``make generated``.
LAYOUTS = Path(__file__).resolve().with_name("model_layouts.json")


@dataclass(frozen=True)
class ModelLayout:
    """A model's state-dict entries (parameters and buffers) and its trainable parameters,
    each in state order."""

    state: tuple[str, ...]
    trainable: tuple[str, ...]


@functools.cache
def _table() -> dict[str, Any]:
    try:
        return json.loads(LAYOUTS.read_text(encoding="utf-8"))
    except FileNotFoundError:  # an install without it: every model is built
        return {}


def known_layout(name: str, input_shape: Sequence[int]) -> ModelLayout | None:
    """Model ``name``'s layout for inputs of ``input_shape`` from :data:`LAYOUTS`; None
    where the table does not hold that model and shape."""
    entry = _table().get(name)
    if entry is None or [int(n) for n in input_shape] not in entry["input_shapes"]:
        return None
    return ModelLayout(tuple(entry["state"]), tuple(entry["trainable"]))


def layout_of(model: Any) -> ModelLayout:
    """The layout of a built model (a torch ``nn.Module``)."""
    trainable = tuple(name for name, p in model.named_parameters() if p.requires_grad)
    return ModelLayout(tuple(model.state_dict().keys()), trainable)


def model_layout(name: str, input_shape: Sequence[int], num_classes: int) -> ModelLayout:
    """Model ``name``'s layout for inputs of ``input_shape``: from :data:`LAYOUTS` where it
    holds them, else from the model built (torch), whose builder raises for an input the
    model cannot read."""
    layout = known_layout(name, input_shape)
    if layout is not None:
        return layout
    from pflarena.core.models import build_model

    return layout_of(build_model(name, tuple(input_shape), num_classes))


def run_layout(cfg: Any) -> ModelLayout:
    """The layout of a run's model (``cfg``: a RunConfig): ``model``, or its data's default,
    on the run's data."""
    info = cfg.data_info()
    return model_layout(cfg.model_name(), info.input_shape, info.num_classes)


def model_layouts() -> dict[str, Any]:
    """:data:`LAYOUTS` as the models build (imports torch): every model, on the input shape
    of each registered data set it fits and builds on.

    Raises ValueError where a model's names differ between two input shapes (a table by
    model name could not hold it).
    """
    from pflarena.core.datasets import DATASETS, dataset_info
    from pflarena.core.model_names import MODEL_NAMES, ModelError, check_model_fits
    from pflarena.core.models import build_model

    table: dict[str, Any] = {}
    for name in MODEL_NAMES:
        shapes: list[list[int]] = []
        layout: ModelLayout | None = None
        tried: list[list[int]] = []
        for dataset in DATASETS:
            info = dataset_info(dataset)
            shape = [int(n) for n in info.input_shape]
            try:
                check_model_fits(name, info)
                if shape in tried:  # the count of classes names no entry: one build per shape
                    continue
                tried.append(shape)
                built = layout_of(build_model(name, tuple(shape), info.num_classes))
            except (ModelError, RuntimeError):  # an input it cannot read: left to the builder
                continue
            if layout is not None and built != layout:
                raise ValueError(f"model {name!r}: its state names differ with input {shape}")
            layout = built
            shapes.append(shape)
        if layout is not None:
            table[name] = {
                "input_shapes": shapes,
                "state": list(layout.state),
                "trainable": list(layout.trainable),
            }
    return table


def write_model_layouts(path: Path = LAYOUTS) -> None:
    """Rewrite :data:`LAYOUTS` from the built models (``make generated``)."""
    path.write_text(json.dumps(model_layouts(), indent=1) + "\n", encoding="utf-8")
