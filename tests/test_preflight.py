"""devkit/launch/preflight.py: mistakes a command can be told about before its slow imports.

Each case must leave stderr at exactly one line: no import warnings, no AReaL log lines (they
would mean the check ran after torch and AReaL were imported), and exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from devkit import ROOT
from devkit.launch.config_keys import wrong_type_problem
from devkit.launch.config_errors import config_override_problem
from devkit.launch.preflight import key_of_override, override_value

TRAIN = ["train.py", "--config", "train_config.yaml", "scheduler.type=local"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, "countdown.py", "--out-dir", str(out), "--train-size", "20", "--test-size", "5"],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    return out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train.py", "--config", "no_such.yaml"], "train.py: no_such.yaml: no such config file"),
        ([*TRAIN, "actor.optimizer.lrr=1e-5"], "train.py: unknown config key 'actor.optimizer.lrr': did you mean actor.optimizer.lr?"),
        ([*TRAIN, "train_dataset.path=/no/such/train.jsonl"], "train.py: /no/such/train.jsonl: no such file; run `python3 countdown.py`"),
        (["sft.py", "--config", "configs/sft_warm_start.yaml", "train_dataset.batch_sise=4"],
         "sft.py: unknown config key 'train_dataset.batch_sise': did you mean train_dataset.batch_size?"),
        ([*TRAIN, "actor.optimizer.lr=fast"],
         "train.py: actor.optimizer.lr: Value 'fast' of type 'str' could not be converted to Float"),
        ([*TRAIN, "actor.gradient_checkpointing=maybe"],
         "train.py: actor.gradient_checkpointing: Value 'maybe' is not a valid bool (type str)"),
    ],
)
def test_config_and_data_mistakes_are_one_line_before_the_imports(args, expected):
    proc = run(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(expected), proc.stderr[-2000:]
    assert proc.stdout == ""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "override, expected",
    [("++actor.c_clp=3.0",
      "unknown config key 'actor.c_clp': did you mean actor.c_clip or actor.eps_clip? (not a field of CountDownConfig)"),
     ("++actor.use_sapo_loss=true", "SAPO is not compatible with `use_decoupled_loss=True`. "
      "Please set `actor.use_decoupled_loss=false` in your configuration.")],  # fmt: skip
)
def test_a_key_that_an_override_adds_is_judged_by_the_dataclass_in_one_line(data, override, expected):
    proc = run(*TRAIN, f"train_dataset.path={data}/train_e.jsonl", f"valid_dataset.path={data}/test_e.jsonl", override)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"train.py: {expected}", proc.stderr[-2000:]


@pytest.mark.parametrize(
    "command, data_keys",
    [(TRAIN, ["train_dataset.path", "valid_dataset.path"]),
     (["sft.py", "--config", "configs/sft_warm_start.yaml"], ["train_dataset.path"])],  # fmt: skip
)
def test_a_malformed_row_is_one_line_before_the_imports(data, tmp_path, command, data_keys):
    """-X importtime lists on stderr every module the command imported before its answer:
    the row is judged before torch is among them. The bad row is in the last data file."""
    rows = (data / "test_e.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*rows[:2], rows[2].replace('"target": ', '"target": -'), *rows[3:]]) + "\n")
    files = [f"{key}={data}/test_e.jsonl" for key in data_keys[:-1]] + [f"{data_keys[-1]}={bad}"]
    proc = run("-X", "importtime", *command, *files)
    assert proc.returncode == 2
    *imports, line = proc.stderr.strip().splitlines()
    assert line.startswith(f"{command[0]}: {bad}:3: "), proc.stderr[-2000:]
    imported = {entry.rsplit("|", 1)[-1].strip() for entry in imports}
    assert "countdown" in imported and not {"torch", "areal", "datasets"} & imported
    assert all(entry.startswith("import time:") for entry in imports)


# The ref model is loaded only for a KL penalty, so its path is checked only then.
@pytest.mark.parametrize("key, more", [("actor.path", []), ("ref.path", ["actor.kl_ctl=0.1"])])
def test_a_missing_model_folder_is_one_line(data, key, more):
    proc = run(*TRAIN, f"train_dataset.path={data}/train_e.jsonl", f"valid_dataset.path={data}/test_e.jsonl",
               *more, f"{key}=/no/such/model")  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "train.py: model path '/no/such/model' does not exist: pass a Hugging Face model folder or hub id "
        f"as {key}=... (the CPU demo builds one with python3 -m devkit.make_tiny_model)"
    )


@pytest.mark.parametrize(
    "command",
    [TRAIN, ["sft.py", "--config", "configs/sft_warm_start.yaml"], ["plot.py", "runs"], ["evaluate.py", "--model", "m"]],
)
def test_a_python_without_the_projects_packages_is_told_how_to_get_them(command):
    # -S leaves out site-packages: this interpreter then lacks torch, AReaL and the rest, as the
    # system Python of a fresh machine does.
    proc = run("-S", *command)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"{command[0]}: this Python ({sys.executable}) has no ")
    assert line.endswith(f"`make setup`, then `source .venv/bin/activate` (or `.venv/bin/python {command[0]} ...`)")


def test_the_last_override_of_a_key_wins_whatever_its_prefix():
    overrides = ["actor.path=/a", "x=1", "++actor.path=/b"]
    assert override_value(overrides, "actor.path") == "/b"
    assert override_value(overrides, "valid_dataset.path") is None
    assert key_of_override("+actor.optimizer.lr=1=2") == "actor.optimizer.lr"


@pytest.mark.parametrize(
    "key, value",
    [("actor.optimizer.lr", "1e-5"), ("actor.optimizer.lr", "3"), ("actor.optimizer.lr", "'2e-6'"),
     ("gconfig.n_samples", "0.5"),  # a float where the file has an int: only the dataclass can tell
     ("actor.gradient_checkpointing", "False"), ("actor.gradient_checkpointing", "off"),
     ("actor.optimizer.lr", "null"), ("actor.optimizer.lr", "${actor.optimizer.weight_decay}"),
     ("actor.path", "anything")],  # fmt: skip
)
def test_values_that_may_fit_are_left_to_the_full_check(key, value):
    assert wrong_type_problem(key, value, OmegaConf.load(ROOT / "train_config.yaml")) is None


def test_a_word_for_an_integer_names_the_integer():
    problem = wrong_type_problem("gconfig.n_samples", "eight", OmegaConf.load(ROOT / "train_config.yaml"))
    assert problem == "gconfig.n_samples: Value 'eight' of type 'str' could not be converted to Integer"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args, expected",
    [
        (["-m", "experiments.learning_run", "grpo", "--set", "actor.optimizer.lrr=1e-5"],
         "--set: unknown config key 'actor.optimizer.lrr': did you mean actor.optimizer.lr?"),
        (["-m", "experiments.learning_run", "sft", "--sft-set", "train_dataset.batch_sise=4"],
         "--sft-set: unknown config key 'train_dataset.batch_sise': did you mean train_dataset.batch_size?"),
        (["-m", "experiments.learning_run", "grpo", "--set", "gconfig.temperature"],
         "--set: 'gconfig.temperature' is not KEY=VALUE"),
        (["-m", "experiments.learning_run", "grpo", "--set", "gconfig.n_samples=0"],
         "--set: group_size must be a positive integer when using group normalization, got 0"),
        (["-m", "devkit.demo", "++actor.use_sapo_loss=true"],
         "SAPO is not compatible with `use_decoupled_loss=True`"),
        (["-m", "devkit.demo", "actor.optimizer.lr=fast"],
         "actor.optimizer.lr: Value 'fast' of type 'str' could not be converted to Float"),
        (["-m", "devkit.demo", "++actor.c_clp=3.0"],
         "unknown config key 'actor.c_clp': did you mean actor.c_clip or actor.eps_clip? (not a field of CountDownConfig)"),
        (["-m", "experiments.learning_run", "grpo", "--set", "++actor.c_clip=fast"],
         "--set: actor.c_clip: Value 'fast' of type 'str' could not be converted to Float"),
        (["-m", "experiments.learning_run", "sft", "--sft-set", "++examples_per_rw=2"],
         "--sft-set: unknown config key 'examples_per_rw': did you mean examples_per_row? (not a field of WarmStartConfig)"),
    ],
)
def test_commands_that_start_a_trainer_late_refuse_a_bad_override_before_they_make_anything(tmp_path, args, expected):
    """The demo makes a warm start, and a learning run data and a server, before train.py reads
    its overrides: a typo is refused first, and nothing is made."""
    learning_run = "experiments.learning_run" in args
    place = ["--work", str(tmp_path / "work")] if learning_run else ["--run-dir", str(tmp_path / "demo")]
    proc = run(*args, *place)
    assert proc.returncode == 2
    assert f"error: {expected}" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_overrides_that_add_or_delete_keys_are_judged_only_by_the_trainers_dataclass():
    config = str(ROOT / "train_config.yaml")
    overrides = ["++actor.c_clip=3.0", "~ref", "seed=3"]
    assert config_override_problem([*overrides, "~actor.reff"], config) is None  # no dataclass: not judged
    assert config_override_problem(overrides, config, "train:CountDownConfig") is None
    problem = config_override_problem([*overrides, "~actor.reff"], config, "train:CountDownConfig")
    assert problem == "Could not delete from config. 'actor.reff' does not exist."


def test_an_error_after_the_config_is_composed_keeps_its_traceback(monkeypatch, data, tmp_path):
    """Only composition's errors are one-line refusals. A ValueError from what AReaL does with
    the composed config (name_resolve's set-up, made to fail here) is raised as it is."""
    from areal.utils import name_resolve

    from devkit.launch.config_errors import load_config
    from train import CountDownConfig

    def refuse(*_) -> None:
        raise ValueError("name_resolve refused")

    monkeypatch.setattr(name_resolve, "reconfigure", refuse)
    argv = ["--config", str(ROOT / "train_config.yaml"), "scheduler.type=local", f"cluster.fileroot={tmp_path}",
            f"train_dataset.path={data}/train_e.jsonl", f"valid_dataset.path={data}/test_e.jsonl"]  # fmt: skip
    with pytest.raises(ValueError, match="name_resolve refused"):
        load_config(argv, CountDownConfig, "train.py")
