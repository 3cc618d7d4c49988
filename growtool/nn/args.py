"""Argument checks shared by the command line and the library: the one place that says what a
number, a path or a choice must be, so the two cannot drift. Each check returns the value it let
through and raises ``GrowError`` naming the argument otherwise (the CLI prints it as one line, exit 2).

Names are given as the caller knows them: the library passes ``"alpha"``, the CLI's callbacks the
option (``"--alpha"``). Numbers must be finite (``inf`` and ``nan`` are never a learning rate, a gate
or a tolerance) and, where a range is given, inside it; integers are ``int`` (``bool`` is not
counted as one) and seeds fit a signed 64-bit integer (``SEED_MAX``), what torch's generators take."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

from growtool.nn.errors import GrowError, check_range

SEED_MAX = 2**63 - 1


def real(name: str, value, low=None, high=None, low_open: bool = False, optional: bool = False):
    """A finite real number (an int or a float, not a bool, not a string) in the range given."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise GrowError(f"{name} must be a number, got {value!r}")
    if low is not None or high is not None:
        check_range(name, value, low, high, low_open)  # (nan is outside every range)
    if not math.isfinite(value):
        raise GrowError(f"{name} must be a finite number, got {value!r}")
    return value


def integer(name: str, value, low=None, high=None, optional: bool = False):
    """An integer (not a bool, not a float, not a string) in the range given."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise GrowError(f"{name} must be an integer, got {value!r}")
    if low is not None or high is not None:
        check_range(name, int(value), low, high)
    return int(value)


def seed(name: str, value):
    """A seed: an integer in 0 .. SEED_MAX."""
    value = integer(name, value, 0)
    if value > SEED_MAX:
        raise GrowError(f"{name} must be at most 2**63 - 1 (a 64-bit seed), got {value}")
    return value


def path(name: str, value, optional: bool = False) -> str | None:
    """A file or folder name: a non-empty ``str`` or ``os.PathLike`` (as a str)."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise GrowError(f"{name} must be a path (a non-empty string), got {value!r}")
    return value


def paths(name: str, value) -> list[str]:
    """One path or a non-empty list / tuple of them (each checked as ``path``)."""
    if isinstance(value, (str, os.PathLike)):
        return [path(name, value)]
    if not isinstance(value, (list, tuple)) or not value:
        raise GrowError(f"{name} must be a path or a non-empty list of paths, got {value!r}")
    return [path(name, v) for v in value]


def flag(name: str, value) -> bool:
    """True or False."""
    if not isinstance(value, bool):
        raise GrowError(f"{name} must be True or False, got {value!r}")
    return value


def text(name: str, value, choices=None, optional: bool = False) -> str | None:
    """A string (one of ``choices`` where given)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise GrowError(f"{name} must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise GrowError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def texts(name: str, value) -> tuple[str, ...]:
    """A list / tuple of strings (one string alone is refused: it would be read letter by letter)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise GrowError(f"{name} must be a list of strings, got {value!r}")
    for v in value:
        text(name, v)
    return tuple(value)


def option_name(param) -> str:
    """A click parameter's name as the user typed it: its long option, else its first."""
    return param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0]
