"""One exception type for everything the user got wrong (exit code 2), and the range check that
every numeric option goes through (one line naming the option)."""

from __future__ import annotations


class GrowError(Exception):
    """Bad input or usage: the CLI prints the message as one line and exits 2."""


def check_range(name: str, value, low=None, high=None, low_open: bool = False) -> None:
    """Raise GrowError unless ``low <= value <= high`` (``low < value`` when ``low_open``)."""
    if low is not None and high is not None:
        ok, want = low <= value <= high, f"be in [{_num(low)}, {_num(high)}]"
    elif low is not None and low_open:
        ok, want = value > low, "be positive" if low == 0 else f"exceed {_num(low)}"
    elif low is not None:
        ok, want = value >= low, "be positive" if low == 1 and isinstance(value, int) else f"be at least {_num(low)}"
    else:
        ok, want = high is None or value <= high, f"be at most {_num(high)}"
    if not ok:
        raise GrowError(f"{name} must {want}, got {_num(value)}")


def _num(x) -> str:
    return str(x) if isinstance(x, int) else format(x, "g")
