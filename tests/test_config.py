from pathlib import Path

import pytest
import tomllib

from pflarena.cli.methods import flower_config
from pflarena.core.config import ConfigError
from pflarena.server.build import parse_config
from pflarena.strategies import declarations

ROOT = Path(__file__).resolve().parents[1]
STRATEGY_NAMES = list(declarations())


def _flatten(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        flat |= (
            _flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
        )
    return flat


def test_pyproject_defaults_match_the_declarations():
    """Every key flwr run may pass exists in the validator with the same default, and back.

    Flower flattens the method sub-tables to ``<method>.<param>`` keys the same way.
    """
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert _flatten(table) == flower_config()
    assert parse_config(_flatten(table)).to_run_config() == _flatten(table)


def test_defaults_parse():
    cfg = parse_config({})
    assert cfg.strategy == "fedavg" and cfg.num_clients == 10


def test_hyphenated_keys_and_coercion():
    cfg = parse_config({"num-clients": 7, "lr": 1, "strategy": "ditto"})
    assert cfg.num_clients == 7 and cfg.lr == 1.0 and cfg.strategy == "ditto"


def test_unknown_key_is_named_with_allowed_keys():
    with pytest.raises(ConfigError) as err:
        parse_config({"num-client": 5})
    text = str(err.value)
    assert "num-client" in text and "num-clients" in text


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError) as err:
        parse_config({"num-rounds": "many"})
    assert "num-rounds" in str(err.value) and "many" in str(err.value)


@pytest.mark.parametrize(
    "key,value",
    [
        ("fraction-train", -0.1),
        ("fraction-train", 1.5),
        ("lr", -0.1),
        ("test-fraction", 1.0),
        ("num-clients", 0),
        ("momentum", 1.0),
        ("alpha", 0.0),
    ],
)
def test_out_of_range_values_are_rejected(key, value):
    with pytest.raises(ConfigError, match=key):
        parse_config({key: value})


def test_unknown_strategy_lists_allowed():
    with pytest.raises(ConfigError) as err:
        parse_config({"strategy": "fedsomething"})
    assert all(name in str(err.value) for name in STRATEGY_NAMES)


def test_unknown_dataset_and_model_are_rejected():
    with pytest.raises(ConfigError, match="dataset"):
        parse_config({"dataset": "imagenet-22k"})
    with pytest.raises(ConfigError, match="model"):
        parse_config({"model": "gpt"})


def test_several_errors_reported_together():
    with pytest.raises(ConfigError) as err:
        parse_config({"lr": -1, "num-rounds": 0})
    assert "lr" in str(err.value) and "num-rounds" in str(err.value)


def test_model_default_per_dataset():
    assert parse_config({"dataset": "digits"}).model_name() == "mlp"
    assert parse_config({"dataset": "digits", "model": "small-cnn"}).model_name() == "small-cnn"
