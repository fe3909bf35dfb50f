import pytest
import torch

from pflarena.core.datasets import dataset_info
from pflarena.core.models import (
    MODEL_NAMES,
    TOKEN_MODELS,
    ModelError,
    build_model,
    check_model_fits,
)

SHAPES = {
    "mnist": ((1, 28, 28), 10),
    "cifar": ((3, 32, 32), 10),
    "digits": ((1, 8, 8), 10),
    "vector": ((30,), 30),
    "har": ((9, 1, 128), 6),
    "tiny": ((3, 64, 64), 200),
    "chars": ((80,), 80),
}

CASES = [
    ("nf-resnet18-slim", "cifar"),
    ("logreg", "vector"),
    ("logreg", "digits"),
    ("mlp", "vector"),
    ("mlp", "mnist"),
    ("mlp-128", "mnist"),
    ("cnn", "mnist"),
    ("cnn", "cifar"),
    ("cnn-bn", "mnist"),
    ("cnn-bn", "cifar"),
    ("cnn-pfllib", "mnist"),
    ("small-cnn", "digits"),
    ("tf-cnn", "cifar"),
    ("tf-cnn", "mnist"),
    ("tf-cnn-same", "cifar"),
    ("small-cnn-bn", "digits"),
    ("lenet5", "mnist"),
    ("lenet5", "cifar"),
    ("harcnn", "har"),
    ("resnet18", "cifar"),
    ("resnet18-gn", "cifar"),
    ("resnet18-cifar", "cifar"),
    ("resnet18-cifar-gn", "cifar"),
    ("resnet18-64", "tiny"),
    ("resnet18-64-gn", "tiny"),
    ("char-lstm", "chars"),
    ("char-lstm-100", "chars"),
]


def test_every_model_is_covered():
    assert {name for name, _ in CASES} == set(MODEL_NAMES)


@pytest.mark.parametrize("name,data", CASES)
def test_forward_shape_and_backward(name, data):
    shape, classes = SHAPES[data]
    model = build_model(name, shape, classes, seed=0)
    x = torch.randint(0, classes, (3, *shape)) if name in TOKEN_MODELS else torch.randn(3, *shape)
    out = model(x)
    assert out.shape == (3, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_parameter_counts_match_the_papers():
    # FedAvg CNN on MNIST: 1,663,370 parameters (McMahan et al. 2017 report "1,663,370").
    assert sum(p.numel() for p in build_model("cnn", (1, 28, 28), 10).parameters()) == 1_663_370
    # docs/papers/pfedgt.md §5.4: HAR CNN d = 2,253,958; ResNet-18 (ImageNet stem) d = 11,181,642.
    assert sum(p.numel() for p in build_model("harcnn", (9, 1, 128), 6).parameters()) == 2_253_958
    assert (
        sum(p.numel() for p in build_model("resnet18", (3, 32, 32), 10).parameters()) == 11_181_642
    )
    # docs/papers/fedpg.md §5.3: the TensorFlow-tutorial CIFAR-10 CNN has 797,962 parameters.
    assert sum(p.numel() for p in build_model("tf-cnn", (3, 32, 32), 10).parameters()) == 797_962
    # docs/papers/pfedsv.md §5.5: its "same"-padded reading has 1,756,426 (10) / 1,773,796 (100).
    same = build_model("tf-cnn-same", (3, 32, 32), 10)
    assert sum(p.numel() for p in same.parameters()) == 1_756_426
    same = build_model("tf-cnn-same", (3, 32, 32), 100)
    assert sum(p.numel() for p in same.parameters()) == 1_773_796


def _count(name: str, data: str) -> int:
    shape, classes = SHAPES[data]
    return sum(p.numel() for p in build_model(name, shape, classes).parameters())


def test_batchnorm_variants_count_and_buffers():
    """``cnn-bn``/``small-cnn-bn``: each convolution loses its bias (out channels) and gains a
    BatchNorm scale and shift (2 x out channels); the rest is the plain model, counted by hand."""
    # FedAvg CNN, CIFAR form: conv 3->32 (5x5) 2,432; conv 32->64 (5x5) 51,264;
    # linear 1600->512 819,712; linear 512->10 5,130.
    assert _count("cnn", "cifar") == 2_432 + 51_264 + 819_712 + 5_130
    assert _count("cnn-bn", "cifar") == _count("cnn", "cifar") + (32 + 64)
    assert _count("cnn-bn", "mnist") == 1_663_370 + (32 + 64)
    # small CNN on 8x8 digits: conv 1->16 (3x3) 160; conv 16->32 (3x3) 4,640;
    # linear 512->64 32,832; linear 64->10 650.
    assert _count("small-cnn", "digits") == 160 + 4_640 + 32_832 + 650
    assert _count("small-cnn-bn", "digits") == _count("small-cnn", "digits") + (16 + 32)
    for name, data in (("cnn-bn", "cifar"), ("small-cnn-bn", "digits")):
        shape, classes = SHAPES[data]
        model = build_model(name, shape, classes)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        assert len(norms) == 2
        buffers = dict(model.named_buffers())
        assert len(buffers) == 6 and all(
            any(key.endswith(suffix) for key in buffers)
            for suffix in ("running_mean", "running_var", "num_batches_tracked")
        )
    for name in ("cnn", "small-cnn"):
        shape, classes = SHAPES["digits" if name == "small-cnn" else "cifar"]
        assert not any(
            isinstance(m, torch.nn.BatchNorm2d) for m in build_model(name, shape, classes).modules()
        )


def test_seed_makes_init_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("mlp", (30,), 30, seed=5)
    after = torch.rand(1)
    b = build_model("mlp", (30,), 30, seed=5)
    c = build_model("mlp", (30,), 30, seed=6)
    assert torch.equal(before, after)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not all(
        torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True)
    )


