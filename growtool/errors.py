"""One exception type for everything the user got wrong (exit code 2)."""


class GrowError(Exception):
    """Bad input or usage: the CLI prints the message as one line and exits 2."""
