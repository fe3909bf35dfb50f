"""Method declarations: one place per method, plug-ins, several exchanges per round."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord
from helpers import config, grid_for, run_local

from pflarena.cli import methods as catalog
from pflarena.client.solvers import SolverError, load_solver
from pflarena.core import keys
from pflarena.core.config import ConfigError, parse_run_config
from pflarena.core.presets import load_preset, preset_names
from pflarena.methods.pfedgt import keys as pfedgt_keys
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.strategies import builtin_strategies, declarations, strategy_classes
from pflarena.strategies.exchange import direct_send

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
PLUGIN = "pflarena_test_methods"


def _load_plugins(patch: pytest.MonkeyPatch) -> None:
    """Name the test suite's methods to pflarena (and to every process it starts) the way a
    user's plug-in would be named."""
    patch.setenv("PFLARENA_PLUGINS", PLUGIN)
    patch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def plugins(monkeypatch):
    """The test suite's own methods, loaded the way a user's plug-in would be."""
    _load_plugins(monkeypatch)


# --------------------------------------------------------------------------- one place
def test_strategies_solvers_and_declarations_are_the_same_set():
    declared = declarations()
    assert (
        set(declared)
        == set(strategy_classes())
        == {c.declaration.name for c in builtin_strategies()}
    )
    named_solvers = {d.solver for d in declared.values()}
    for module in named_solvers:
        solver = load_solver(module)
        assert callable(solver.train) and callable(solver.evaluate)
    on_disk = {
        f"pflarena.methods.{path.parent.name}.solver"
        for path in (ROOT / "pflarena" / "methods").glob("*/solver.py")
    }
    assert on_disk == named_solvers, "every solver module serves a declared method"


def test_every_default_is_written_once():
    """pyproject's table and docs/methods.md are generated from the declarations."""
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("[tool.flwr.app.config]")
    end = text.index("# ----", start)
    assert text[start:end].strip() == catalog.flower_config_toml().strip(), (
        "run `pflarena methods --flower-config` and paste it into pyproject.toml"
    )
    assert (ROOT / "docs" / "methods.md").read_text() == catalog.methods_markdown(), (
        "run `pflarena methods --markdown > docs/methods.md`"
    )


def test_every_method_page_holds_its_generated_block():
    """docs/methods/<name>.md exists for every declared method, its generated block is the
    declaration's (``make generated``), and its hand-written part is written (no stub)."""
    pages = catalog.method_pages(ROOT)  # raises on a page without its markers
    missing = [n for n in pages if not (ROOT / catalog.method_page(n)).is_file()]
    assert not missing, f"methods without a page (run `make generated`, then write it): {missing}"
    stale = [n for n, text in pages.items() if (ROOT / catalog.method_page(n)).read_text() != text]
    assert not stale, f"pages whose generated block is out of date (run `make generated`): {stale}"
    stubs = [n for n, text in pages.items() if catalog.PAGE_STUB in text]
    assert not stubs, f"pages whose hand-written part is still the stub: {stubs}"


def test_every_method_page_belongs_to_a_method():
    on_disk = {path.stem for path in (ROOT / "docs" / "methods").glob("*.md")}
    declared = {cls.declaration.name for cls in builtin_strategies()}
    assert on_disk - declared == set(), "pages of no declared method"
    assert declared - on_disk == set(), "declared methods without a page"


def test_strategy_and_solver_docstrings_link_the_method_page():
    missing = []
    for cls in builtin_strategies():
        d = cls.declaration
        page = catalog.method_page(d.name)
        for module_name in (cls.__module__, d.solver):
            if page not in (importlib.import_module(module_name).__doc__ or ""):
                missing.append(f"{module_name}: {page}")
    assert not missing, "module docstrings without their method's page:\n" + "\n".join(missing)


