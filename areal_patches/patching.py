"""The shape most fixes share: replace one attribute of AReaL's with a wrapper, once."""

from __future__ import annotations

import functools
from collections.abc import Callable


def wrap_once(owner: object, name: str, wrapper: Callable[[Callable], Callable], marker: str) -> Callable:
    """Set `owner.name` to `wrapper(original)`, which carries `original`'s name and docstring
    (`functools.wraps`) and the attribute `marker`; a second call finds the marker and changes
    nothing. Returns what `owner.name` is afterwards."""
    original = getattr(owner, name)
    if getattr(original, marker, False):
        return original
    replacement = functools.wraps(original)(wrapper(original))
    setattr(replacement, marker, True)
    setattr(owner, name, replacement)
    return replacement
