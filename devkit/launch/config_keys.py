"""Config keys and values checked against the config file alone (OmegaConf, no AReaL import):
a mistyped key, with the closest keys, and a word where the file has a number or a bool.
preflight imports this only once it knows OmegaConf is there.
"""

from __future__ import annotations

import difflib

from omegaconf import DictConfig, OmegaConf


def child_keys(node) -> list[str]:
    if OmegaConf.is_dict(node):
        return [str(k) for k in node.keys()]
    if OmegaConf.is_list(node):
        return [str(i) for i in range(len(node))]
    return []


def first_unknown(key: str, node) -> tuple[int, list[str]] | None:
    """Index of the first part of `key` that `node` lacks and its siblings; None if all exist."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        keys = child_keys(node)
        if part not in keys:
            return i, keys
        node = node[int(part)] if OmegaConf.is_list(node) else node[part]
    return None


def closest_keys(key: str, node) -> list[str] | None:
    """None if `node` has `key`; else the keys nearest to it, with its unknown part replaced."""
    unknown = first_unknown(key, node)
    if unknown is None:
        return None
    index, siblings = unknown
    parts = key.split(".")
    return [".".join([*parts[:index], c, *parts[index + 1 :]]) for c in difflib.get_close_matches(parts[index], siblings)]


def unknown_key_problem(key: str, config_file: str) -> str | None:
    """A key of an override that `config_file` lacks, with the closest keys; None if it has it."""
    close = closest_keys(key, OmegaConf.load(config_file))
    if close is None:
        return None
    if not close:
        return f"{key!r} is not in {config_file}: set it with ++{key}=..."
    return (f"unknown config key {key!r}: did you mean {' or '.join(close)}? "
            f"(the keys are those of {config_file}; a field it lacks is set with ++{key}=...)")  # fmt: skip


BOOLEAN_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}  # what OmegaConf takes as a bool


def wrong_type_problem(key: str, value: str, config: DictConfig) -> str | None:
    """OmegaConf's own line for a word where the config file (loaded: `config`) has a number or
    a bool, so that it comes before the imports; None when the value fits or only the dataclass
    can judge it (strings, null, interpolations, a float where the file has an int)."""
    default = OmegaConf.select(config, key, default=None, throw_on_resolution_failure=False)
    value = value.strip("'\"")
    if value in ("null", "None") or "${" in value:
        return None
    if isinstance(default, bool):
        return None if value.lower() in BOOLEAN_WORDS else f"{key}: Value '{value}' is not a valid bool (type str)"
    if isinstance(default, (int, float)):
        try:
            float(value)
        except ValueError:
            kind = "Float" if isinstance(default, float) else "Integer"
            return f"{key}: Value '{value}' of type 'str' could not be converted to {kind}"
    return None
