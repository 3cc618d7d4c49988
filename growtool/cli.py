"""The command line: a thin click layer over the library. Human-facing output goes to stderr;
stdout carries only what a pipeline consumes (written paths, checkpoint bytes, --json)."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Start-up: importing torch creates some 250,000 Python objects, and the cyclic garbage
# collector walks them all several times while they are being made (0.2-0.4 s of a 1.6 s start on
# a 2-core machine). It is off during the imports; what they made is then frozen (never scanned
# again: module-level objects live as long as the process) and the collector is back on.
_GC_WAS_ON = gc.isenabled()
gc.disable()

import click  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from growtool import tokenizer  # noqa: E402
from growtool.grow import growth, recipes  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.nn.errors import GrowError, check_range  # noqa: E402
from growtool.nn.families import ARCHS  # noqa: E402

gc.freeze()
if _GC_WAS_ON:
    gc.enable()

err = Console(stderr=True)
DTYPE_OPT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def surgery_threads() -> int:
    """Threads for tensor surgery: every core, up to 8 (``GROWTOOL_THREADS`` to choose)."""
    if os.environ.get("GROWTOOL_THREADS", "").isdigit():
        return max(1, int(os.environ["GROWTOOL_THREADS"]))
    return min(os.cpu_count() or 1, 8)


def machine_is_idle() -> bool:
    """No other job holds a core (1-minute load average below cores - 0.5)."""
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1) - 0.5
    except OSError:
        return True


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 256 MB where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 256 << 20


def one_malloc_arena() -> None:
    """Have glibc serve every thread from one arena of memory. By default each thread that
    allocates gets its own (up to 8 per core), and each keeps the blocks of up to 32 MB freed in
    it for reuse: with 8 producing threads the 1 GB float32 expand peaked at 1.0 GB instead of
    0.78-0.87 (bench/README, section 3), at the same speed. (Mapping blocks over 4 MB on their own
    instead, ``M_MMAP_THRESHOLD``, saved as much but cost the 4 GB folder 3 s of page faults.)
    Call before the threads start; elsewhere than glibc, nothing."""
    mallopt = checkpoint.linux_call("mallopt", "c_int", "c_int")
    if mallopt is not None:
        mallopt(-8, 1)  # M_ARENA_MAX (malloc.h)


@contextlib.contextmanager
def surgery_threading(streaming: bool = False):
    """Run tensor surgery on ``surgery_threads()`` threads; yields that count.

    A streaming expand / fold produces that many tensors at once, one Python thread each, with
    torch on one thread: most operations take about a millisecond, where OpenMP's start and wait
    cost as much as they save; threads of our own simply share the cores with any other job.
    In-memory surgery gives the threads to torch instead, and only on an idle machine: OpenMP's
    threads wait for each other whenever another job holds a core (the 120 MB grow took 0.9 s on
    one thread and 11 s on two on a 2-core machine shared with another job)."""
    n, before = surgery_threads(), torch.get_num_threads()
    if streaming:
        one_malloc_arena()
    torch.set_num_threads(1 if streaming else (n if "GROWTOOL_THREADS" in os.environ or machine_is_idle() else 1))
    try:
        yield n
    finally:
        torch.set_num_threads(before)


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

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        Growtool.debug = bool(os.environ.get("GROWTOOL_DEBUG"))
        code = 0
        try:
            with interrupts_as_exceptions():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0  # click returns Exit's code (--help, --version)
        except Interrupted as e:
            code = 128 + e.signum
            click.echo(f"growtool: interrupted ({signal.Signals(e.signum).name}); no partial output left", err=True)
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
            msg = one_line(str(e)) or type(e).__name__
            if isinstance(e, OSError) and e.strerror:
                msg = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
            if isinstance(e, MemoryError):
                msg = f"out of memory ({msg})"
            click.echo(f"growtool: error: {msg}", err=True)
        except (SystemExit, click.exceptions.Exit):
            raise
        except Exception as e:
            code = 3
            click.echo(internal_error(e, Growtool.debug), err=True)
        sys.exit(code)


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


@click.group(cls=Growtool, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="growtool")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=set_debug,
    help="show tracebacks (also GROWTOOL_DEBUG=1)",
)
def main():
    """Offline width growth of transformer checkpoints (SRIO, exact at gate 0).

    Exit codes: 0 ok, 1 a check failed (verify), 2 bad input or usage, 3 internal error,
    130 / 143 interrupted. Shell completion: eval "$(_GROWTOOL_COMPLETE=bash_source growtool)".
    """


def run() -> None:
    """The ``growtool`` program (``main`` is the click group, which tests call in-process).

    A finished ``expand`` / ``fold`` / ``train`` ends the process as soon as its messages are
    flushed, without the interpreter's teardown: its outputs are renamed into place and closed by
    then, and the operating system frees the memory anyway. Freeing torch's operator registry and
    every module took 0.1 s of a 2 s expand on a 2-core machine (bench/README, section 3); and a
    torchrun rank once aborted ("terminate called without an active exception") after its work,
    at the point where gloo's leftover work objects are freed (pytorch/pytorch#179291)."""
    try:
        main()
    except SystemExit as e:
        if e.code in (0, None) and Growtool.done:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        raise