def test_group_norm_variant_has_no_batchnorm():
    model = build_model("resnet18-gn", (3, 32, 32), 10)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())


def test_errors_name_the_problem():
    with pytest.raises(ModelError, match="unknown model"):
        build_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ModelError, match="image-shaped"):
        build_model("cnn", (30,), 10)


def _lstm_reference(model, ids: torch.Tensor) -> torch.Tensor:
    """The character LSTM's logits by the literal LSTM equations (Hochreiter and
    Schmidhuber 1997, with a forget gate), written out with the model's own weights."""
    x = model.embedding.weight[ids]  # (batch, steps, embedding)
    for layer in range(model.lstm.num_layers):
        w_ih = getattr(model.lstm, f"weight_ih_l{layer}")
        w_hh = getattr(model.lstm, f"weight_hh_l{layer}")
        bias = getattr(model.lstm, f"bias_ih_l{layer}") + getattr(model.lstm, f"bias_hh_l{layer}")
        hidden = w_hh.shape[1]
        h = torch.zeros(x.shape[0], hidden, dtype=torch.float64)
        c = torch.zeros(x.shape[0], hidden, dtype=torch.float64)
        outputs = []
        for step in range(x.shape[1]):
            gates = x[:, step] @ w_ih.T + h @ w_hh.T + bias
            i, f, g, o = gates.split(
                hidden, dim=1
            )  # torch's gate order: input, forget, cell, output
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        x = torch.stack(outputs, dim=1)
    return x[:, -1] @ model.output.weight.T + model.output.bias