def test_a_page_without_markers_is_refused(tmp_path):
    pages = tmp_path / "docs" / "methods"
    pages.mkdir(parents=True)
    (pages / "fedavg.md").write_text("# FedAvg\n\nno generated block\n")
    with pytest.raises(ValueError, match=r"fedavg\.md: no generated block"):
        catalog.method_pages(tmp_path)


def test_the_generator_rewrites_only_the_block_and_stubs_missing_pages(tmp_path):
    pages = tmp_path / "docs" / "methods"
    pages.mkdir(parents=True)
    page = pages / "ditto.md"
    page.write_text(f"# Ditto\n\n{catalog.PAGE_BEGIN}\nold\n{catalog.PAGE_END}\n\nmine\n")
    catalog.write_method_pages(tmp_path)
    text = page.read_text()
    assert text == f"# Ditto\n\n{catalog.method_page_block('ditto')}\n\nmine\n"
    assert "`ditto.lambda`" in text and "`pflarena.methods.ditto.solver`" in text
    created = {path.stem for path in pages.glob("*.md")}
    assert created == set(catalog.declarations())
    assert catalog.PAGE_STUB in (pages / "fedavg.md").read_text()
    assert catalog.method_pages(tmp_path)["fedavg"] == (pages / "fedavg.md").read_text()


def test_declarations_are_checked():
    from pflarena.core.methods import MethodDeclaration

    with pytest.raises(ValueError, match="unknown settings"):
        MethodDeclaration("x", "baseline", "r", "s", "m", honours=frozenset({"nesterov"}))
    with pytest.raises(ValueError, match="default_fraction_train"):
        MethodDeclaration("x", "baseline", "r", "s", "m", default_fraction_train=0.0)


# --------------------------------------------------------------------------- validation
def test_method_parameters_are_namespaced_and_validated():
    cfg = parse_config({"strategy": "ditto", "ditto.lambda": 0.5})
    assert build_strategy(cfg).params.lambda_ == 0.5
    with pytest.raises(ConfigError, match=r"ditto\.lambda.*greater than or equal to 0"):
        parse_config({"strategy": "ditto", "ditto.lambda": -1})
    with pytest.raises(ConfigError, match=r"ditto\.lamda.*did you mean ditto\.lambda"):
        parse_config({"strategy": "ditto", "ditto.lamda": 1})
    with pytest.raises(ConfigError, match="no method 'dito'"):
        parse_config({"dito.lambda": 1})
    with pytest.raises(ConfigError, match=r"ditto-lambda.*it is now ditto\.lambda"):
        parse_config({"ditto-lambda": 1})


def test_parameters_of_another_method_are_refused():
    with pytest.raises(ConfigError, match="ditto parameters would be ignored"):
        parse_config({"strategy": "fedavg", "ditto.lambda": 0.5})
    # at their defaults (what flwr run passes for every method) they are fine
    parse_config({"strategy": "fedavg", "ditto.lambda": 0.1, "pfedgt.gamma": 0.8})


def test_training_settings_a_method_ignores_are_refused():
    with pytest.raises(ConfigError, match=r"momentum=0.9 set, but pfedgt's local solver"):
        parse_config({"strategy": "pfedgt", "momentum": 0.9})
    with pytest.raises(ConfigError, match="weight-decay"):
        parse_config({"strategy": "pfedgt", "weight-decay": 1e-4})
    assert parse_config({"strategy": "ditto", "momentum": 0.9}).momentum == 0.9


def test_run_level_rules_of_a_method_are_checked_before_anything_starts():
    with pytest.raises(ConfigError, match="pfedgt.gammas has 2 values but num-clients is 3"):
        parse_config({"strategy": "pfedgt", "num-clients": 3, "pfedgt.gammas": "0.5,0.5"})


def test_a_client_keeps_method_keys_unchecked():
    cfg = parse_run_config({"strategy": "anything", "ditto.lambda": -5})
    assert cfg.method_values() == {"ditto.lambda": -5}
    assert cfg.to_run_config()["ditto.lambda"] == -5


