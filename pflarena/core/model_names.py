"""The model zoo's names and what each can read, without torch: what the run config is
checked against before anything imports torch (:mod:`pflarena.core.models` builds them,
and refuses to import when its models and :data:`MODEL_NAMES` differ)."""

from __future__ import annotations

from pflarena.core.datasets import DatasetInfo

__all__ = [
    "MODEL_NAMES",
    "TOKEN_MODELS",
    "ModelError",
    "check_model_fits",
    "default_model_for",
]


class ModelError(ValueError):
    """A model name, or a model/dataset combination, that cannot be built."""


#: Every model of :mod:`pflarena.core.models`, in its order.
MODEL_NAMES: tuple[str, ...] = (
    "logreg",
    "mlp",
    "mlp-128",
    "cnn",
    "cnn-bn",
    "cnn-pfllib",
    "small-cnn",
    "tf-cnn",
    "tf-cnn-same",
    "small-cnn-bn",
    "lenet5",
    "harcnn",
    "resnet18",
    "nf-resnet18-slim",
    "resnet18-gn",
    "resnet18-cifar",
    "resnet18-cifar-gn",
    "resnet18-64",
    "resnet18-64-gn",
    "char-lstm",
    "char-lstm-100",
)

#: Models that take sequences of token ids (data sets with a ``vocabulary_size``).
TOKEN_MODELS: frozenset[str] = frozenset({"char-lstm", "char-lstm-100"})


def check_model_fits(name: str, info: DatasetInfo) -> None:
    """Raise :class:`ModelError` when model ``name`` cannot read data set ``info``'s samples.

    Token models (:data:`TOKEN_MODELS`) need token data whose ids index their embedding
    (``vocabulary_size <= num_classes``); every other model needs numeric samples.

    Parameters
    ----------
    name : str
        Model name.
    info : DatasetInfo
        The data set's description.
    """
    if name not in MODEL_NAMES:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if name in TOKEN_MODELS and not info.tokens:
        raise ModelError(
            f"model {name!r} reads token ids, but dataset {info.name!r} has numeric samples; "
            "choose a model for images or features"
        )
    if name not in TOKEN_MODELS and info.tokens:
        raise ModelError(
            f"dataset {info.name!r} holds token ids (a vocabulary of {info.vocabulary_size}); "
            f"model {name!r} reads numbers: choose one of {', '.join(sorted(TOKEN_MODELS))}"
        )
    if name in TOKEN_MODELS and info.vocabulary_size > info.num_classes:
        raise ModelError(
            f"model {name!r} embeds one row per class ({info.num_classes}), fewer than "
            f"dataset {info.name!r}'s vocabulary of {info.vocabulary_size}"
        )


def default_model_for(dataset: str, info: DatasetInfo | None = None) -> str:
    """The model ``dataset`` gets when the run config leaves ``model`` empty.

    Each registered data set declares it
    (:attr:`~pflarena.core.datasets.DatasetSpec.default_model`). Data that is not registered
    (imported shards name data sets of their own) gets ``char-lstm`` when ``info`` says it
    holds token ids, else ``mlp``, which fits any numeric sample shape.
    """
    from pflarena.core.datasets import DATASETS, dataset_spec

    if dataset in DATASETS:
        return dataset_spec(dataset).default_model
    return "char-lstm" if info is not None and info.tokens else "mlp"