def bounded(low=None, high=None, low_open=False):
    """A click callback: the option's number must lie in its range (one line naming the option)."""

    def check(ctx, param, value):
        if value is not None:
            check_range(
                param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0], value, low, high, low_open
            )
        return value

    return check


# options that expand and fold share
SHARD_SIZE = click.option(
    "--shard-size",
    default=None,
    metavar="SIZE",
    help="write an HF folder of shards of at most SIZE (500MB, 2GB, bytes)",
)
ATTACH_TOKENIZER = click.option(
    "--tokenizer",
    "tokenizer_path",
    default=None,
    metavar="PATH",
    help="attach this tokenizer (a tokenizer.json, or a folder of tokenizer files), not the input's own",
)


# ---- init ---------------------------------------------------------------------------------


@main.command()
@click.option("--family", type=click.Choice(list(ARCHS)), required=True, help="architecture")
@click.option("--width", type=int, required=True, callback=bounded(1))
@click.option("--layers", type=int, required=True, callback=bounded(1))
@click.option("--heads", type=int, required=True, callback=bounded(1))
@click.option(
    "--kv-heads", type=int, default=None, callback=bounded(1), help="llama: key/value heads (GQA); default = heads"
)
@click.option("--ffn", type=int, default=None, callback=bounded(1), help="FFN width; default 4 x width")
@click.option("--vocab", type=int, default=256, show_default=True, callback=bounded(1), help="256 = the byte tokenizer")
@click.option("--context", type=int, default=256, show_default=True, callback=bounded(1))
@click.option(
    "--gamma",
    type=float,
    default=0.5,
    show_default=True,
    callback=bounded(0, low_open=True),
    help="sigma = fan_in^-gamma (0.5: measured best here; 1: the small-init paper's)",
)
@click.option(
    "--embed-gamma",
    type=float,
    default=None,
    callback=bounded(0, low_open=True),
    help="embedding sigma = width^-embed_gamma (default gamma)",
)
@click.option("--norm-eps", type=float, default=1e-12, show_default=True, callback=bounded(0, low_open=True))
@click.option("--attn-gate/--no-attn-gate", default=True, show_default=True, help="gated attention")
@click.option("--tie/--no-tie", default=True, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, callback=bounded(0))
@click.option("-o", "--out", required=True, help=".safetensors file, HF folder, or -")
@click.option("--force", is_flag=True, help="replace an existing output")
def init(
    family,
    width,
    layers,
    heads,
    kv_heads,
    ffn,
    vocab,
    context,
    gamma,
    embed_gamma,
    norm_eps,
    attn_gate,
    tie,
    seed,
    out,
    force,
):
    """Create a new model with gamma-initialisation."""
    from growtool.init import init_model
    from growtool.nn.config import ModelConfig

    if width % heads:
        raise GrowError(f"heads {heads} do not divide width {width}")
    cfg = ModelConfig(
        family=family,
        vocab_size=vocab,
        width=width,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=width // heads,
        ffn=ffn or 4 * width,
        context=context,
        norm_eps=norm_eps,
        tie=tie,
        attn_gate=attn_gate,
    )
    model = init_model(cfg, gamma=gamma, embed_gamma=embed_gamma, seed=seed)
    lineage = [
        {
            "op": "init",
            "gamma": gamma,
            "embed_gamma": embed_gamma if embed_gamma is not None else gamma,
            "seed": seed,
            "width": width,
        }
    ]
    path = checkpoint.save_tensors(out, cfg, lineage, model.tensors(), force=force)
    err.print(f"initialised {family} width {width}, {layers} layers, {cfg.n_params():,} parameters (gamma {gamma})")
    if path != "-":
        click.echo(path)