@pytest.mark.parametrize("name,hidden", [("char-lstm", 256), ("char-lstm-100", 100)])
def test_character_lstm_is_the_papers_model(name, hidden):
    # LEAF / FedAvg: 8-dimensional embedding of the 80 characters, two LSTM layers of 256
    # units (FedDyn and PAGE: 100), a dense layer on the last step's output.
    model = build_model(name, (80,), 80, seed=0).double()
    assert model.embedding.weight.shape == (80, 8)
    assert model.lstm.num_layers == 2 and model.lstm.hidden_size == hidden
    assert model.output.weight.shape == (80, hidden)
    ids = torch.randint(0, 80, (4, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(ids), _lstm_reference(model, ids), atol=1e-10)
    # torch keeps two bias vectors per layer where LEAF's TensorFlow cell keeps one.
    lstm = sum(4 * hidden * (width + hidden) + 8 * hidden for width in (8, hidden))
    assert sum(p.numel() for p in model.parameters()) == 80 * 8 + lstm + hidden * 80 + 80


def test_character_lstm_reads_only_the_last_window_step_for_its_output():
    model = build_model("char-lstm-100", (80,), 80, seed=0)
    ids = torch.randint(0, 80, (2, 80), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 80
    with torch.no_grad():
        assert not torch.allclose(model(ids), model(changed))


def _layer4_side(model, side: int) -> int:
    shapes = []
    model.layer4.register_forward_hook(lambda _m, _i, out: shapes.append(out.shape))
    model(torch.zeros(1, 3, side, side))
    return shapes[0][-1]


def test_resnet18_64_ends_at_4x4_maps_on_64x64_input():
    # Its stem (3x3 stride 1, then max pooling) sends 32x32 maps into the residual stages
    # as the CIFAR form does at 32x32; the ImageNet stem ends at 2x2, the CIFAR stem at 8x8.
    assert _layer4_side(build_model("resnet18-64", (3, 64, 64), 200), 64) == 4
    assert _layer4_side(build_model("resnet18", (3, 64, 64), 200), 64) == 2
    assert _layer4_side(build_model("resnet18-cifar", (3, 64, 64), 200), 64) == 8
    assert _layer4_side(build_model("resnet18-cifar", (3, 32, 32), 200), 32) == 4
    assert not any(
        isinstance(m, torch.nn.BatchNorm2d)
        for m in build_model("resnet18-64-gn", (3, 64, 64), 200).modules()
    )


def test_token_models_and_token_data_go_together():
    shakespeare, cifar = dataset_info("shakespeare"), dataset_info("cifar10")
    check_model_fits("char-lstm", shakespeare)
    check_model_fits("cnn", cifar)
    with pytest.raises(ModelError, match="reads token ids"):
        check_model_fits("char-lstm", cifar)
    with pytest.raises(ModelError, match="holds token ids"):
        check_model_fits("mlp", shakespeare)
    with pytest.raises(ModelError, match="unknown model"):
        check_model_fits("vgg", cifar)


def test_pfllib_cnn_is_the_unpadded_fedavg_cnn():
    """PFLlib's FedAvgCNN against the padded original, counted layer by layer by hand."""

    def count(name, shape):
        return sum(p.numel() for p in build_model(name, shape, 10).parameters())

    conv1, conv2, head = 1 * 32 * 25 + 32, 32 * 64 * 25 + 64, 512 * 10 + 10
    # 28 -> 24 -> 12 -> 8 -> 4 unpadded: 64 * 4 * 4 = 1,024 features (PFLlib's dim=1024);
    # 28 -> 14 -> 7 padded: 64 * 7 * 7 = 3,136.
    assert count("cnn-pfllib", (1, 28, 28)) == conv1 + conv2 + (1024 * 512 + 512) + head == 582_026
    assert count("cnn", (1, 28, 28)) == conv1 + conv2 + (3136 * 512 + 512) + head == 1_663_370
    model = build_model("cnn-pfllib", (1, 28, 28), 10)
    assert model.features(torch.zeros(2, 1, 28, 28)).shape == (2, 1024)
    # On 32x32 input the FedAvg CNN is already unpadded: both names build the same shapes.
    cifar = [p.shape for p in build_model("cnn-pfllib", (3, 32, 32), 10).parameters()]
    assert cifar == [p.shape for p in build_model("cnn", (3, 32, 32), 10).parameters()]


def test_slim_nf_resnet18_is_fedpgs_cifar100_model():
    """docs/papers/fedpg.md §5.3: the slim NF-ResNet-18, counted layer by layer by hand, with no
    buffers (no normalization statistics), and its convolutions weight-standardised."""

    def conv(cin, cout, k):  # weight, bias, gain
        return cin * cout * k * k + cout + cout

    blocks = (
        conv(64, 16, 3) + conv(16, 16, 3) + conv(64, 16, 1) + 2 * conv(16, 16, 3)
        + conv(16, 32, 3) + conv(32, 32, 3) + conv(16, 32, 1) + 2 * conv(32, 32, 3)
        + conv(32, 64, 3) + conv(64, 64, 3) + conv(32, 64, 1) + 2 * conv(64, 64, 3)
    )  # fmt: skip
    expected = conv(3, 64, 3) + blocks + 64 * 100 + 100
    model = build_model("nf-resnet18-slim", (3, 32, 32), 100, seed=0)
    assert sum(p.numel() for p in model.parameters()) == expected == 190_468
    assert not list(model.buffers())
    # the stem's convolution against its weights standardised by hand: per output channel
    # zero mean, unit (biased) variance, times gain / sqrt(fan-in)
    stem = model.stem[0]
    with torch.no_grad():
        stem.gain.uniform_(0.5, 1.5)
        w = stem.weight.double().flatten(1)
        fan_in = w.shape[1]
        variance = w.var(1, unbiased=False, keepdim=True) + stem.eps  # timm's ε = 1e-6
        w_hat = (w - w.mean(1, keepdim=True)) / torch.sqrt(variance)
        w_hat = w_hat * stem.gain.double().flatten(1) / fan_in**0.5
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        expected_out = torch.nn.functional.conv2d(
            x, w_hat.view_as(stem.weight), stem.bias.double(), padding=1
        )
        assert torch.allclose(stem(x.float()).double(), expected_out, atol=1e-4)
    # the residual branch is scaled by α = 0.2: with its convolutions zeroed, a block whose
    # shape does not change is the identity
    block = model.blocks[1]
    with torch.no_grad():
        block.conv2.weight.zero_()
        block.conv2.bias.zero_()
        block.conv2.gain.zero_()
        x = torch.randn(2, 16, 16, 16)
        assert torch.allclose(block(x), x)
    assert model(torch.zeros(4, 3, 32, 32)).shape == (4, 100)
