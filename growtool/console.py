"""The frame of the command line: the exit-code contract (``Growtool``, the click group class:
one line per error, 2 for bad input, 3 for a bug, 130 / 143 when interrupted), progress bars on
stderr (``Bar``) and option range checks (``bounded``). The commands are in ``growtool.cli``."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
import traceback

import click
from rich.console import Console

from growtool.io import stdout
from growtool.nn import args
from growtool.nn.errors import GrowError

PROGRESS_DELAY = 1.0  # seconds of work before a progress bar appears (short runs stay quiet)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class Bar:
    """A progress bar on stderr for the library's ``progress(name, amount)`` hooks: over tensors and
    their bytes (``nbytes`` given: rate and ETA in bytes), or over ``items`` counted by ``amount``.
    Drawn only when stderr is a terminal, without ``quiet``, and once the work has taken longer
    than PROGRESS_DELAY. ``with Bar(...) as bar: library_call(..., progress=bar)``."""

    def __init__(self, label: str, items: int, nbytes: int | None = None, quiet: bool = False, unit: str = "tensors"):
        self.label, self.items, self.nbytes, self.unit = label, items, nbytes, unit
        self.enabled = not quiet and stderr_is_terminal()
        self.done, self.pending, self.bar, self.t0 = 0, 0, None, time.monotonic()

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __call__(self, name: str, amount: int) -> None:
        by_bytes = self.nbytes is not None
        self.done += 1 if by_bytes else amount
        self.pending += amount if by_bytes else 0
        if not self.enabled or (self.bar is None and time.monotonic() - self.t0 < PROGRESS_DELAY):
            return
        if self.bar is None:
            self.start(by_bytes)
        self.bar.update(
            self.task, completed=self.pending if by_bytes else self.done, count=f"{self.done}/{self.items} {self.unit}"
        )

    def start(self, by_bytes: bool) -> None:
        from rich import progress as rp

        cols = [rp.DownloadColumn(), rp.TransferSpeedColumn()] if by_bytes else []
        self.bar = rp.Progress(
            rp.TextColumn(self.label),
            rp.BarColumn(),
            *cols,
            rp.TextColumn("{task.fields[count]}"),
            rp.TimeRemainingColumn(),
            console=Console(stderr=True, force_terminal=True),
        )
        self.task = self.bar.add_task(self.label, total=self.nbytes if by_bytes else self.items, count="")
        self.bar.start()

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


def clean_errors(fn):
    """Kept so that commands written against it still work: errors are handled once, in ``Growtool.main``."""
    return fn


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def internal_error(e: BaseException, debug: bool) -> str:
    """The line for an unexpected exception (a bug in growtool); the traceback goes to stderr with
    --debug, else to a file the line names."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if debug:
        sys.stderr.write(tb)
        where = "traceback above"
    else:
        try:
            fd, path = tempfile.mkstemp(prefix="growtool-traceback-", suffix=".txt")
            with os.fdopen(fd, "w") as fh:
                fh.write(tb)
            where = f"traceback in {path}; --debug prints it"
        except OSError:
            where = "rerun with --debug for the traceback"
    msg = one_line(str(e)) or "(no message)"
    return f"growtool: internal error: {type(e).__name__}: {msg} (a bug in growtool; {where})"


class Growtool(click.Group):
    """The command group, with the exit-code contract in one place: 0 ok, 1 a check failed, 2 bad input
    or usage (one line), 3 an internal error (one line; traceback with --debug or in a file),
    130 / 143 interrupted by SIGINT / SIGTERM (one line; writers remove their temporary files)."""

    debug = False
    done = False  # a command has finished everything it does: ``run`` may end the process at once
    argv: list = []  # the command line's arguments (train's resume line repeats them)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        Growtool.debug = bool(os.environ.get("GROWTOOL_DEBUG"))
        Growtool.argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        code = 0
        try:
            stdout.harden()  # a closed or unbuffered standard output: every write checked (growtool.io.stdout)
            with interrupts_as_exceptions(), held_warnings():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0  # click returns Exit's code (--help, --version)
            stdout.finish()
        except Interrupted as e:
            code = 128 + e.signum
            note = resume_note(e.resume_step) if hasattr(e, "resume_step") else "no partial output left"
            click.echo(f"growtool: interrupted ({signal.Signals(e.signum).name}); {note}", err=True)
        except click.exceptions.Abort:  # a KeyboardInterrupt our handler did not see (not the main thread)
            code = 128 + signal.SIGINT
            click.echo("growtool: interrupted (SIGINT); no partial output left", err=True)
        except click.ClickException as e:
            code = 2 if isinstance(e, click.UsageError) else e.exit_code
            hint = f" (see '{e.ctx.command_path} --help')" if getattr(e, "ctx", None) else ""
            click.echo(f"growtool: error: {one_line(e.format_message())}{hint}", err=True)
        except (GrowError, OSError, MemoryError) as e:  # bad input, or the machine said no (disk, memory)
            code = 2
            if Growtool.debug:
                traceback.print_exc()
            if isinstance(e, BrokenPipeError):  # a buffered write to standard output, flushed early
                stdout.silence()
                e = stdout.error(e)
            msg = one_line(str(e)) or type(e).__name__
            if isinstance(e, OSError) and e.strerror:
                msg = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
            if isinstance(e, MemoryError):
                msg = f"out of memory ({msg})"
            click.echo(f"growtool: error: {msg}", err=True)
        except RuntimeError as e:  # torch's out-of-memory is a RuntimeError; any other is a bug
            code = 2 if is_out_of_memory(e) else 3
            line = f"growtool: error: out of memory ({one_line(str(e))[:160]})" if code == 2 else None
            click.echo(line or internal_error(e, Growtool.debug), err=True)
        except (SystemExit, click.exceptions.Exit):
            try:
                stdout.finish()  # verify's --json, flushed before its exit code is given
            except GrowError as e:
                click.echo(f"growtool: error: {e}", err=True)
                sys.exit(2)
            raise
        except Exception as e:
            code = 3
            click.echo(internal_error(e, Growtool.debug), err=True)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as e:  # a native library's own BaseException (pyo3's PanicException): a bug
            code = 3
            click.echo(internal_error(e, Growtool.debug), err=True)
        sys.exit(code)