# ---- expand -------------------------------------------------------------------------------


def default_out(src: str, width: int, folder: bool = False) -> str:
    """Next to the input, named after it and the width (a folder for a folder input or when sharding)."""
    if src == "-":
        return "-"
    p = Path(src.rstrip("/"))
    if p.is_dir():
        return str(p.with_name(f"{p.name}-d{width}"))
    return str(p.with_name(f"{p.stem}-d{width}" + ("" if folder else ".safetensors")))


def plan_table(plan) -> Table:
    t = Table(
        title=f"growth plan: {plan.src.family} d{plan.src.width} -> d{plan.cfg.width} "
        f"(recipe {plan.recipe['name']}, eps {plan.eps:.4f})",
        title_justify="left",
        caption=f"residual map: {plan.residual_map}",
        caption_justify="left",
    )
    for c in ("tensor", "from", "to", "operation"):
        t.add_column(c)
    for row in plan.rows():
        t.add_row(*row)
    return t


def plan_json(plan, out: str | None) -> dict:
    """The plan for tools: source and target shapes, exactness and its reasons, every tensor's operation."""
    outputs = plan.outputs()
    shape = lambda c: {k: getattr(c, k) for k in ("family", "width", "layers", "heads", "kv_heads", "ffn")}  # noqa: E731
    return {
        "source": shape(plan.src),
        "target": shape(plan.cfg),
        "recipe": plan.recipe["name"],
        "eps": plan.eps,
        "residual_map": plan.residual_map,
        "exact": plan.exact,
        "lossy": list(plan.lossy),
        "warnings": list(plan.warnings),
        "tensors": [dict(zip(("pattern", "from", "to", "operation"), row)) for row in plan.rows()],
        "outputs": {
            "tensors": len(outputs),
            "bytes": checkpoint.specs_nbytes(outputs),
            "dtype": str(plan.dtype).replace("torch.", ""),
        },
        "out": out,
    }


def show_plan(plan, quiet: bool) -> None:
    """The plan on stderr: the table (unless quiet), then why it is not exact, then warnings."""
    if not quiet:
        err.print(plan_table(plan))
    for reason in plan.lossy:
        err.print(f"[yellow]lossy:[/] {reason}")
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {w}")


