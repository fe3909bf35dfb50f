import pytest
import torch

from pflarena.core.models import MODEL_NAMES, ModelError, build_model

SHAPES = {
    "mnist": ((1, 28, 28), 10),
    "cifar": ((3, 32, 32), 10),
    "digits": ((1, 8, 8), 10),
    "vector": ((30,), 30),
    "har": ((9, 1, 128), 6),
}

CASES = [
    ("logreg", "vector"),
    ("logreg", "digits"),
    ("mlp", "vector"),
    ("mlp", "mnist"),
    ("cnn", "mnist"),
    ("cnn", "cifar"),
    ("cnn-pfllib", "mnist"),
    ("small-cnn", "digits"),
    ("tf-cnn", "cifar"),
    ("tf-cnn", "mnist"),
    ("lenet5", "mnist"),
    ("lenet5", "cifar"),
    ("harcnn", "har"),
    ("resnet18", "cifar"),
    ("resnet18-gn", "cifar"),
    ("resnet18-cifar", "cifar"),
    ("resnet18-cifar-gn", "cifar"),
]


def test_every_model_is_covered():
    assert {name for name, _ in CASES} == set(MODEL_NAMES)


@pytest.mark.parametrize("name,data", CASES)
def test_forward_shape_and_backward(name, data):
    shape, classes = SHAPES[data]
    model = build_model(name, shape, classes, seed=0)
    x = torch.randn(3, *shape)
    out = model(x)
    assert out.shape == (3, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_parameter_counts_match_the_papers():
    # FedAvg CNN on MNIST: 1,663,370 parameters (McMahan et al. 2017 report "1,663,370").
    assert sum(p.numel() for p in build_model("cnn", (1, 28, 28), 10).parameters()) == 1_663_370
    # pFedGT spec: HAR CNN d = 2,253,958; ResNet-18 (ImageNet stem) d = 11,181,642.
    assert sum(p.numel() for p in build_model("harcnn", (9, 1, 128), 6).parameters()) == 2_253_958
    assert (
        sum(p.numel() for p in build_model("resnet18", (3, 32, 32), 10).parameters()) == 11_181_642
    )
    # FedPG spec §5.3: the TensorFlow-tutorial CIFAR-10 CNN has 797,962 parameters.
    assert sum(p.numel() for p in build_model("tf-cnn", (3, 32, 32), 10).parameters()) == 797_962


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
