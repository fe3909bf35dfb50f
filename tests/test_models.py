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
    ("cnn-bn", "mnist"),
    ("cnn-bn", "cifar"),
    ("small-cnn", "digits"),
    ("small-cnn-bn", "digits"),
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
