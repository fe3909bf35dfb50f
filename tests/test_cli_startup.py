"""The command line before anything runs: light start-up, flags, presets, data checks,
``--config`` files and the examples in ``examples/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pflarena.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _pflarena(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pflarena", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or ROOT,
        timeout=600,
    )


def _python(code: str) -> subprocess.CompletedProcess:
    """``python -c code`` with this source tree first on the path."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_help_version_and_methods_import_neither_torch_nor_flower() -> None:
    """Catches ``pflarena --help`` importing every subcommand, and ``pflarena methods``
    importing the strategies (torch, Flower: seconds)."""
    code = (
        "import sys, contextlib, io\n"
        "from pflarena.cli import main\n"
        "for argv in (['--help'], ['--version'], ['methods'], ['methods', 'ditto'],"
        " ['presets'], ['compare', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(argv)\n"
        "heavy = sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "none"


def test_the_methods_catalog_is_what_the_declarations_say(monkeypatch) -> None:
    """Catches a catalog (what ``pflarena methods`` lists without importing the strategies)
    left behind by a change to a declaration: ``make generated`` rewrites it."""
    from pflarena.cli import methods as methods_cli

    monkeypatch.delenv("PFLARENA_PLUGINS", raising=False)
    live = methods_cli.builtin_declarations()
    assert json.loads(methods_cli.CATALOG.read_text()) == json.loads(
        json.dumps(methods_cli.catalog_entries(live))
    )
    listed = methods_cli.listed_declarations()
    assert methods_cli.methods_table(listed) == methods_cli.methods_table(live)
    for name in live:
        assert methods_cli.method_details(name, listed) == methods_cli.method_details(name, live)


def test_the_model_layouts_are_what_the_models_build() -> None:
    """Catches the model layouts (each model's state names: what a split-model method's
    run config is checked against without torch) left behind by a change to a model:
    ``make generated`` rewrites them."""
    from pflarena.core.model_layouts import LAYOUTS, model_layouts

    assert json.loads(LAYOUTS.read_text()) == model_layouts()


def test_a_layout_the_table_lacks_comes_from_the_built_model() -> None:
    """An input shape no registered data set has is answered by building the model, which
    raises its builder's own error for an input the model cannot read."""
    from pflarena.core.model_layouts import known_layout, layout_of, model_layout
    from pflarena.core.models import ModelError, build_model

    assert known_layout("mlp", (1, 8, 8)) == layout_of(build_model("mlp", (1, 8, 8), 10))
    assert known_layout("mlp", (2, 5, 5)) is None
    assert model_layout("mlp", (2, 5, 5), 3) == layout_of(build_model("mlp", (2, 5, 5), 3))
    assert known_layout("cnn", (30,)) is None
    with pytest.raises(ModelError, match="needs image-shaped input"):
        model_layout("cnn", (30,), 30)


def test_version() -> None:
    from pflarena import __version__

    result = _pflarena("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"pflarena {__version__}"


def test_the_help_lines_listed_are_the_subcommands_own() -> None:
    """The stubs ``pflarena --help`` lists without importing the modules say what the
    modules' own parsers say."""
    from pflarena.cli.command import COMMANDS, build_parser

    full = build_parser()
    lines = {a.dest: a.help for a in full.subparsers._choices_actions}
    assert lines == {name: help_line for name, (_, _, help_line) in COMMANDS.items()}


def test_an_abbreviated_flag_is_refused_with_the_flag_it_resembles(capsys) -> None:
    """Catches ``--num-round 1`` silently taken as ``--num-rounds 1``, and the top-level
    usage shown for a subcommand's misspelt flag."""
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--num-round", "1", "--check"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: pflarena run" in err
    assert "--num-round: did you mean --num-rounds?" in err
    with pytest.raises(SystemExit):
        main(["run", "--out", "x", "--check"])
    assert "--out: did you mean --output-dir?" in capsys.readouterr().err


def test_a_misspelt_command_strategy_preset_and_dataset_get_a_suggestion(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["rnu"])
    assert "did you mean 'run'?" in capsys.readouterr().err
    out = str(tmp_path / "x")
    assert main(["run", "--check", "--strategy", "fedavgg", "--output-dir", out]) == 2
    assert "did you mean 'fedavg'" in capsys.readouterr().err
    assert main(["run", "--check", "--preset", "pfedsv-digit", "--output-dir", out]) == 2
    assert "did you mean 'pfedsv-digits'" in capsys.readouterr().err
    assert main(["run", "--check", "--dataset", "digit", "--output-dir", out]) == 2
    assert "did you mean 'digits'" in capsys.readouterr().err


def test_a_preset_comparing_several_strategies_needs_one(tmp_path, capsys) -> None:
    """Catches ``--preset pfedsv-digits`` without ``--strategy`` silently running FedAvg."""
    out = str(tmp_path / "x")
    assert main(["run", "--check", "--preset", "pfedsv-digits", "--output-dir", out]) == 2
    err = capsys.readouterr().err
    assert "name one with --strategy" in err and "pfedsv" in err
    assert main(["run", "--check", "--preset", "pfedsv-digits", "--strategy", "pfedsv",
                 "--output-dir", out]) == 0  # fmt: skip
    assert 'strategy = "pfedsv"' in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, numbers",
    [
        (["--num-clients", "2000"], ["1797 samples", "2000 clients"]),
        (
            ["--partition", "label-groups", "--label-groups", "12", "--num-clients", "24"],
            ["12 groups", "10 classes"],
        ),
    ],
)
def test_settings_the_data_cannot_satisfy_are_refused_in_one_line(tmp_path, capsys, flags, numbers):
    """Catches ``--check`` passing a run that then fails inside every client."""
    out = tmp_path / "x"
    for check in (["--check"], []):
        code = main(["run", *check, "--dataset", "digits", *flags, "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2, err
        # one line (the engine's line before it when a run was to start)
        lines = [line for line in err.strip().splitlines() if "run: engine:" not in line]
        assert len(lines) == 1 and "error: the data cannot satisfy this run" in lines[0], err
        assert all(number in err for number in numbers), err
        assert not out.exists()


def test_a_config_file_is_read_flags_override_it_and_errors_name_it(tmp_path, capsys) -> None:
    file = tmp_path / "run.toml"
    file.write_text('strategy = "ditto"\nnum-clients = 4\n[ditto]\nlambda = 0.25\n')
    out = str(tmp_path / "x")
    assert main(["run", "--check", "--config", str(file), "--num-clients", "5",
                 "--output-dir", out]) == 0  # fmt: skip
    resolved = capsys.readouterr().out
    assert 'strategy = "ditto"' in resolved and "num-clients = 5" in resolved
    assert "ditto.lambda = 0.25" in resolved
    file.write_text("num-clients = [")
    assert main(["run", "--check", "--config", str(file), "--output-dir", out]) == 2
    assert f"--config {file}: not valid TOML" in capsys.readouterr().err


def test_the_examples_run_and_the_run_file_is_kept(tmp_path) -> None:
    """examples/run.toml and examples/sweep.toml, as docs/guide.md shows them."""
    out = tmp_path / "run"
    result = _pflarena("run", "--config", "examples/run.toml", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "run.toml").read_text() == (ROOT / "examples" / "run.toml").read_text()
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert not (out / ".lock").exists()
    # results on stdout, progress on stderr: the first line names the engine
    first = result.stderr.splitlines()[0]
    assert first.startswith("pflarena run: engine: inprocess"), first
    assert "pflarena run: ditto on digits, 4 clients, 1 round" in result.stderr
    assert "1 rounds" not in result.stderr and "1 clients" not in result.stderr
    assert "pflarena [" not in result.stdout and "pflarena [" in result.stderr
    assert "personalized accuracy (mean over clients), %" in result.stdout
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 5 and all(len(line) <= 100 for line in table), result.stdout
    assert (out / "results.md").exists()
    assert list(out.glob("*.png")), "the run's plots (drawn by the command) are missing"
    sweep = _pflarena("sweep", "examples/sweep.toml", "--out", str(tmp_path / "sweep"), "--quiet")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert (tmp_path / "sweep" / "leaderboard.md").exists()


def test_the_first_line_comes_before_the_heavy_imports() -> None:
    """Catches the engine line printed only after torch and Flower are imported (seconds):
    it is printed before the parser that needs them is built."""
    code = (
        "import sys\n"
        "import pflarena.cli.command as command\n"
        "def stop(*a, **k):\n"
        "    print('heavy:', ','.join(m for m in ('torch', 'flwr') if m in sys.modules),"
        " file=sys.stderr)\n"
        "    raise SystemExit(0)\n"
        "command.build_parser = stop\n"
        "command.main(['run', '--dataset', 'digits'])\n"
    )
    result = _python(code)
    lines = result.stderr.splitlines()
    assert lines[0].startswith("pflarena run: engine: inprocess"), result.stderr
    assert lines[1] == "heavy: ", result.stderr


def test_check_prints_each_clients_samples_and_labels_on_stderr(tmp_path, capsys) -> None:
    """``run --check`` shows the partition it would run (as ``shards --stats`` does) on
    stderr; stdout stays the resolved config, readable as TOML."""
    import tomllib

    out = str(tmp_path / "x")
    argv = ["run", "--check", "--dataset", "digits", "--num-clients", "4", "--output-dir", out]
    assert main([*argv, "--partition", "dirichlet", "--alpha", "0.1"]) == 0
    captured = capsys.readouterr()
    assert "partition of digits (dirichlet" in captured.err
    assert all(f"client {i}:" in captured.err for i in range(4))
    assert "samples per client: min" in captured.err
    assert tomllib.loads(captured.out)["num-clients"] == 4


#: For each method whose parameters have rules of their own (``catalog_rules()``): a run
#: refused for one of its parameters, with what its error says, and the flags of a ``--check``
#: that passes (its built-in preset where there is one).
RULES_RUNS: dict[str, tuple[list[str], str, list[str]]] = {
    "pfedgt": (
        ["--num-clients", "4", "--set", "pfedgt.gammas=0.5,0.5"],
        "pfedgt.gammas has 2 values but num-clients is 4",
        ["--preset", "digits-main"],
    ),
    "fedpg": (["--set", "fedpg.gamma=2"], "fedpg.gamma", ["--preset", "fedpg-digits"]),
    "ppfl": (
        ["--set", "ppfl.canonical-layers=9"],
        "ppfl.canonical-layers=9: 9 copied layers requested",
        ["--preset", "ppfl-synthetic"],
    ),
    "page": (
        ["--server-fraction", "0.2", "--set", "page.min-epochs=9"],
        "page.min-epochs (9) exceeds page.max-epochs (5)",
        ["--preset", "page-synthetic"],
    ),
    "dapfl": (["--set", "dapfl.min-lr=1"], "dapfl.min-lr (1.0) exceeds dapfl.max-lr", []),
    "fedper": (["--set", "fedper.head-layers=9"], "fedper.head-layers=9 with model 'mlp'", []),
    "fedrep": (
        ["--set", "fedrep.head-epochs=0", "--set", "fedrep.body-epochs=0"],
        "nothing trains",
        [],
    ),
    "lgfedavg": (
        ["--set", "lgfedavg.global-layers=3"],
        "lgfedavg.global-layers=3 with model 'mlp': a head of 3 layer(s) would swallow",
        [],
    ),
    "fedbabu": (["--set", "fedbabu.head-layers=5"], "fedbabu.head-layers=5 with model", []),
    "fedrod": (["--set", "fedrod.head-layers=3"], "fedrod.head-layers=3 with model", []),
    "fedrecon": (
        ["--set", "fedrecon.support-fraction=0"],
        "fedrecon.support-fraction: Input should be greater than 0",
        [],
    ),
    "splitgp": (["--set", "splitgp.head-layers=3"], "splitgp.head-layers=3 with model", []),
}


def test_check_and_config_errors_import_neither_torch_nor_flower(tmp_path) -> None:
    """Catches a top-level torch or Flower import on the way from the command line to the
    run config's validation: ``run --check`` and a run refused for its configuration (a
    common key out of range, a method needing a validation split, a method parameter of the
    wrong kind, a key misspelt) answer from the catalog and the config schema alone, and
    for every method whose parameters have rules of their own, from its parameters module
    (``pflarena/methods/<name>/params.py``) and the models' layouts."""
    from pflarena.cli.methods import catalog_rules

    assert set(RULES_RUNS) == catalog_rules()
    out = str(tmp_path / "x")
    runs = [
        ["run", "--check", "--dataset", "digits", "--num-clients", "4", "--output-dir", out],
        ["run", "--num-clients", "0", "--output-dir", out],
        ["run", "--strategy", "pfedsv", "--output-dir", out],
        ["run", "--strategy", "ditto", "--set", "ditto.lambda=-1", "--output-dir", out],
        ["run", "--strategy", "fedavg", "--set", "fedavg.personal-modle=global", "--check"],
        ["run", "--strategy", "fedper", "--num-rounds", "0", "--output-dir", out],
    ]
    expected = [("0", ""), ("2", "num-clients"), ("2", "pfedsv needs a validation split")]
    expected += [("2", "ditto.lambda"), ("2", "did you mean fedavg.personal-model")]
    expected += [("2", "num-rounds")]
    for name, (refused, said, check) in RULES_RUNS.items():
        runs.append(["run", "--strategy", name, *refused, "--output-dir", out])
        expected.append(("2", said))
        runs.append(["run", "--check", *check, "--strategy", name, "--output-dir", out])
        expected.append(("0", "samples per client"))
    code = (
        "import sys, contextlib, io\n"
        "from pflarena.cli import main\n"
        f"for argv in {runs!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    print(code, err.getvalue().strip().splitlines()[-1])\n"
        "heavy = sorted(m for m in ('torch', 'flwr') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "none", result.stdout
    said = [tuple(line.split(" ", 1)) for line in lines[:-1]]
    assert len(said) == len(expected), result.stdout
    for argv, (code, text), (expected_code, expected_text) in zip(
        runs, said, expected, strict=True
    ):
        assert code == expected_code and expected_text in text, (argv, code, text)
    assert not Path(out).exists()


def test_sweep_check_and_config_errors_import_neither_torch_nor_flower(tmp_path) -> None:
    """Catches ``pflarena sweep`` importing the strategies (torch, Flower) to build its
    parser or to validate its runs: ``--check`` of methods with and without rules of their
    own, and a run refused for a method's parameter, answer from the catalog; the disk
    estimate ``--check`` states comes from a child process."""
    out = str(tmp_path / "sweep")
    runs = [
        ["sweep", "--strategies", "fedavg,fedper,ppfl,pfedgt", "--seeds", "0,1", "--out", out,
         "--num-clients", "4", "--check"],
        ["sweep", "--strategies", "fedper", "--grid", "fedper.head-layers=1,9", "--out", out,
         "--check"],
    ]  # fmt: skip
    code = (
        "import sys, contextlib, io\n"
        "from pflarena.cli import main\n"
        f"for argv in {runs!r}:\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        code = main(argv)\n"
        "    print(code, (out.getvalue() + err.getvalue()).strip().splitlines()[-1])\n"
        "heavy = sorted(m for m in ('torch', 'flwr') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "none", result.stdout
    # the runs' disk estimate, from a child process that the check forks
    assert lines[0].startswith("0 state on disk, up to about "), result.stdout
    assert "for the 8 run(s) to do" in lines[0], result.stdout
    assert lines[1].startswith("2 ") and "fedper.head-layers=9 with model 'mlp'" in lines[1]
    assert not Path(out).exists()


def test_the_catalog_validates_as_the_declarations_do() -> None:
    """Catches the catalog's rebuilt parameters (what ``run`` validates against before torch
    and Flower are imported) accepting, refusing or normalizing a config otherwise than the
    strategies' own declarations: every method with and without settings, good and bad."""
    from pflarena.cli.methods import catalog_declarations, catalog_rules
    from pflarena.cli.options import validate_run
    from pflarena.core.config import ConfigError
    from pflarena.server.build import parse_config
    from pflarena.strategies import declarations

    live = declarations()
    rebuilt = catalog_declarations()
    assert rebuilt is not None and list(rebuilt) == list(live)
    rules = catalog_rules()
    for name in rules:  # validated by their own model, from a module without torch
        assert rebuilt[name].params is live[name].params, name
        assert live[name].params.__module__ == f"pflarena.methods.{name}.params", name
    configs: list[dict] = [{}, {"num-clients": 0}, {"fedavg.personal-model": "local-result"}]
    for name, declaration in live.items():
        configs.append({"strategy": name})
        if name not in rules:
            assert rebuilt[name].params.defaults() == declaration.params.defaults(), name
        for key, default in declaration.defaults().items():
            bad = "nonsense" if not isinstance(default, str) else 3.5
            for value in (default, bad, -1, 10**9, "1e999"):
                configs.append({"strategy": name, key: value})
            configs.append({"strategy": "local", key: default})  # another method's key
        configs.append({"strategy": name, f"{name}.no-such-key": 1})
        configs.append({"strategy": name, "validation-fraction": 0.2, "momentum": 0.5})
    for values in configs:
        try:
            expected: object = parse_config(values)
        except ConfigError as error:
            expected = str(error)
        try:
            got: object = validate_run(values)
        except ConfigError as error:
            got = str(error)
        if isinstance(expected, str):
            assert got == expected, values
        else:
            assert not isinstance(got, str), (values, got)
            assert got.to_run_config() == expected.to_run_config(), values
            assert got.method_values() == expected.method_values(), values


def test_the_run_notes_its_moments_from_the_process_start(tmp_path, monkeypatch) -> None:
    """Catches a start-up figure that begins after Python and the imports: the command's
    first moment is its process's start (/proc), and the moments of several processes in
    one file make one table in time order."""
    import time

    from pflarena.core.phases import PHASES_ENV, mark, phase_rows, process_start, read_marks

    started = process_start()
    assert started <= time.time()
    child = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.3); from pflarena.core.phases import "
         "process_start; print(repr(time.time() - process_start()))"],
        capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    assert 0.3 <= float(child.stdout) < 30, child.stdout  # its age includes Python's start
    path = tmp_path / "phases"
    monkeypatch.setenv(PHASES_ENV, str(path))
    mark("b", at=started + 2.0)
    mark("a", at=started + 1.0)
    mark("a", at=started + 3.0)  # a name's first moment counts
    rows = phase_rows(read_marks(path), started)
    assert [(name, round(phase, 3), round(at, 3)) for name, phase, at in rows] == [
        ("a", 1.0, 1.0),
        ("b", 1.0, 2.0),
    ]
    monkeypatch.delenv(PHASES_ENV)
    mark("c")  # nothing recorded, nothing raised
    assert len(read_marks(path)) == 2


def _run_help() -> str:
    """``pflarena run --help`` as printed (without --help-all)."""
    import contextlib
    import io

    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        main(["run", "--help"])
    return out.getvalue()


def test_run_help_lists_every_key_a_preset_or_a_method_needs() -> None:
    """Catches a flag that a built-in preset sets, or a method needs (validation-fraction for
    pFedSV, server-fraction for PAGE), left out of ``run --help``: a researcher leaving the
    preset would not know it exists."""
    from pflarena.cli.methods import listed_declarations
    from pflarena.core.presets import load_preset, preset_names

    text = _run_help()
    shown = {word.rstrip(",") for word in text.split() if word.startswith("--")}
    needed: set[str] = set()
    for name in preset_names():
        preset = load_preset(name)
        for strategy in preset.strategies:
            needed |= set(preset.overrides(strategy))
    for declaration in listed_declarations().values():
        if declaration.needs_validation:
            needed.add("validation-fraction")
        if declaration.needs_server_data:
            needed.add("server-fraction")
    assert {"validation-fraction", "server-fraction"} <= needed
    missing = sorted(key for key in needed if f"--{key}" not in shown)
    assert not missing, missing


def test_a_needed_key_is_named_as_its_flag_and_the_preset_that_sets_it(tmp_path, capsys):
    """Catches ``--strategy pfedsv`` refused without saying which flag, or which preset,
    gives it its validation split."""
    assert main(["run", "--check", "--strategy", "pfedsv", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pfedsv needs a validation split" in err
    assert "--validation-fraction" in err and "--preset pfedsv-digits --strategy pfedsv" in err
    assert main(["run", "--check", "--strategy", "page", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "page needs server-held data" in err and "--server-fraction" in err
    assert "--preset page-" in err


def test_device_lists_its_values_and_refuses_others_in_one_line(capsys) -> None:
    """Catches ``--device gpu`` refused only by the run config's validation (two lines,
    after the parser), or ``run --help`` not saying which devices there are."""
    assert "--device {auto,cpu,cuda}" in _run_help()
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--check", "--device", "gpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert "--device" in err and all(f"'{value}'" in err for value in ("auto", "cpu", "cuda"))


def test_one_round_and_one_client_are_singular() -> None:
    """Catches ``1 rounds`` and ``1 clients`` on the console."""
    from pflarena.core.text import count
    from pflarena.server.progress import Progress
    from pflarena.server.progress_events import RunStarted, event_line

    assert (count(1, "round"), count(2, "round"), count(0, "client")) == (
        "1 round",
        "2 rounds",
        "0 clients",
    )
    started = RunStarted(strategy="fedavg", data="digits", clients=1, rounds=1, output_dir="/r")
    assert started.text() == "pflarena: fedavg on digits, 1 client, 1 round -> /r"
    lines: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    progress = Progress(1, stream=Sink(), tty=False)  # type: ignore[arg-type]
    progress.feed(event_line(started) + "\n")
    assert "fedavg on digits, 1 client, 1 round -> /r" in "".join(lines)


def test_a_check_with_a_server_split_imports_no_scikit_learn(tmp_path) -> None:
    """Catches the server's stratified split (``server-fraction``, checked against the data
    by ``--check``) importing scikit-learn, with scipy and pandas: seconds."""
    code = (
        "import sys, contextlib, io\n"
        "from pflarena.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    code = main(['run', '--check', '--strategy', 'page', '--server-fraction', '0.2',"
        f" '--output-dir', {str(tmp_path / 'x')!r}])\n"
        "print(code, sorted(m for m in ('torch', 'flwr', 'sklearn', 'scipy') if m in sys.modules))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0 []"


def test_the_data_checks_run_in_a_child_that_keeps_what_they_import(tmp_path, monkeypatch):
    """Reading MNIST or CIFAR imports torch (torchvision's readers) and keeps it with the
    data, about 1 GB, which the command's process would hold to the run's end: the checks
    run in a forked child, whose imports and errors do not stay behind / come back."""
    from pflarena.core.config import ConfigError
    from pflarena.core.footprint import DiskEstimate
    from pflarena.runtime import precheck
    from pflarena.server.build import parse_config

    (tmp_path / "heavy_reader.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def reads_heavily(cfg, *, files_required=True):
        import heavy_reader  # noqa: F401 - what a torchvision reader's import stands for

        if cfg.num_clients > 3:
            raise ConfigError(f"num-clients={cfg.num_clients}: too many for this data")
        return f"checked {cfg.num_clients}"

    cfgs = [parse_config({"num-clients": n}) for n in (2, 3)]
    too_many = parse_config({"num-clients": 5})
    monkeypatch.setattr(precheck, "check_data", reads_heavily)
    # the memory and disk checks build the model: torch, loaded here, cannot be imported
    # again once it is taken out of sys.modules below (the command's process never loaded it)
    nothing = DiskEstimate((), tmp_path)
    monkeypatch.setattr("pflarena.server.build.check_resources", lambda cfg, here: nothing)
    monkeypatch.delitem(sys.modules, "torch")  # as in the command's process, which has none
    checked = precheck.check_data_apart(cfgs)
    assert [c.unchecked for c in checked] == ["checked 2", "checked 3"]
    assert [c.disk for c in checked] == [nothing, nothing]
    assert "heavy_reader" not in sys.modules
    with pytest.raises(ConfigError, match="num-clients=5: too many for this data"):
        precheck.check_data_apart([too_many])
    assert "heavy_reader" not in sys.modules


def test_the_data_check_child_dies_with_the_command() -> None:
    """Catches a check child that outlives a command killed during the check (SIGKILL: no
    clean-up runs): it would wait on its parent's queue for ever."""
    import signal
    import time

    code = (
        "import os, sys, time\n"
        "from pflarena.core.config import parse_run_config\n"
        "from pflarena.runtime import precheck\n"
        "def hang(cfg, *, files_required=True):\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(600)\n"
        "precheck.check_data = hang\n"
        "precheck.check_data_apart([parse_run_config({})])\n"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        child = int(parent.stdout.readline())
        assert child != parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)

        def alive() -> bool:  # a zombie (ended, not yet reaped by its new parent) is not
            try:
                return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False

        deadline = time.monotonic() + 30
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), f"the check child {child} outlived its parent"
    finally:
        parent.kill()
        parent.wait()