def resume_note(step: int | None) -> str:
    """What an interrupted ``train`` says after "interrupted (SIGINT)": the step it resumes from (set on
    the exception by the training loop) and the command that resumes it."""
    if step is None:
        return "nothing saved yet: run the same command again to start over"
    args = Growtool.argv + ([] if "--resume" in Growtool.argv else ["--resume"])
    return f"the run resumes from step {step} (its last save) with: {shlex.join(['growtool', *args])}"


@contextlib.contextmanager
def held_warnings():
    """Python warnings (torch's, say) raised during a command are held: after success each is one
    ``growtool: warning:`` line; after an error they are dropped (with --debug, printed), so that the
    error stays the only line."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        ok = False
        try:
            yield
            ok = True
        except SystemExit as e:  # verify's verdict (0 or 1) is a result, not an error
            ok = e.code in (0, 1, None)
            raise
        finally:
            for w in caught:
                if ok or Growtool.debug:
                    click.echo(f"growtool: warning: {one_line(str(w.message))[:300]}", err=True)


def is_out_of_memory(e: BaseException) -> bool:
    """torch's out-of-memory errors: ``torch.OutOfMemoryError`` (a device) or the CPU allocator's."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    text = str(e)
    return (oom is not None and isinstance(e, oom)) or "can't allocate memory" in text or "out of memory" in text


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwinds like KeyboardInterrupt, so every writer's cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_exceptions():
    """Turn SIGINT and SIGTERM into ``Interrupted`` (the second and later signals are ignored while the
    first unwinds, so cleanup is not cut short). Only in the main thread; handlers restored after."""

    def handler(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def set_debug(ctx, param, value):
    if value:
        Growtool.debug = True


def bounded(low=None, high=None, low_open=False):
    """A click callback: the option's number must be finite and lie in its range (one line naming the
    option); the same checks as the library's (``growtool.nn.args``)."""

    def check(ctx, param, value):
        if isinstance(value, float):
            return args.real(args.option_name(param), value, low, high, low_open)
        if value is not None:
            return args.integer(args.option_name(param), value, low, high)
        return value

    return check


class Ratio(float):
    """``--width 1.5x``: a size given as a multiple of the source's (resolved by ``resolve_ratio``)."""


class SizeOrRatio(click.ParamType):
    """A whole number (``96``) or a multiple of the source's size (``1.5x``, a ``Ratio``)."""

    name = "N|Rx"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        try:
            return Ratio(text[:-1]) if text.endswith("x") else int(text)
        except ValueError:
            self.fail(f"{value!r} is not a valid integer nor a ratio such as 1.5x", param, ctx)


def size_or_ratio(ctx, param, value):
    """The click callback of a ``SizeOrRatio`` option: a number at least 1, a ratio above 0."""
    if isinstance(value, Ratio):
        args.real(args.option_name(param), float(value), 0, low_open=True)
        return value
    return bounded(1)(ctx, param, value)


def resolve_ratio(option: str, value, current: int):
    """``value`` itself, or the whole number a ``Ratio`` of ``current`` comes to (GrowError when it
    is not a whole number: 1.1 x 64 = 70.4)."""
    if not isinstance(value, Ratio):
        return value
    n = float(value) * current
    if abs(n - round(n)) > 1e-6:
        raise GrowError(f"{option} {value:g}x of {current} is {n:g}, not a whole number: give the size itself")
    return round(n)


def SEED(ctx, param, value):  # noqa: N802 (a seed option's callback, named as the constants beside it)
    return args.seed(args.option_name(param), value)


def settings_options(fn):
    """One click option per field of the trainer's ``Settings`` (name, type, default, help from there;
    ranges are checked by ``Settings.check``, with the same one-line messages as the library)."""
    from dataclasses import fields

    from growtool.training.settings import Settings, option, value_type

    for f in reversed(fields(Settings)):
        m, kind = f.metadata, value_type(f.name)
        if m["flag"]:
            fn = click.option(option(f.name), f.name, is_flag=True, default=f.default, help=m["help"])(fn)
            continue
        typ = click.Choice(m["choices"]) if m["choices"] else kind
        fn = click.option(
            option(f.name),
            f.name,
            type=typ,
            default=f.default,
            show_default=f.default not in (None, ()),
            help=m["help"],
            multiple=m["multiple"],
        )(fn)
    return fn


def compose_options(*options):
    """One decorator applying several click options, in the order listed."""

    def wrap(fn):
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return wrap


# expand's depth options (grow/depth.py)
DEPTH_OPTIONS = compose_options(
    click.option(
        "--layers",
        type=SizeOrRatio(),
        default=None,
        callback=size_or_ratio,
        help="new number of blocks (depth growth), or a multiple of the source's (2x)",
    ),
    click.option(
        "--depth-method",
        type=click.Choice(["stack", "interleave", "middle", "identity"]),
        default="stack",
        show_default=True,
        help="where new blocks come from (docs/growth.md#depth)",
    ),
    click.option(
        "--insert-at", default=None, metavar="P[:S],...", help="place new blocks: P source blocks before each"
    ),
)