@main.command()
@click.argument("ckpt")
@click.option("--width", type=int, required=True, callback=bounded(1), help="new residual width D")
@click.option("--ffn", type=int, default=None, callback=bounded(1), help="new FFN width (default scales with width)")
@click.option(
    "--heads", type=int, default=None, callback=bounded(1), help="new query heads (default scales with width)"
)
@click.option("--recipe", default="srio", show_default=True, help="shipped name or YAML file")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a recipe field")
@click.option("--seed", type=int, default=0, show_default=True, callback=bounded(0))
@click.option("-o", "--out", default=None, help="output (.safetensors, folder, or -)")
@click.option("--allow-lossy", is_flag=True, help="grow even if the function is not kept")
@click.option("--dtype", type=click.Choice(list(DTYPE_OPT)), default=None, help="output dtype (default: input's)")
@SHARD_SIZE
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--dry-run", is_flag=True, help="show the plan and whether it is exact; read no tensors, write nothing")
@click.option("--plan-json", "plan_json_", is_flag=True, help="print the plan as JSON on stdout (before the path)")
@ATTACH_TOKENIZER
@click.option("--quiet", "-q", is_flag=True, help="no plan table, no progress bar")
def expand(
    ckpt,
    width,
    ffn,
    heads,
    recipe,
    sets,
    seed,
    out,
    allow_lossy,
    dtype,
    shard_size,
    force,
    dry_run,
    plan_json_,
    quiet,
    tokenizer_path,
):
    """Grow CKPT to --width; prints the written path on stdout.

    CKPT may be a training run folder (holding last.safetensors + last.pt): then the output is a new
    run folder whose model and AdamW moments are grown, to continue with ``growtool train --resume``."""
    shard_size = checkpoint.parse_size(shard_size) if shard_size is not None else None
    r = recipes.load(recipe, recipes.parse_set(sets))
    if Path(ckpt).is_dir() and (Path(ckpt) / "last.pt").exists():
        if shard_size is not None or dry_run or plan_json_ or dtype or tokenizer_path:
            raise GrowError(
                f"{ckpt}: a run folder grows into a run folder: --shard-size, --dry-run, --plan-json, --dtype "
                "and --tokenizer do not apply"
            )
        return expand_run_folder(ckpt, width, ffn, heads, r, seed, out, allow_lossy, force, quiet)
    out = out or default_out(ckpt, width, folder=shard_size is not None)
    if plan_json_ and out == "-" and not dry_run:
        raise GrowError("--plan-json and -o - both want standard output: give -o a path, or add --dry-run")
    checkpoint.check_destination(out, [ckpt], force)  # fail before any work
    ck = checkpoint.load(ckpt)  # the header and config; tensors are read on demand
    carry = tokenizer.carry(ck, tokenizer_path)  # tokenizer files and record travel with the output
    dt = DTYPE_OPT[dtype] if dtype else ck.main_dtype()
    try:
        plan = growth.build_plan(
            ck.config,
            r,
            width,
            ffn,
            heads,
            seed=seed,
            allow_lossy=allow_lossy,
            dtype=dt,
            gate_values=growth.gate_values(ck),
        )
    except GrowError as e:
        raise GrowError(f"{ckpt}: {e}") from None
    show_plan(plan, quiet)
    if plan_json_:
        click.echo(json.dumps(plan_json(plan, None if dry_run else out)))
    if dry_run:
        size = checkpoint.specs_nbytes(plan.outputs())
        verdict = (
            "[green]exact[/] at gate 0 (the grown model computes the source's function; growtool verify "
            "measures it after a real run)"
            if plan.exact
            else "[yellow]lossy[/] (reasons above; a real run measures the loss of function)"
        )
        if quiet:  # otherwise the table's caption says it
            err.print(f"residual map: {plan.residual_map}", soft_wrap=True)
        err.print(
            f"dry run: {verdict}; would write {out} ({len(plan.outputs())} tensors, {size:,} bytes)", soft_wrap=True
        )
        return
    source_hash = checkpoint.SourceHash(ck)  # hashed while the output is grown and written
    lineage = ck.lineage + [growth.lineage_entry(plan, source_hash.token)]
    work = growth.Workspace(surgery_threads())  # memory reused from tensor to tensor
    read = functools.partial(ck.get, into=work.source)  # each tensor's source read into reused memory
    try:
        with (
            surgery_threading(streaming=True) as producers,
            Bar("expand", len(plan.outputs()), checkpoint.specs_nbytes(plan.outputs()), quiet) as bar,
        ):
            path = checkpoint.save(
                out,
                plan.cfg,
                lineage,
                plan.outputs(),
                lambda n, rows=None: growth.grow_tensor(n, plan, ck.get, work, read, rows),
                force=force,
                inputs=[ckpt],
                shard_size=shard_size,
                progress=bar,
                tokenizer=carry.record,
                files=lambda: carry.files(plan.cfg, source_hash.fill(lineage), ckpt, Path(out).name),
                source_hash=source_hash,
                recycle=work.recycle,
                workers=plan.producers(producers, resident_bytes()),  # fewer where memory is short
                place=work.place,
                pieces=plan.pieces,
            )
    finally:
        source_hash.cancel()
    work = None  # its blocks are not needed by what follows
    if carry.note:
        err.print(f"[yellow]warning:[/] {carry.note}", soft_wrap=True)
    if plan.lossy:
        from growtool.nn.model import LM
        from growtool.verify import compare, random_batches

        src = ck.model()
        grown = LM.from_tensors(plan.cfg, {n: growth.grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()})
        c = compare(src, grown, random_batches(ck.config.vocab_size, ck.config.context, 4, seed), alpha=0.0)
        err.print(
            f"measured loss of function at gate 0: max |dlogit| {c.max_dlogit:.3g} "
            f"({c.rel:.2%} of the logit scale), mean KL {c.kl:.3g}"
        )
    err.print(
        f"grew {ck.config.family} d{ck.config.width} -> d{plan.cfg.width}: "
        f"{ck.config.n_params():,} -> {plan.cfg.n_params():,} parameters"
    )
    if path != "-":
        click.echo(path)
    Growtool.done = True


