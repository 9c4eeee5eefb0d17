"""What a command checks before its heavy imports, so a mistake costs one line, not ten seconds.

torch and AReaL take about ten seconds to import and print warnings on the way. A command
run with the wrong Python, a config file or key that does not exist, a missing data file or
a model folder that is not there is answered first, from the standard library and OmegaConf
alone: one line on stderr, exit status 2 (the project's status for bad input). So are a
word where the config file has a number or a bool and a malformed row of a data file
(countdown.load_puzzles reads every row). The type of every value against AReaL's
dataclasses is checked after the imports, and the trainer reads its data again there.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import NoReturn

BAD_INPUT = 2  # the project's exit status for bad input (options, config, data, model paths)


def exit_bad_input(program: str, message: object) -> NoReturn:
    """One line on stderr, exit status 2: how every command of the project reports bad input."""
    print(f"{program}: {message}", file=sys.stderr)
    raise SystemExit(BAD_INPUT)


def require_modules(program: str, modules: tuple[str, ...]) -> None:
    """One line saying how to get the project's environment when this Python lacks `modules`."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        exit_bad_input(program, f"this Python ({sys.executable}) has no {', '.join(missing)}: run it in the "
             f"project's environment: `make setup`, then `source .venv/bin/activate` "
             f"(or `.venv/bin/python {program} ...`)")  # fmt: skip


def check_model_path(path: str, key: str = "actor.path") -> None:
    """Fail fast on a local model path that does not exist (hub ids like Org/Name pass)."""
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(
            f"model path {path!r} does not exist: pass a Hugging Face model folder or hub id "
            f"as {key}=... (the CPU demo builds one with python3 -m devkit.make_tiny_model)"
        )


def too_few_for_a_batch(dataset, counted: str, rows: int) -> str | None:
    """Why a training set would train nothing, or None.

    AReaL's loaders drop the last incomplete batch (`drop_last`, on by default), so a set of
    fewer rows than one batch gives zero steps: the trainer reports a completed run and saves
    no model. `dataset` is the trainer's train_dataset config; `counted` says what the rows are.
    """
    if dataset.drop_last and rows < dataset.batch_size:
        return (f"{dataset.path}: {counted}, fewer than one batch (train_dataset.batch_size={dataset.batch_size}): "
                "the trainer would make no step and save no model; give more puzzles or a smaller batch_size")
    return None


def key_of_override(override: str) -> str:
    """`actor.path` of `actor.path=...`, `+actor.path=...` or `++actor.path=...`."""
    return override.split("=", 1)[0].lstrip("+~")


def overrides_in(argv: list[str]) -> list[str]:
    """The KEY=VALUE overrides of a trainer's command line (options start with -)."""
    return [arg for arg in argv if "=" in arg and not arg.startswith("-")]


def override_value(overrides: list[str], key: str) -> str | None:
    """The value the last override of `key` gives it."""
    for override in reversed(overrides):
        if key_of_override(override) == key:
            return override.split("=", 1)[1]
    return None


def override_file_problem(overrides: list[str], config_file: str) -> str | None:
    """The first of `overrides` (KEY=VALUE) that `config_file` cannot take, in one line: a key
    it lacks, with the closest keys, or a word where it has a number or a bool. `+` and `~`
    overrides, which add or delete keys, are left to the dataclass."""
    from omegaconf import OmegaConf

    from devkit.launch.config_keys import unknown_key_problem, wrong_type_problem

    config = OmegaConf.load(config_file)
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            return f"{override!r} is not KEY=VALUE"
        if not override.startswith(("+", "~")):
            key, value = key_of_override(override), override.split("=", 1)[1]
            if problem := unknown_key_problem(key, config_file) or wrong_type_problem(key, value, config):
                return problem
    return None


def check_trainer_command(program: str, argv: list[str], data_keys: tuple[str, ...]) -> None:
    """train.py's and sft.py's checks: environment, config file and keys, data, model path."""
    require_modules(program, ("torch", "areal"))
    import warnings

    from omegaconf import OmegaConf

    import countdown

    # Printed by AReaL's import on every machine without NVIDIA's Transformer Engine.
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
        return  # AReaL's own usage error follows
    config_file = argv[argv.index("--config") + 1]
    if not os.path.isfile(config_file):
        exit_bad_input(program, f"{config_file}: no such config file")
    overrides = overrides_in(argv)
    if problem := override_file_problem(overrides, config_file):
        exit_bad_input(program, problem)
    config = OmegaConf.load(config_file)

    def value_of(key: str):
        """The key's value: the last override of it, else the config file's."""
        return override_value(overrides, key) or OmegaConf.select(config, key, throw_on_resolution_failure=False)

    def setting(key: str) -> str | None:
        """The key's string value, unless it needs interpolation (checked after the imports)."""
        value = value_of(key)
        return value if isinstance(value, str) and "${" not in value else None

    try:
        for path in filter(None, map(setting, data_keys)):
            countdown.load_puzzles(path)
        # AReaL loads the `ref` model only for a KL penalty (actor.kl_ctl > 0).
        kl_ctl = value_of("actor.kl_ctl") or 0
        for key in ("actor.path", "ref.path") if float(kl_ctl) > 0 else ("actor.path",):
            if model := setting(key):
                check_model_path(model, key)
    except (countdown.DataError, FileNotFoundError) as e:
        exit_bad_input(program, e)
