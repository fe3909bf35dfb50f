"""Model zoo: the architectures the papers train, chosen by name.

Every builder takes the dataset's per-sample ``input_shape`` and ``num_classes`` so the
same name works across datasets (``cnn`` is the FedAvg paper's CNN in its MNIST form for
1-channel 28x28 input and its CIFAR form for 3-channel 32x32 input).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import torch
from torch import nn

__all__ = [
    "MODEL_NAMES",
    "DEFAULT_MODEL",
    "build_model",
    "default_model_for",
    "ModelError",
]


class ModelError(ValueError):
    """A model name, or a model/dataset combination, that cannot be built."""


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Two hidden ReLU layers on the flattened input."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (200, 200)
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al. (2017), "Communication-Efficient Learning ...".

    Two 5x5 convolutions (32 and 64 channels), each followed by 2x2 max pooling, then a
    512-unit fully connected layer. For 28x28 input (MNIST) the convolutions are padded
    ("same"), as in the paper; for 32x32 input (CIFAR) they are unpadded, the common PyTorch
    form (PFLlib's ``FedAvgCNN``), giving 1600 flattened features.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, "cnn")
        padding = 2 if height == 28 else 0
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class PFLlibCNN(nn.Module):
    """PFLlib's ``FedAvgCNN`` (``system/flcore/trainmodel/models.py``): the FedAvg CNN with
    unpadded convolutions at every input size.

    Two unpadded 5x5 convolutions (32 and 64 channels), each followed by ReLU and 2x2 max
    pooling, then a 512-unit fully connected layer. For 28x28 input the flattened features
    are 64·4·4 = 1,024 (PFLlib's ``dim=1024``) and the model has 582,026 parameters for 10
    classes, against the padded original's 1,663,370 (:class:`FedAvgCNN`); for 32x32 input
    it equals :class:`FedAvgCNN`. Papers built on PFLlib (pFedGT among them) train this one.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "cnn-pfllib")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class TFCifarCNN(nn.Module):
    """The CIFAR-10 CNN of TensorFlow's tutorial that McMahan et al. (2017) train, as FedPG
    uses it (specs/fedpg.md §5.3): 797,962 parameters for CIFAR-10.

    Two unpadded 5x5 convolutions with 64 channels, each followed by ReLU and 2x2 max
    pooling, then fully connected layers of 384 and 192 units with dropout (0.2 and 0.5)
    before their ReLUs. Dropout draws from torch's global RNG, which the ClientApp seeds per
    message, so runs stay reproducible.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "tf-cnn")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 384),
            nn.Dropout(0.2),
            nn.ReLU(),
            nn.Linear(384, 192),
            nn.Dropout(0.5),
            nn.ReLU(),
            nn.Linear(192, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al., 1998) with ReLU and max pooling, for 28x28 or 32x32 input."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, _ = _image_shape(input_shape, "lenet5")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, kernel_size=5, padding=2 if height == 28 else 0),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class SmallCNN(nn.Module):
    """A two-convolution CNN for small images such as the 8x8 ``digits`` set."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "small-cnn")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(nn.Linear(flat, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class HARCNN(nn.Module):
    """The two-convolution CNN for UCI HAR used by pFedGT (PFLlib's ``HARCNN``).

    Input (9, 1, 128): Conv(9->32, 1x9), ReLU, MaxPool(1x2); Conv(32->64, 1x9), ReLU,
    MaxPool(1x2); Linear(1664->1024), ReLU, Linear(1024->512), ReLU, Linear(512->classes).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "harcnn")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=(1, 9)),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=(1, 2), stride=2),
            nn.Conv2d(32, 64, kernel_size=(1, 9)),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=(1, 2), stride=2),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 1024),
            nn.ReLU(),
            nn.Linear(1024, 512),
            nn.ReLU(),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18(
    input_shape: tuple[int, ...], num_classes: int, *, norm: str = "batch", cifar_stem: bool = False
) -> nn.Module:
    """ResNet-18 from torchvision, randomly initialised.

    Parameters
    ----------
    norm
        ``"batch"`` keeps torchvision's BatchNorm; ``"group"`` swaps every BatchNorm for
        GroupNorm with 2 groups, which has no running statistics to keep consistent across
        clients (Hsieh et al., 2020).
    cifar_stem
        Replace the ImageNet stem (7x7 stride-2 convolution and max pooling) by a 3x3
        stride-1 convolution, the usual choice for 32x32 input. The pFedGT paper's PFLlib
        setup keeps the ImageNet stem, which is the default here.
    """
    from torchvision.models import resnet18 as tv_resnet18

    channels, _, _ = _image_shape(input_shape, "resnet18")
    if norm == "batch":
        norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d
    elif norm == "group":

        def norm_layer(num_channels: int) -> nn.Module:
            return nn.GroupNorm(2, num_channels)

    else:
        raise ModelError(f"resnet18 norm must be 'batch' or 'group', got {norm!r}")
    model = tv_resnet18(weights=None, num_classes=num_classes, norm_layer=norm_layer)
    if cifar_stem or channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    if cifar_stem:
        model.maxpool = nn.Identity()
    return model


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "logreg": LogisticRegression,
    "mlp": MLP,
    "cnn": FedAvgCNN,
    "cnn-pfllib": PFLlibCNN,
    "small-cnn": SmallCNN,
    "tf-cnn": TFCifarCNN,
    "lenet5": LeNet5,
    "harcnn": HARCNN,
    "resnet18": resnet18,
    "resnet18-gn": lambda shape, classes: resnet18(shape, classes, norm="group"),
    "resnet18-cifar": lambda shape, classes: resnet18(shape, classes, cifar_stem=True),
    "resnet18-cifar-gn": lambda shape, classes: resnet18(
        shape, classes, norm="group", cifar_stem=True
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)

#: The model each dataset gets when the run config leaves ``model`` empty.
DEFAULT_MODEL: dict[str, str] = {
    "digits": "mlp",
    "synthetic": "logreg",
    "synthetic-mixture": "logreg",
    "mnist": "cnn",
    "fashion-mnist": "cnn",
    "emnist": "cnn",
    "cifar10": "cnn",
    "cifar100": "cnn",
    "har": "harcnn",
}


def default_model_for(dataset: str) -> str:
    """The default model name for ``dataset`` (``mlp`` for anything not listed)."""
    return DEFAULT_MODEL.get(dataset, "mlp")


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int | None = None
) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` and ``num_classes`` outputs.

    With ``seed`` the initial weights are reproducible and independent of the global
    torch RNG state (the caller's RNG is left untouched).
    """
    if name not in _BUILDERS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if seed is None:
        return _BUILDERS[name](tuple(input_shape), num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _BUILDERS[name](tuple(input_shape), num_classes)


def _image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ModelError(
            f"model {model!r} needs image-shaped input (channels, height, width), "
            f"got input_shape={tuple(input_shape)}; use 'logreg' or 'mlp' for vector data"
        )
    channels, height, width = input_shape
    return channels, height, width


def _flat_size(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).shape[1])