def expand_run_folder(src, width, ffn, heads, r, seed, out, allow_lossy, force, quiet):
    """``expand RUN_DIR``: grow a run's resumable state (model + optimizer) into a new run folder."""
    from growtool.training.stages import expand_run

    if out in (None, "-"):
        raise GrowError(f"{src}: a run folder grows into a new run folder: give -o NEW_RUN_DIR")
    with surgery_threading():
        plan, step = expand_run(Path(src), Path(out), width, r, seed, ffn, heads, allow_lossy, force)
    show_plan(plan, quiet)
    err.print(
        f"grew run {src} at step {step}: {plan.src.family} d{plan.src.width} -> d{plan.cfg.width}, AdamW moments "
        f"grown; continue with: growtool train <its checkpoint> --data ... --out {out} --resume",
        soft_wrap=True,
    )
    click.echo(out)


# ---- verify -------------------------------------------------------------------------------


@main.command()
@click.argument("source")
@click.argument("grown")
@click.option("--alpha", type=float, default=0.0, show_default=True, callback=bounded(0, 1), help="gate value to check")
@click.option("--samples", type=int, default=16, show_default=True, callback=bounded(1), help="random sequences")
@click.option("--data", type=click.Path(), default=None, help="also check on this text file (byte tokens)")
@click.option(
    "--tol", type=float, default=1e-4, show_default=True, callback=bounded(0), help="max |dlogit| / logit scale"
)
@click.option("--seed", type=int, default=0, show_default=True, callback=bounded(0))
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON on stdout")
@click.option("--quiet", "-q", is_flag=True, help="no table, no progress bar (the verdict line stays)")
@click.option(
    "--generate",
    "gen_tokens",
    type=int,
    default=None,
    metavar="N",
    callback=bounded(1),
    help="also check that greedy N-token continuations are identical",
)
@click.option(
    "--prompt",
    "prompts",
    multiple=True,
    metavar="TEXT",
    help="prompt for --generate (repeatable; default: from --data, else random ids)",
)
def verify(source, grown, alpha, samples, data, tol, seed, as_json, quiet, gen_tokens, prompts):
    """Check that GROWN computes SOURCE's function at gate --alpha (exit 1 if not).

    Both checkpoints are read one block at a time (bounded memory). For bf16/fp16 checkpoints the
    limit is max(--tol, floor), the floor being the source's own error from running in that dtype."""
    from growtool.verify import (
        LOW_PRECISION,
        StreamedHead,
        figures,
        random_batches,
        reads,
        streamed_hidden,
        text_batches,
    )

    if source == "-" and grown == "-":
        raise GrowError("only one of SOURCE and GROWN can be standard input")
    if prompts and gen_tokens is None:
        raise GrowError("--prompt is for --generate N (greedy continuations); add --generate")
    a, b = checkpoint.load(source), checkpoint.load(grown)
    if a.config.vocab_size != b.config.vocab_size:
        raise GrowError(f"vocab sizes differ: {source} has {a.config.vocab_size}, {grown} has {b.config.vocab_size}")
    if a.config.family != b.config.family:
        raise GrowError(f"families differ: {a.config.family} vs {b.config.family}")
    ctx = min(a.config.context, b.config.context)
    sets = {"random": random_batches(a.config.vocab_size, ctx, samples, seed)}
    if data:
        if not Path(data).is_file():
            raise GrowError(f"{data}: no such file")
        sets["text"] = text_batches(data, a.config.vocab_size, ctx, samples)
    alphas = [alpha] + ([1.0] if alpha != 1.0 and b.config.gated else [])
    low = next((d for d in (b.main_dtype(), a.main_dtype()) if d in LOW_PRECISION), None)
    a_passes, b_passes = len(sets) * (2 if low else 1), len(sets) * len(alphas)  # each pass reads a checkpoint once
    ((ia, ba), (ha, hba)), ((ib, bb), (hb, hbb)) = reads(a), reads(b)
    items = ia * a_passes + ib * b_passes + ha * (2 if low else 1) + hb
    nbytes = ba * a_passes + bb * b_passes + hba * (2 if low else 1) + hbb
    rows, floors = [], []
    with Bar("verify", items, nbytes, quiet) as bar:  # final-norm outputs first, then the heads, once
        hidden = {}
        for label, x in sets.items():
            hidden[label] = (
                streamed_hidden(a, x, 0.0, progress=bar),
                {al: streamed_hidden(b, x, al, progress=bar) for al in alphas},
            )
            if low:
                hidden[label] += (streamed_hidden(a, x, 0.0, dtype=low, progress=bar),)
        head_a, head_b = StreamedHead(a, progress=bar), StreamedHead(b, progress=bar)
        head_low = StreamedHead(a, low, progress=bar) if low else None
        for label, (ref, got, *lows) in hidden.items():
            for al in alphas:
                c = figures(ref, got[al], al, head_a=head_a, head_b=head_b)
                rows.append((label if al == alpha else label + " (info)", c))
            if low:
                floors.append(figures(ref, lows[0], 0.0, head_a=head_a, head_b=head_low).rel)
    fl = max(floors, default=0.0)
    limit = max(tol, fl)
    ok = all(c.rel <= limit for label, c in rows if "(info)" not in label)
    gen = None
    if gen_tokens is not None:
        from growtool.sample import compare_generations, verify_prompts

        ma, mb = a.model(), b.model()
        gen = compare_generations(ma, mb, verify_prompts(a, prompts, data, samples, seed), gen_tokens, alpha)
    passed = ok and (gen is None or gen.ok)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "pass": passed,
                    "tol": tol,
                    "floor": fl,
                    "limit": limit,
                    "dtype": str(low).replace("torch.", "") if low else "float32",
                    "results": [{"inputs": l, **c.as_dict()} for l, c in rows],
                    **({"generate": gen.as_dict()} if gen else {}),
                }
            )
        )
    t = Table(title=f"verify {grown} against {source}", title_justify="left")
    for c in ("inputs", "gate", "max |dlogit|", "logit scale", "rel", "mean KL", "top-1 agree"):
        t.add_column(c, justify="right")
    for label, c in rows:
        t.add_row(
            label,
            f"{c.alpha:g}",
            f"{c.max_dlogit:.3g}",
            f"{c.logit_scale:.3g}",
            f"{c.rel:.3g}",
            f"{c.kl:.3g}",
            f"{c.top1:.4f}",
        )
    if not quiet:
        err.print(t)
    if gen is not None:
        where = "" if gen.ok else "; first difference: prompt {}, token {}".format(*gen.first_divergence)
        err.print(
            f"greedy continuations at gate {alpha:g}: {gen.identical}/{gen.prompts} identical "
            f"over {gen.tokens} tokens{where}"
        )
    if low:
        err.print(
            f"{str(low).replace('torch.', '')} floor: the source run in {str(low).replace('torch.', '')} is "
            f"{fl:.3g} x logit scale from itself in float32; limit max(tol, floor) = {limit:.3g}"
        )
    err.print(
        f"[green]PASS[/]: max |dlogit| within {limit:g} x logit scale at gate {alpha:g}"
        if ok
        else f"[red]FAIL[/]: max |dlogit| exceeds {limit:g} x logit scale at gate {alpha:g}"
    )
    if gen is not None and not gen.ok:
        err.print(f"[red]FAIL[/]: greedy continuations differ at gate {alpha:g}")
    sys.exit(0 if passed else 1)