def test_solvers_outside_the_package_need_the_plugin_list(monkeypatch):
    monkeypatch.delenv("PFLARENA_PLUGINS", raising=False)
    with pytest.raises(SolverError, match="PFLARENA_PLUGINS"):
        load_solver("os")


# --------------------------------------------------------------------------- catalog / CLI
def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "pflarena.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_methods_command_lists_every_method_and_one_methods_parameters():
    table = _cli("methods")
    assert table.returncode == 0, table.stderr
    for name, declaration in declarations().items():
        assert f"| {name} |" in table.stdout and declaration.reference in table.stdout
    assert "| pfedgt | seed paper | yes | 1 |" in table.stdout
    assert "| fedpg | seed paper | yes | 0.1 |" in table.stdout
    assert "| local | baseline | no | 1 |" in table.stdout
    one = _cli("methods", "pfedgt")
    assert one.returncode == 0
    assert "`pfedgt.lambda` | `0.7` | float" in one.stdout
    assert "honoured: local-epochs, batch-size, lr" in one.stdout
    assert _cli("methods", "nope").returncode == 1


def test_run_help_has_a_flag_for_every_method_parameter():
    help_text = _cli("run", "--help-all").stdout  # `--help` lists the common flags only
    for declaration in declarations().values():
        for key, *_ in declaration.param_docs():
            assert f"--{key}" in help_text


def test_presets_parse_for_every_strategy_they_compare():
    assert {"digits-main", "pfedgt-cifar10-a0.1"} <= set(preset_names())
    for name in preset_names():
        preset = load_preset(name)
        assert preset.description and preset.strategies
        for strategy in preset.strategies:
            cfg = parse_config(preset.overrides(strategy) | {"strategy": strategy})
            assert cfg.strategy == strategy
    main = parse_config(load_preset("digits-main").overrides("ditto") | {"strategy": "ditto"})
    assert (main.alpha, main.num_clients, main.num_rounds, main.fraction_train) == (
        0.1,
        10,
        20,
        1.0,
    )


def test_unknown_preset_is_named():
    result = _cli("run", "--preset", "nope")
    assert result.returncode == 2 and "unknown preset 'nope'" in result.stderr


# --------------------------------------------------------------------------- plug-ins
def test_a_plugin_method_appears_validates_and_learns(plugins, tmp_path):
    assert "toy-avg" in declarations()
    assert "| toy-avg | plugin |" in catalog.methods_table()
    assert "`toy-avg.server-step` | `1.0`" in catalog.method_details("toy-avg")
    with pytest.raises(ConfigError, match=r"toy-avg\.server-step"):
        parse_config({"strategy": "toy-avg", "toy-avg.server-step": 2.0})
    cfg = config(strategy="toy-avg", num_rounds=3, **{"toy-avg.server-step": 0.5})
    outcome = run_local(cfg, tmp_path)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.2


# --------------------------------------------------------------------------- exchanges
def test_two_exchanges_per_round_are_recorded_separately(plugins, tmp_path):
    cfg = config(strategy="line-search", num_rounds=3, fraction_train=0.6, local_epochs=2)
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    arrays = outcome.arrays
    model_bytes = sum(len(a.data) for a in arrays.values())
    trainable_bytes = model_bytes  # the MLP has no buffers
    for record in outcome.rounds[1:]:
        first, second = record["exchanges"]
        sampled = len(record["train"]["sampled"])
        assert (first["name"], second["name"]) == ("gradients", "line-search")
        assert first["sent"] == second["sent"] == sampled == 3
        assert first["bytes_down"] == sampled * model_bytes
        assert first["bytes_up"] == sampled * trainable_bytes
        assert second["bytes_down"] == sampled * (model_bytes + trainable_bytes)
        losses_bytes = len(Array(np.zeros(len(strategy.steps))).data)  # .npy, header included
        assert second["bytes_up"] == sampled * losses_bytes
        assert record["bytes_down"] == first["bytes_down"] + second["bytes_down"]
        assert record["train"]["server"]["step"] in strategy.steps
    losses = [r["train"]["loss"] for r in outcome.rounds[1:]]
    assert losses[-1] < losses[0]


