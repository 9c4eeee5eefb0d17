"""One line, not a Hydra traceback, for a mistyped config key or a value of the wrong type.

Upstream behaviour (areal 1.0.4): `load_expr_config` answers `actor.optimizer.lrr=1e-5` with
a 64-line Hydra traceback whose hint (`+actor.optimizer.lrr=...`) adds the typo as a new
key and fails again further on; a wrong type (`actor.optimizer.lr=fast`) ends in an
OmegaConf traceback, and settings a dataclass refuses (`++actor.use_sapo_loss=true` with the
decoupled loss) in a ValueError's.

Effect: `load_config` raises SystemExit (status 2, bad input) with one line that names the
key and the closest valid keys (of the config file, or for a key a `++` override adds, of
the dataclass), or the key and the value that does not fit, before any process starts.
`config_problem` gives the same line without loading, for commands that start a trainer
late (the demo, the learning runs).

Off: call AReaL's `load_expr_config` instead.

Upstream: `load_expr_config` unchanged on AReaL's main as of cbff54d (2026-08-22) and in the
v2.0.0 tag; not reported.
"""

from __future__ import annotations

import importlib

from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from devkit.launch.config_keys import closest_keys, first_unknown, unknown_key_problem
from devkit.launch.preflight import exit_bad_input, key_of_override, override_file_problem, overrides_in


def unknown_field_problem(key: str, config_cls: type) -> str | None:
    """A key no field of `config_cls` has (a `++` override's typo), with the closest fields."""
    close = closest_keys(key, OmegaConf.structured(config_cls))
    if close is None:
        return None
    hint = f": did you mean {' or '.join(close)}?" if close else ""
    return f"unknown config key {key!r}{hint} (not a field of {config_cls.__name__})"


def override_problem(key: str, config_cls: type, config_file: str) -> str:
    """Why Hydra refused `key`: a typo (with the closest keys) or a field the file lacks."""
    if first_unknown(key, OmegaConf.structured(config_cls)) is None:
        return f"{key!r} is not in {config_file}: set it with ++{key}=..."
    return unknown_key_problem(key, config_file) or f"unknown config key {key!r}"


def refusal(error: Exception, argv: list[str], config_cls: type) -> str:
    """One line for Hydra's, OmegaConf's or a dataclass's refusal of the config in `argv`."""
    config_file = argv[argv.index("--config") + 1] if "--config" in argv else "the config file"
    if isinstance(error, ConfigCompositionException):
        key = next((key_of_override(o) for o in overrides_in(argv) if repr(key_of_override(o)) in str(error)), None)
        return override_problem(key, config_cls, config_file) if key else str(error).splitlines()[0]
    key = getattr(error, "full_key", None)
    if key and isinstance(error, ConfigKeyError) and (problem := unknown_field_problem(key, config_cls)):
        return problem
    return f"{key}: {str(error).splitlines()[0]}" if key else str(error).splitlines()[0]


# Hydra's, OmegaConf's, and the dataclasses' own checks (__post_init__ raises ValueError).
REFUSALS = (ConfigCompositionException, OmegaConfBaseException, ValueError)


def config_problem(argv: list[str], config_cls: type) -> str | None:
    """Why `load_config` would refuse `argv`, in one line; None if it takes it.

    AReaL's own composition (Hydra, then the merge into `config_cls`) without what
    `load_expr_config` does next: set up name_resolve and write config.yaml into the run's
    log folder. For commands that start a trainer late, to refuse a bad override first.
    """
    from areal.api.cli_args import parse_cli_args, to_structured_cfg

    try:
        OmegaConf.to_object(to_structured_cfg(parse_cli_args(argv)[0], config_cls=config_cls))
    except REFUSALS as e:
        return refusal(e, argv, config_cls)
    return None


def config_override_problem(overrides: list[str], config_file: str, config_class: str | None = None) -> str | None:
    """The first of `overrides` (KEY=VALUE) that `config_file` cannot take, in one line: a key
    it lacks, with the closest keys, or a word where it has a number or a bool. Commands that
    start a trainer late (the demo, the learning runs) ask this first, so a typo costs no warm
    start or server.

    `+` and `~` overrides add or delete keys, and some values pass the file's types but not
    the dataclass's own checks: with `config_class` ("module:Class", e.g.
    "train:CountDownConfig") given, every override is then composed as the trainer will
    compose it. That imports torch and AReaL, seconds paid only when an override is given,
    before a run of minutes.
    """
    if problem := override_file_problem(overrides, config_file):
        return problem
    if config_class and overrides:
        module, name = config_class.split(":")
        return config_problem(["--config", config_file, *overrides], getattr(importlib.import_module(module), name))
    return None


def load_config(argv: list[str], config_cls: type, program: str):
    """AReaL's `load_expr_config(argv, config_cls)`, after a one-line refusal of a bad config.

    The config is composed first on its own, so that only composition's errors become
    refusals: an error from what `load_expr_config` does after it (name_resolve, writing
    config.yaml) keeps its traceback.
    """
    from areal.api.cli_args import load_expr_config

    if problem := config_problem(argv, config_cls):
        exit_bad_input(program, problem)
    return load_expr_config(argv, config_cls)
