"""Model zoo: the architectures the papers train, chosen by name.

Every builder takes the dataset's per-sample ``input_shape`` and ``num_classes`` so the
same name works across datasets (``cnn`` is the FedAvg paper's CNN in its MNIST form for
1-channel 28x28 input and its CIFAR form for 3-channel 32x32 input). The character models
(``char-lstm``, ``char-lstm-100``) take sequences of token ids and predict the next token,
so they are classifiers over the vocabulary like any other model here;
:func:`check_model_fits` keeps token models and token data together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
from torch import nn

from pflarena.core.datasets import DatasetInfo
from pflarena.core.model_names import (
    MODEL_NAMES,
    TOKEN_MODELS,
    ModelError,
    check_model_fits,
    default_model_for,
)

__all__ = [
    "MODEL_NAMES",
    "TOKEN_MODELS",
    "build_model",
    "check_model_fits",
    "default_model_for",
    "ModelError",
]


@dataclass(frozen=True)
class ModelShape:
    """What builds a run's model: its name in the zoo, the input's shape, the classes (a
    strategy that builds models on the server takes one)."""

    name: str = "logreg"
    input_shape: tuple[int, ...] = ()
    num_classes: int = 2

    @classmethod
    def of_run(cls, cfg: Any, info: DatasetInfo) -> ModelShape:
        """The run's model (``cfg``: a RunConfig; ``info``: its dataset's DatasetInfo)."""
        return cls(cfg.model_name(), tuple(info.input_shape), int(info.num_classes))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))

    def linear_plan(self) -> list[tuple[str, str | None]]:
        """:meth:`forward` as steps (see :func:`linear_plan`)."""
        return [("flatten", None), ("linear", "linear")]


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

    def linear_plan(self) -> list[tuple[str, str | None]]:
        """:meth:`forward` as steps (see :func:`linear_plan`)."""
        return linear_plan(self.net, "net")


def linear_plan(sequence: nn.Sequential, prefix: str) -> list[tuple[str, str | None]]:
    """A Sequential of ``Flatten``, ``Linear`` and ``ReLU`` layers as the steps
    ``("flatten", None)``, ``("linear", <module name>)``, ``("relu", None)``.

    A model made only of such layers says so with a ``linear_plan()`` method giving its
    forward pass as these steps; :class:`~pflarena.algorithms.canonical.CanonicalModel` then runs
    K copies of it as one batched pass instead of K passes (PPFL, FedEM and IFCA on the
    logistic and MLP models).
    """
    steps: list[tuple[str, str | None]] = []
    for name, layer in sequence.named_children():
        if isinstance(layer, nn.Flatten) and layer.start_dim == 1 and layer.end_dim == -1:
            steps.append(("flatten", None))
        elif isinstance(layer, nn.Linear):
            steps.append(("linear", f"{prefix}.{name}"))
        elif isinstance(layer, nn.ReLU):
            steps.append(("relu", None))
        else:
            raise ValueError(f"layer {prefix}.{name} ({type(layer).__name__}) has no linear step")
    return steps


class FedAvgCNN(nn.Module):
    """The CNN of McMahan et al. (2017), "Communication-Efficient Learning ...".

    Two 5x5 convolutions (32 and 64 channels), each followed by 2x2 max pooling, then a
    512-unit fully connected layer. For 28x28 input (MNIST) the convolutions are padded
    ("same"), as in the paper; for 32x32 input (CIFAR) they are unpadded, the common PyTorch
    form (PFLlib's ``FedAvgCNN``), giving 1600 flattened features.

    With ``batch_norm`` (model ``cnn-bn``) each convolution drops its bias and is followed by
    BatchNorm, as in ResNets: the CNN-scale stand-in for a BatchNorm network such as the
    pFedGT paper's ResNet-18, whose per-client running statistics a method must handle.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, *, batch_norm: bool = False
    ) -> None:
        super().__init__()
        channels, height, width = _image_shape(input_shape, "cnn-bn" if batch_norm else "cnn")
        padding = 2 if height == 28 else 0
        self.features = nn.Sequential(
            *_conv_block(channels, 32, 5, padding, batch_norm),
            nn.MaxPool2d(2),
            *_conv_block(32, 64, 5, padding, batch_norm),
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
    uses it (docs/papers/fedpg.md §5.3): 797,962 parameters for CIFAR-10.

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


class TFCifarCNNSame(nn.Module):
    """The TensorFlow-tutorial CIFAR CNN in its "same"-padded form, as the reading of pFedSV
    takes the paper's CNN-CIFAR (docs/papers/pfedsv.md §5.5): 1,756,426 parameters for 10 classes.

    Two 5x5 convolutions with 64 channels and padding 2, each followed by ReLU and 3x3
    max pooling of stride 2 (padding 1), then fully connected layers of 384 and 192 units
    with ReLU, on 32x32 input without the tutorial's local response normalisation.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "tf-cnn-same")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            nn.Conv2d(64, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            nn.Flatten(),
        )
        flat = _flat_size(self.features, input_shape)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 384),
            nn.ReLU(),
            nn.Linear(384, 192),
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
    """A two-convolution CNN for small images such as the 8x8 ``digits`` set.

    With ``batch_norm`` (model ``small-cnn-bn``) each convolution drops its bias and is
    followed by BatchNorm: a BatchNorm model small enough for in-process tests.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, *, batch_norm: bool = False
    ) -> None:
        super().__init__()
        channels, _, _ = _image_shape(input_shape, "small-cnn-bn" if batch_norm else "small-cnn")
        self.features = nn.Sequential(
            *_conv_block(channels, 16, 3, 1, batch_norm),
            *_conv_block(16, 32, 3, 1, batch_norm),
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


class CharLSTM(nn.Module):
    """The character LSTM of LEAF's Shakespeare baseline and the FedAvg paper.

    McMahan et al. (2017, Sec. 3): each character is embedded in an 8-dimensional learned
    space, two LSTM layers process the sequence, and a softmax layer with one output per
    character reads the second layer's output at the last step. LEAF
    (``models/shakespeare/stacked_lstm.py``) uses 256 hidden units and 80-character
    windows; FedDyn's ``shakes_LSTM`` (the PAGE paper's model) uses 100. As in LEAF the
    embedding has one row per class: the classes are the vocabulary.

    Parameters
    ----------
    input_shape : tuple of int
        ``(sequence_length,)``: token ids ``0 .. num_classes - 1``.
    num_classes : int
        Vocabulary size, which is also the number of outputs.
    hidden : int
        Units per LSTM layer.
    embedding : int
        Embedding dimension.
    layers : int
        Stacked LSTM layers.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        hidden: int = 256,
        embedding: int = 8,
        layers: int = 2,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ModelError(
                f"the character LSTM needs sequences of token ids, input_shape (length,); "
                f"got {tuple(input_shape)}"
            )
        self.embedding = nn.Embedding(num_classes, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.output = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence, _ = self.lstm(self.embedding(x))
        return self.output(sequence[:, -1, :])


#: Gain of ReLU for unit-variance Gaussian input, sqrt(2 / (1 - 1/π)) (Brock et al. 2021,
#: Appendix D): scaling ReLU's output by it keeps the signal's variance at 1.
RELU_GAIN = 1.7139588594436646


def _scaled_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * RELU_GAIN


class _NFBasicBlock(nn.Module):
    """A pre-activation normalizer-free basic block (Brock et al., ICLR 2021, Eq. 3):
    ``out = α · conv2(act(conv1(β · act(x)))) + shortcut``, the shortcut a 1x1 scaled
    weight-standardised convolution of ``β · act(x)`` when the shape changes, else ``x``."""

    def __init__(self, cin: int, cout: int, stride: int, alpha: float, beta: float) -> None:
        from timm.layers import ScaledStdConv2d

        super().__init__()
        self.alpha, self.beta = alpha, beta
        self.conv1 = ScaledStdConv2d(cin, cout, 3, stride=stride, padding=1)
        self.conv2 = ScaledStdConv2d(cout, cout, 3, stride=1, padding=1)
        self.shortcut = (
            ScaledStdConv2d(cin, cout, 1, stride=stride, padding=0)
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = _scaled_relu(x) * self.beta
        shortcut = x if self.shortcut is None else self.shortcut(pre)
        return self.conv2(_scaled_relu(self.conv1(pre))) * self.alpha + shortcut


class NFResNet18Slim(nn.Module):
    """The slim CIFAR NF-ResNet-18 of the FedPG paper's CIFAR-100 runs (docs/papers/fedpg.md §5.3,
    §9.15): normalizer-free (Brock et al. 2021), so no BatchNorm statistics to aggregate and the
    full-batch gradient is the weighted mean of mini-batch gradients.

    Stem: a 3x3 scaled weight-standardised convolution to 64 channels, ReLU, 3x3 max pooling
    of stride 2; three stages of two :class:`_NFBasicBlock` of widths 16 / 32 / 64 and strides
    1 / 2 / 2 (α = 0.2, β = 1); global average pooling and a linear head. 190,468 parameters
    for 100 classes. The weight standardisation is timm's ``ScaledStdConv2d`` (per output
    channel: zero mean, unit variance scaled by fan-in^-1/2, a learnable gain, and a bias).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        *,
        widths: tuple[int, ...] = (16, 32, 64),
        strides: tuple[int, ...] = (1, 2, 2),
        blocks_per_stage: int = 2,
        alpha: float = 0.2,
        beta: float = 1.0,
    ) -> None:
        from timm.layers import ScaledStdConv2d

        super().__init__()
        channels, _, _ = _image_shape(input_shape, "nf-resnet18-slim")
        self.stem = nn.Sequential(
            ScaledStdConv2d(channels, 64, 3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        cin = 64
        for width, stride in zip(widths, strides, strict=True):
            for index in range(blocks_per_stage):
                blocks.append(_NFBasicBlock(cin, width, stride if index == 0 else 1, alpha, beta))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = _scaled_relu(self.blocks(self.stem(x)))
        return self.head(features.mean(dim=(2, 3)))


def resnet18(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    norm: str = "batch",
    cifar_stem: bool = False,
    small_stem: bool = False,
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
    small_stem
        For 64x64 input (Tiny-ImageNet): a 3x3 stride-1 convolution followed by
        torchvision's max pooling, so the residual stages see 32x32 maps as the CIFAR
        form does at 32x32 and end at 4x4 (the ImageNet stem ends at 2x2, the CIFAR stem
        at 8x8 for four times the compute).
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
    if cifar_stem and small_stem:
        raise ModelError("resnet18: choose cifar_stem or small_stem, not both")
    model = tv_resnet18(weights=None, num_classes=num_classes, norm_layer=norm_layer)
    if cifar_stem or small_stem or channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    if cifar_stem:
        model.maxpool = nn.Identity()
    return model


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "logreg": LogisticRegression,
    "mlp": MLP,
    # one hidden layer of 128 units: the MNIST model of FedEM (Marfoq et al. 2021) and PPFL
    "mlp-128": lambda shape, classes: MLP(shape, classes, hidden=(128,)),
    "cnn": FedAvgCNN,
    "cnn-bn": lambda shape, classes: FedAvgCNN(shape, classes, batch_norm=True),
    "cnn-pfllib": PFLlibCNN,
    "small-cnn": SmallCNN,
    "tf-cnn": TFCifarCNN,
    "tf-cnn-same": TFCifarCNNSame,
    "small-cnn-bn": lambda shape, classes: SmallCNN(shape, classes, batch_norm=True),
    "lenet5": LeNet5,
    "harcnn": HARCNN,
    "resnet18": resnet18,
    "nf-resnet18-slim": NFResNet18Slim,
    "resnet18-gn": lambda shape, classes: resnet18(shape, classes, norm="group"),
    "resnet18-cifar": lambda shape, classes: resnet18(shape, classes, cifar_stem=True),
    "resnet18-cifar-gn": lambda shape, classes: resnet18(
        shape, classes, norm="group", cifar_stem=True
    ),
    "resnet18-64": lambda shape, classes: resnet18(shape, classes, small_stem=True),
    "resnet18-64-gn": lambda shape, classes: resnet18(
        shape, classes, norm="group", small_stem=True
    ),
    "char-lstm": CharLSTM,
    "char-lstm-100": lambda shape, classes: CharLSTM(shape, classes, hidden=100),
}

if tuple(_BUILDERS) != MODEL_NAMES:  # the names the run config is checked against
    raise ImportError(
        "pflarena.core.model_names.MODEL_NAMES must list the models of core/models.py, "
        f"in order: {', '.join(_BUILDERS)}"
    )


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


def _conv_block(
    in_channels: int, out_channels: int, kernel_size: int, padding: int, batch_norm: bool
) -> list[nn.Module]:
    """Convolution and ReLU, with BatchNorm between them (and no conv bias) if asked."""
    conv = nn.Conv2d(
        in_channels, out_channels, kernel_size=kernel_size, padding=padding, bias=not batch_norm
    )
    return [conv, nn.BatchNorm2d(out_channels), nn.ReLU()] if batch_norm else [conv, nn.ReLU()]


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