def test_a_failure_in_the_second_exchange_is_charged_to_it(plugins, tmp_path):
    cfg = config(strategy="line-search", num_rounds=1, fraction_train=1.0, local_epochs=2)
    grid = grid_for(cfg)

    def drop_losses(reply):
        if (
            "losses" in reply.content.array_records
            and reply.metadata.src_node_id == grid.node_ids[1]
        ):
            del reply.content["losses"]
        return reply

    grid.reply_filter = drop_losses
    record = run_local(cfg, tmp_path, grid=grid).rounds[1]
    assert [e["failures"] for e in record["exchanges"]] == [0, 1]
    assert record["train"]["failures"] == 1 and record["train"]["clients"] == 4


def test_pfedgt_c0_is_the_first_rounds_init_exchange(tmp_path):
    cfg = config(strategy="pfedgt", num_rounds=2, fraction_train=0.4)
    outcome = run_local(cfg, tmp_path)
    first, second = outcome.rounds[1], outcome.rounds[2]
    assert [e["name"] for e in first["exchanges"]] == ["init", "train"]
    assert first["exchanges"][0]["sent"] == cfg.num_clients  # full participation
    assert [e["name"] for e in second["exchanges"]] == ["train"]
    assert outcome.rounds[0]["bytes_down"] == 0


# --------------------------------------------------------------------------- simulation
PLUGIN_SIMULATED = ("toy-avg", "line-search")


@pytest.fixture(scope="module")
def plugin_runs(tmp_path_factory):
    """Both plug-in methods in one simulation process (the default engine: plug-ins loaded
    in the parent, inherited by the forked workers),
    with the plug-ins named to the ServerApp and every ClientApp through the environment."""
    from pflarena.runtime.launch import run_simulations

    root = tmp_path_factory.mktemp("plugin-runs")
    with pytest.MonkeyPatch.context() as patch:
        _load_plugins(patch)
        configs = {
            strategy: parse_config(
                {
                    "strategy": strategy,
                    "num-clients": 4,
                    "num-rounds": 3,
                    "fraction-train": 1.0,
                    "output-dir": str(root / strategy),
                }
            )
            for strategy in PLUGIN_SIMULATED
        }
        run_simulations(list(configs.values()), verbosity=0)
    return {strategy: root / strategy for strategy in configs}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", PLUGIN_SIMULATED)
def test_plugin_methods_run_in_flower_simulation(plugin_runs, strategy):
    out = plugin_runs[strategy]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    start = rounds[0]["evaluation"]["personalized"]["mean"]
    assert summary["personalized"]["last"]["mean"] > start + 0.1
    names = [[e["name"] for e in r["exchanges"]] for r in rounds[1:]]
    expected = ["gradients", "line-search"] if strategy == "line-search" else ["train"]
    assert names == [expected] * 3
    assert all(
        e["bytes_up"] > 0 and e["bytes_down"] > 0 for r in rounds[1:] for e in r["exchanges"]
    )


def test_per_node_messages_share_the_round_payload():
    """Building a round's messages is linear in the payload: shared records by reference."""
    gammas = "0.1,0.2,0.3,0.4,0.5"
    cfg = config(strategy="pfedgt", fraction_train=1.0, **{"pfedgt.gammas": gammas})
    grid, strategy = grid_for(cfg), build_strategy(cfg)
    arrays = initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    for key in (keys.ARRAYS, pfedgt_keys.MESSAGE):
        assert all(m.content[key] is messages[0].content[key] for m in messages)
    sent = {
        strategy.client_ids[m.metadata.dst_node_id]: m.content[keys.CONFIG]["pfedgt.gamma"]
        for m in messages
    }
    assert sent == {i: float(g) for i, g in enumerate(gammas.split(","))}
