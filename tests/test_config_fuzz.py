"""Property-based tests of the run config and the CLI: every invalid input ends in an error
that names the key, never a traceback, and every valid config round-trips."""

from __future__ import annotations

import contextlib
import io
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pflarena.cli import main
from pflarena.cli.methods import flower_config
from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.methods import TRAINING_SETTINGS
from pflarena.server.build import parse_config
from pflarena.strategies import declarations

KNOWN = list(flower_config())
values = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.booleans(),
)
keys_ = st.one_of(st.sampled_from(KNOWN), st.text(min_size=1, max_size=20))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys_, values, max_size=5))
def test_any_mapping_is_a_config_or_an_error_naming_a_key(mapping):
    try:
        cfg = parse_config(mapping)
    except ConfigError as exc:
        text = str(exc)
        assert text.startswith("invalid run config:")
        # every problem line names one of the given keys (or the strategy they belong to)
        named = [*mapping, "strategy"]
        assert any(k in text or repr(k) in text for k in named), text
        return
    assert isinstance(cfg, RunConfig)
    for value in mapping.values():
        if isinstance(value, float):
            assert math.isfinite(value)  # NaN and infinity never get through


def _valid_value(key: str, default):
    if isinstance(default, bool):
        return st.booleans()
    if key in ("num-clients", "num-rounds", "local-epochs", "batch-size", "eval-every"):
        return st.integers(1, 1000)
    if key in ("lr", "alpha", "round-timeout"):
        return st.floats(1e-4, 10.0)
    if key in ("fraction-train",):
        return st.floats(0.0, 1.0)
    if key == "seed":
        return st.integers(0, 2**31)
    return st.just(default)


@st.composite
def valid_configs(draw):
    strategy = draw(st.sampled_from(sorted(declarations())))
    common = {
        k: draw(_valid_value(k, v))
        for k, v in flower_config().items()
        if "." not in k and k != "strategy"
    }
    return {**common, "strategy": strategy}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_configs())
def test_valid_configs_round_trip(mapping):
    # what the method needs and the training settings it honours (the rest stay default)
    declaration = declarations()[mapping["strategy"]]
    if declaration.needs_validation and mapping["validation-fraction"] == 0:
        mapping["validation-fraction"] = 0.2
    if declaration.needs_server_data and mapping["server-fraction"] == 0:
        mapping["server-fraction"] = 0.1
    defaults = flower_config()
    mapping |= {k: defaults[k] for k in TRAINING_SETTINGS if k not in declaration.honours}
    cfg = parse_config(mapping)
    again = parse_config(cfg.to_run_config())
    assert again == cfg and again.to_run_config() == cfg.to_run_config()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(KNOWN + ["nope", "ditto.nope"]), st.text(max_size=8)), max_size=4
    )
)
def test_the_cli_answers_any_setting_with_an_error_or_the_resolved_config(settings_):
    argv = ["run", "--check", "--output-dir", "/tmp/pflarena-fuzz"]
    for key, value in settings_:
        argv += ["--set", f"{key}={value}"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert "Traceback" not in err.getvalue()
    if code == 0:
        assert "strategy = " in out.getvalue()
    else:
        assert code == 2 and err.getvalue().startswith("pflarena run: error:"), err.getvalue()