# ---- fold ---------------------------------------------------------------------------------


@main.command()
@click.argument("grown")
@click.option(
    "--alpha",
    type=float,
    required=True,
    callback=bounded(0, 1),
    help="gate value to bake in (0 = lossless, 1 = plain model)",
)
@click.option("-o", "--out", required=True, help="output (.safetensors, folder, or -)")
@click.option("--dtype", type=click.Choice(list(DTYPE_OPT)), default=None)
@SHARD_SIZE
@click.option("--force", is_flag=True)
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@ATTACH_TOKENIZER
def fold(grown, alpha, out, dtype, shard_size, force, quiet, tokenizer_path):
    """Bake the growth gates away: a plain, gate-free checkpoint."""
    shard_size = checkpoint.parse_size(shard_size) if shard_size is not None else None
    checkpoint.check_destination(out, [grown], force)  # fail before any work
    ck = checkpoint.load(grown)
    carry = tokenizer.carry(ck, tokenizer_path)
    dt = DTYPE_OPT[dtype] if dtype else ck.main_dtype()
    cfg = growth.fold_config(ck.config)
    specs = [(n, shp, dt) for n, shp in checkpoint.expected_shapes(cfg).items()]
    source_hash = checkpoint.SourceHash(ck)  # hashed while the output is written
    lineage = ck.lineage + [{"op": "fold", "alpha": alpha, "source_sha256": source_hash.token}]
    work = growth.Workspace()  # memory reused from tensor to tensor
    try:
        with (
            surgery_threading(streaming=True),
            Bar("fold", len(specs), checkpoint.specs_nbytes(specs), quiet) as bar,
        ):
            path = checkpoint.save(
                out,
                cfg,
                lineage,
                specs,
                lambda n: growth.fold_tensor(n, ck.config, alpha, ck.get, dt, work),
                force=force,
                inputs=[grown],
                shard_size=shard_size,
                progress=bar,
                tokenizer=carry.record,
                files=lambda: carry.files(cfg, source_hash.fill(lineage), grown, Path(out).name),
                source_hash=source_hash,
                recycle=work.recycle,
                workers=1,  # reading and writing: on a disk one producer was faster than two, in less memory
                place=work.place,
            )
    finally:
        source_hash.cancel()
    if carry.note:
        err.print(f"[yellow]warning:[/] {carry.note}", soft_wrap=True)
    err.print(f"folded gates at alpha {alpha:g}" + ("" if ck.config.gated else " (the model had no gates)"))
    if path != "-":
        click.echo(path)
    Growtool.done = True


