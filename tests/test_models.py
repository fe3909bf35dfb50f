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
    ("mlp-128", "mnist"),
    ("cnn", "mnist"),
    ("cnn", "cifar"),
    ("small-cnn", "digits"),
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
