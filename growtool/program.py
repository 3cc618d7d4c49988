"""The ``growtool`` program: starts hashing an expand / fold source in a child process
(``prehash``), then imports torch and runs the command line (``cli.run``)."""

from __future__ import annotations

import sys


def main() -> None:
    from growtool.io import prehash

    prehash.start(sys.argv[1:])  # before torch is imported: the fork is cheap, and the import leaves a core idle
    from growtool.cli import run

    run()