# ---- inspect ------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option("--metrics", is_flag=True, help="stable rank and row cosine of every matrix")
@click.option("--json", "as_json", is_flag=True)
def inspect(ckpt, metrics, as_json):
    """Family, shapes, parameters, dtype, gate state and lineage of a checkpoint."""
    ck = checkpoint.load(ckpt)
    cfg = ck.config
    gates = growth.gate_values(ck)
    info = {
        "path": ckpt,
        "family": cfg.family,
        "width": cfg.width,
        "layers": cfg.layers,
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "ffn": cfg.ffn,
        "vocab": cfg.vocab_size,
        "context": cfg.context,
        "norm_eps": cfg.norm_eps,
        "tied": cfg.tie,
        "attn_gate": cfg.attn_gate,
        "parameters": cfg.n_params(),
        "dtype": str(ck.main_dtype()).replace("torch.", ""),
        "gated": cfg.gated,
        "base_heads": cfg.base_heads,
        "base_ffn": cfg.base_ffn,
        "gates": gates,
        "lineage": ck.lineage,
        "tokenizer": ck.tokenizer,
        "tensors": {n: list(ck.shape(n)) for n in ck.names()},
    }
    if metrics:
        from growtool.metrics import matrix_metrics

        info["metrics"] = matrix_metrics(cfg, ck.get, ck.names())  # one tensor in memory at a time
        from growtool.training.diagnostics import checkpoint_record

        info["growth"] = checkpoint_record(ck)  # copies vs their sources (None: no recorded growth)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    t = Table(title=f"{ckpt}", title_justify="left", show_header=False)
    for k in (
        "family",
        "width",
        "layers",
        "heads",
        "kv_heads",
        "head_dim",
        "ffn",
        "vocab",
        "context",
        "norm_eps",
        "tied",
        "attn_gate",
        "parameters",
        "dtype",
    ):
        t.add_row(k, f"{info[k]:,}" if k == "parameters" else str(info[k]))
    t.add_row(
        "gates",
        "none (plain model)"
        if not cfg.gated
        else f"{len(gates)} x {sorted(set(gates))}; ungated units: {cfg.base_heads}/{cfg.heads} heads, "
        f"{cfg.base_ffn}/{cfg.ffn} ffn",
    )
    for i, st in enumerate(ck.lineage):
        desc = ", ".join(f"{k}={v}" for k, v in st.items() if k not in ("recipe_full", "source_sha256"))
        if st.get("source_sha256"):
            desc += f", source {st['source_sha256'][:12]}"
        t.add_row(f"lineage {i}", desc)
    if ck.tokenizer:
        t.add_row("tokenizer", f"{', '.join(sorted(ck.tokenizer.get('files', {})))} from {ck.tokenizer.get('from')}")
    err.print(t)
    if metrics:
        m = Table(title="condensation metrics", title_justify="left")
        for c in ("matrix", "stable rank", "row cosine"):
            m.add_column(c)
        for n, v in info["metrics"].items():
            m.add_row(n, f"{v['stable_rank']:.2f}", f"{v['row_cosine']:.3f}")
        err.print(m)
        if info["growth"]:
            from growtool.training.diagnostics import table

            err.print(table(info["growth"]))


