"""Data sets: one module per data set (or family), each registered once.

Two kinds of data set come out of this package:

* **Pooled** data sets (:class:`PooledDataset`): one array of samples and one of labels.
  A partitioner (:mod:`pflarena.core.partition`) divides them over the clients.
  ``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``, ``emnist`` and
  ``tiny-imagenet``.
* **Natively federated** data sets (:class:`NaturalDataset`): one array pair per client,
  only the ``"natural"`` partition applies. ``synthetic`` (FedProx Synthetic(α, β)) and
  ``synthetic-on-demand`` (the same model, each client drawn alone from its own stream,
  for virtual federations of up to 100,000 clients),
  ``synthetic-mixture`` (the FedEM / PPFL generator of Marfoq et al. 2021), ``har``
  (UCI HAR, one client per subject), and LEAF's ``shakespeare`` (one client per speaking
  role) and ``femnist`` (one client per writer).

Samples stay compact: images are ``uint8`` arrays of shape ``(N, C, H, W)`` until
:func:`to_tensors` turns them into normalised ``float32`` tensors; tabular and signal
data are ``float32``; token sequences (Shakespeare's characters) are ``uint8`` ids that
become ``int64`` tensors. Nothing here touches the network: torchvision data sets are opened
with ``download=False``.

Layout: :mod:`~pflarena.core.datasets.base` (types), :mod:`~pflarena.core.datasets.registry`
(:class:`DatasetSpec`, :func:`register_dataset`, :func:`load_pooled`, :func:`load_natural`),
:mod:`~pflarena.core.datasets.io` (cache folder, atomic writes, offline copies),
:mod:`~pflarena.core.datasets.tensors` and one module per data set or family. A new data
set is one new module that calls :func:`register_dataset`, plus its import line below;
the import order is the order of :data:`DATASETS`.
"""

from __future__ import annotations

# The data set modules, each registering itself on import; this order is DATASETS' order.
# isort: off
from pflarena.core.datasets import digits  # noqa: F401
from pflarena.core.datasets import synthetic  # noqa: F401
from pflarena.core.datasets import synthetic_mixture  # noqa: F401
from pflarena.core.datasets import torchvision_images  # noqa: F401
from pflarena.core.datasets import har  # noqa: F401
from pflarena.core.datasets import shakespeare  # noqa: F401
from pflarena.core.datasets import femnist  # noqa: F401
from pflarena.core.datasets import tiny_imagenet  # noqa: F401
# isort: on

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset, PooledDataset
from pflarena.core.datasets.digits import load_digits_arrays
from pflarena.core.datasets.femnist import FEMNIST_CLASSES, load_femnist
from pflarena.core.datasets.har import HAR_SIGNALS, har_paths, load_har
from pflarena.core.datasets.io import (
    CIFAR10_CLASSES,
    atomic_write,
    cache_dir,
    read_cifar10_jpeg_tar,
    read_mnist_npz,
)
from pflarena.core.datasets.leaf import LeafUsers, load_leaf_users
from pflarena.core.datasets.registry import (
    DatasetSpec,
    check_dataset_name,
    check_files,
    dataset_info,
    dataset_names,
    dataset_spec,
    load_natural,
    load_natural_client,
    load_pooled,
    natural_client_counts,
    register_dataset,
)
from pflarena.core.datasets.shakespeare import (
    SHAKESPEARE_SEQUENCE_LENGTH,
    SHAKESPEARE_VOCABULARY,
    decode_characters,
    encode_text,
    load_shakespeare,
)
from pflarena.core.datasets.synthetic import (
    SYNTHETIC_DIMENSION,
    SYNTHETIC_MEAN_SIZE,
    SYNTHETIC_MIN_SIZE,
    SYNTHETIC_NUM_CLASSES,
    SYNTHETIC_SIZE_SIGMA,
    generate_synthetic,
    synthetic_on_demand_client,
    synthetic_on_demand_counts,
    synthetic_sizes,
)
from pflarena.core.datasets.synthetic_mixture import (
    MIXTURE_ALPHA,
    MIXTURE_BOX,
    MIXTURE_COMPONENTS,
    MIXTURE_DIMENSION,
    MIXTURE_LABEL_MODES,
    MIXTURE_MAX_SIZE,
    MIXTURE_MIN_SIZE,
    MIXTURE_NOISE_LEVEL,
    SyntheticMixture,
    generate_synthetic_mixture,
    mixture_labels,
    mixture_sample_counts,
)
from pflarena.core.datasets.tensors import to_tensors
from pflarena.core.datasets.tiny_imagenet import TINY_IMAGENET_CLASSES, load_tiny_imagenet
from pflarena.core.datasets.torchvision_images import TORCHVISION_DATASETS

#: Every registered data set, in registration order.
DATASETS: tuple[str, ...] = dataset_names()
#: Data sets that ship with the installed packages (no ``data_dir`` needed).
EMBEDDED_DATASETS: tuple[str, ...] = dataset_names(embedded=True)
#: Natively federated data sets (partition ``"natural"``).
NATURAL_DATASETS: tuple[str, ...] = dataset_names("natural")
#: Pooled data sets (divided by a partitioner).
POOLED_DATASETS: tuple[str, ...] = dataset_names("pooled")

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "EMBEDDED_DATASETS",
    "FEMNIST_CLASSES",
    "HAR_SIGNALS",
    "MIXTURE_ALPHA",
    "MIXTURE_BOX",
    "MIXTURE_COMPONENTS",
    "MIXTURE_DIMENSION",
    "MIXTURE_LABEL_MODES",
    "MIXTURE_MAX_SIZE",
    "MIXTURE_MIN_SIZE",
    "MIXTURE_NOISE_LEVEL",
    "NATURAL_DATASETS",
    "POOLED_DATASETS",
    "SHAKESPEARE_SEQUENCE_LENGTH",
    "SHAKESPEARE_VOCABULARY",
    "SYNTHETIC_DIMENSION",
    "SYNTHETIC_MEAN_SIZE",
    "SYNTHETIC_MIN_SIZE",
    "SYNTHETIC_NUM_CLASSES",
    "SYNTHETIC_SIZE_SIGMA",
    "TINY_IMAGENET_CLASSES",
    "TORCHVISION_DATASETS",
    "DatasetError",
    "DatasetInfo",
    "DatasetSpec",
    "LeafUsers",
    "NaturalDataset",
    "PooledDataset",
    "SyntheticMixture",
    "atomic_write",
    "cache_dir",
    "check_dataset_name",
    "check_files",
    "dataset_info",
    "dataset_names",
    "dataset_spec",
    "decode_characters",
    "encode_text",
    "generate_synthetic",
    "generate_synthetic_mixture",
    "har_paths",
    "load_digits_arrays",
    "load_femnist",
    "load_har",
    "load_leaf_users",
    "load_natural",
    "load_natural_client",
    "load_pooled",
    "load_shakespeare",
    "load_tiny_imagenet",
    "mixture_labels",
    "mixture_sample_counts",
    "natural_client_counts",
    "read_cifar10_jpeg_tar",
    "read_mnist_npz",
    "register_dataset",
    "synthetic_on_demand_client",
    "synthetic_on_demand_counts",
    "synthetic_sizes",
    "to_tensors",
]
