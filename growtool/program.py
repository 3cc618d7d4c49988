"""The ``growtool`` program: starts hashing an expand / fold source in a child process
(``prehash``), imports torch and the library with the cyclic garbage collector off
(``import_library``), then runs the command line (``cli.run``). Help, the version,
completion and usage errors are answered without torch."""

from __future__ import annotations

import gc
import sys

HELP = {"-h", "--help", "--version"}


def import_library() -> None:
    """Import torch and the modules every command uses. Importing torch creates some 250,000
    Python objects, and the cyclic garbage collector walks them all several times while they are
    being made (0.25 s of a 1.6 s import on a 2-core machine). It is off during the import; what
    was made is then frozen (never scanned again: module-level objects live as long as the
    process) and the collector is back on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        import torch  # noqa: F401

        import growtool.check  # noqa: F401
        import growtool.info  # noqa: F401
        import growtool.surgery  # noqa: F401
        import growtool.views  # noqa: F401
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


def main() -> None:
    from growtool.io import prehash

    argv = sys.argv[1:]
    prehash.start(argv)  # before torch is imported: the fork is cheap, and the import leaves a core idle
    from growtool import cli  # click and rich: torch comes with a command

    name = next((a for a in argv if not a.startswith("-")), None)
    if name in cli.main.commands and not HELP & set(argv):  # a guess: a wrong one costs time, never a result
        import_library()
    cli.run()