# ---- sample -------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option("--prompt", required=True, help="text to continue")
@click.option(
    "--max-tokens",
    type=int,
    default=64,
    show_default=True,
    callback=bounded(1),
    help="tokens to generate (fewer if EOS comes)",
)
@click.option(
    "--temperature", type=float, default=0.0, show_default=True, callback=bounded(0), help="0 = greedy; above 0, sample"
)
@click.option("--top-k", type=int, default=None, callback=bounded(1), help="sample among the K most likely tokens")
@click.option(
    "--seed", type=int, default=0, show_default=True, callback=bounded(0), help="sampling seed (same seed, same text)"
)
@click.option(
    "--alpha",
    type=float,
    default=None,
    callback=bounded(0, 1),
    help="grown checkpoints: growth-gate value (default: the stored gates)",
)
@click.option("--tokenizer", "tokenizer_spec", default=None, metavar="byte|PATH", help="default: the checkpoint's own")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def sample(ckpt, prompt, max_tokens, temperature, top_k, seed, alpha, tokenizer_spec, device):
    """Continue --prompt with CKPT and its own tokenizer; prints the continuation on stdout."""
    from growtool.sample import eos_id, generate
    from growtool.training.data import tokenizer_for
    from growtool.training.train import pick_device

    ck = checkpoint.load(ckpt)
    if alpha is not None and not ck.config.gated:
        raise GrowError(f"--alpha: {ckpt} has no growth gates (a plain model; drop --alpha)")
    tok = tokenizer_for(ck, tokenizer_spec)
    ids = tok.encode_prompt(prompt)
    if not ids:
        raise GrowError("--prompt encodes to no tokens (give some text)")
    model = ck.model().to(pick_device(device, 0))
    t0 = time.time()
    out = generate(
        model,
        torch.tensor([ids]),
        max_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        alpha=alpha,
        eos=eos_id(ck.config),
    )[0].tolist()
    click.echo(tok.decode(out))
    how = "greedy" if temperature <= 0 else f"temperature {temperature:g}" + (f", top-k {top_k}" if top_k else "")
    how += "" if temperature <= 0 else f", seed {seed}"
    which = "the byte tokenizer" if tok.hf is None else f"the tokenizer from {tok.name}"
    err.print(f"{len(out)} tokens ({how}) in {time.time() - t0:.2f} s, {which}", soft_wrap=True)


# ---- train --------------------------------------------------------------------------------


def settings_options(fn):
    """One click option per field of the trainer's ``Settings`` (name, type, default, help from there;
    ranges are checked by ``Settings.check``, with the same one-line messages as the library)."""
    from dataclasses import fields

    from growtool.training.train_settings import Settings, option, value_type

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


@main.command()
@click.argument("ckpt")
@click.option("--data", "data_files", multiple=True, required=True, metavar="FILE", help="text file(s); repeatable")
@settings_options
@click.option("--out", required=True, help="run folder (checkpoints, metrics.jsonl, loss.png)")
@click.option("--resume", is_flag=True, help="continue the run in --out exactly where it stopped")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def train(ckpt, data_files, out, resume, quiet, **settings):
    """Train CKPT on text; prints the final (plain) checkpoint's path on stdout."""
    from growtool.training.train import train as run

    r = run(ckpt, list(data_files), out, resume=resume, progress=not quiet, **settings)
    Growtool.done = True  # every file is written and closed, the process group (torchrun) destroyed
    if os.environ.get("RANK", "0") != "0":
        return
    err.print(
        f"trained {r['steps']}/{r['total_steps']} steps ({r['tokens']:,} tokens) in {r['seconds']:.1f} s: "
        f"val loss {r['first_val_loss']:.4f} -> {r['val_loss']:.4f}",
        soft_wrap=True,
    )
    if r["final"]:
        g = r["gate"]
        err.print(
            f"final checkpoint ({r['params']:,} parameters"
            + (f", growth gates folded at {g:g}" if g is not None else "")
            + f"): {r['final']}",
            soft_wrap=True,
        )
        click.echo(r["final"])
    else:
        err.print(f"stopped at step {r['steps']}: resume with the same command and --resume", soft_wrap=True)


# ---- demo ---------------------------------------------------------------------------------


@main.command()
@click.option(
    "--out", default="growtool-demo", show_default=True, help="folder for every stage's files (must not exist)"
)
@click.option("--quick", is_flag=True, help="tiny models and short runs (well under a minute)")
def demo(out, quick):
    """init -> train -> expand -> verify -> train -> expand -> verify -> train, on a generated corpus."""
    from growtool.demo import run_demo

    ok = run_demo(out, quick=quick)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":  # python -m growtool.cli (what torchrun runs)
    run()
