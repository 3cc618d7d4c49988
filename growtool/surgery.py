"""The streaming pipelines behind ``growtool expand`` and ``growtool fold``, as library functions.

``expand`` reads a checkpoint's header, builds the growth plan, and streams the grown tensors into
an atomically written output while a thread hashes the source (the hash lands in the lineage);
the tokenizer files travel with it. ``fold`` bakes the growth gates away the same way. Both
return the written path. ``prepare_expand`` + ``run_expand`` are the two halves of ``expand``
for callers that show the plan before any tensor is read (the command line, ``--dry-run``).

Progress: ``progress``, where given, is called once as ``progress(items, nbytes)`` with the work to
come and returns a context manager yielding the ``progress(name, amount)`` callback the writer calls
(``growtool.console.Bar`` is one)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from growtool import machine, tokenizer
from growtool.grow import depth, engine, limits, recipes
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import Plan, Units, build_plan, gate_values
from growtool.grow.plan import lineage_entry as width_entry
from growtool.io import checkpoint
from growtool.io.checkpoint import Output
from growtool.io.files import check_destination, parse_size
from growtool.io.stream import Producer
from growtool.nn import args
from growtool.nn.errors import GrowError
from growtool.nn.families import expected_shapes

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def default_out(src: str, width: int | None, folder: bool = False, layers=None) -> str:
    """Next to the input, named after it and the width / layers (a folder for a folder input or when sharding)."""
    if src == "-":
        return "-"
    tag = "-".join(([f"d{width}"] if width else []) + ([f"L{layers}"] if layers else []))
    p = Path(src.rstrip("/"))
    if p.is_dir():
        return str(p.with_name(f"{p.name}-{tag}"))
    return str(p.with_name(f"{p.stem}-{tag}" + ("" if folder else ".safetensors")))


def depth_args(width, layers, depth_method: str = "stack", insert_at=None) -> tuple | None:
    """(layers, method, insert_at) of a depth growth, None for the width alone; neither: refused."""
    if layers is None and insert_at is None:
        if width is None:
            raise GrowError("Missing option '--width' (or --layers / --insert-at, to grow the depth)")
        return None
    return layers, depth_method, insert_at


def _dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise GrowError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _size(shard_size) -> int | None:
    """``shard_size``: None, a positive number of bytes, or a size such as "2GB"."""
    if isinstance(shard_size, str):
        return parse_size(shard_size)
    return args.integer("shard_size", shard_size, 1, optional=True)


def _writer_args(out, dtype, shard_size, force, tokenizer_path) -> tuple:
    """The checked arguments every writer (expand, fold) takes: (out, dtype, shard_size)."""
    args.flag("force", force)
    args.path("tokenizer_path", tokenizer_path, optional=True)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        args.text("dtype", dtype, list(DTYPES))
    return args.path("out", out, optional=True), _dtype(dtype), _size(shard_size)


def _expand_args(src, q: Request) -> str:
    """GrowError naming the first of ``expand``'s own arguments of the wrong type or value."""
    for name in ("width", "ffn", "heads", "layers"):
        args.integer(name, getattr(q, name), 1, optional=True)
    args.text("depth_method", q.depth_method, depth.METHODS)
    args.text("insert_at", q.insert_at, optional=True)
    args.seed("seed", q.seed)
    args.flag("allow_lossy", q.allow_lossy)
    args.flag("untie", q.untie)
    if not isinstance(q.recipe, (str, dict)):
        raise GrowError(f"recipe must be a shipped name, a YAML path or a recipe dict, got {q.recipe!r}")
    args.texts("sets", q.sets)
    return args.path("src", src)


def _bar(progress, items: int, nbytes: int):
    return progress(items, nbytes) if progress else contextlib.nullcontext()


@dataclass
class Expansion:
    """A planned expand (``prepare_expand``): the source, its plan, where it goes, and after
    ``run_expand`` what happened (``path``, the tokenizer ``note``, the measured ``loss`` of a lossy plan)."""

    src: str
    ck: checkpoint.Checkpoint
    plan: Plan
    out: str
    carry: tokenizer.Carry
    force: bool = False
    shard_size: int | None = None
    untied: bool = False  # a tied source grown with a head of its own (``untie``)
    path: str | None = None
    loss: object = None  # a check.Comparison at gate 0 when the plan is lossy

    @property
    def note(self) -> str | None:
        return self.carry.note

    @property
    def pre_decay(self) -> Path | None:
        """The source run's state before its decay, when the source is its final checkpoint."""
        return pre_decay_beside(self.src)


@dataclass(frozen=True)
class Request:
    """What an expand asks for (the keywords of ``expand``): ``width``; ``out`` (default beside the
    source, named after the growth); ``recipe`` (a shipped name, a YAML path or a loaded recipe
    dict) with ``sets`` ("KEY=VALUE" overrides); ``ffn``, ``heads``; depth: ``layers``,
    ``depth_method``, ``insert_at``; ``seed``; ``allow_lossy``; ``dtype`` (a name or a torch dtype;
    default the input's); ``shard_size`` (bytes or "2GB"); ``force``; ``tokenizer_path``; ``untie``."""

    width: int | None = None
    out: str | None = None
    recipe: object = "srio"
    sets: tuple = ()
    ffn: int | None = None
    heads: int | None = None
    layers: int | None = None
    depth_method: str = "stack"
    insert_at: object = None
    seed: int = 0
    allow_lossy: bool = False
    dtype: object = None
    shard_size: object = None
    force: bool = False
    tokenizer_path: str | None = None
    untie: bool = False

    def loaded_recipe(self) -> dict:
        return self.recipe if isinstance(self.recipe, dict) else recipes.load(self.recipe, recipes.parse_set(self.sets))

    def depth(self) -> tuple | None:
        """(layers, method, insert_at) of a depth growth, None for the width alone (``depth_args``)."""
        return depth_args(self.width, self.layers, self.depth_method, self.insert_at)


def prepare_expand(src: str, request: Request = Request()) -> Expansion:
    """Check the destination, read ``src``'s header and build the plan; reads no tensor.
    ``request.untie``: a tied source grows into an untied model, its head a tensor of its own made from the
    embedding (``checkpoint.untied``: the same function); needed where a tied head has no exact map
    (an embedding-norm family at a non-whole factor, a LayerNorm without gain). No-op when untied.
    ``request.layers`` / ``insert_at`` grow the depth too (``grow/depth.py``; ``width`` None: depth alone):
    the plan is then a ``depth.Grown``, the width plan's tensors placed by the depth plan."""
    q = request
    src = _expand_args(src, q)
    out, _, shard_size = _writer_args(q.out, q.dtype, q.shard_size, q.force, q.tokenizer_path)
    deep = q.depth() is not None
    r = q.loaded_recipe()
    n_new = f"+{len(str(q.insert_at).split(','))}" if deep and q.layers is None else q.layers
    out = out or default_out(src, q.width, folder=shard_size is not None, layers=n_new)
    check_destination(out, [src], q.force)  # fail before any work
    ck = checkpoint.load(src)  # the header and config; tensors are read on demand
    untie = q.untie and ck.config.tie
    if untie:
        ck = checkpoint.untied(ck)  # the head read from the embedding
    carry = tokenizer.carry(ck, q.tokenizer_path)  # tokenizer files and record travel with the output
    dt = _dtype(q.dtype) or ck.main_dtype()
    try:  # build_plan and depth.build refuse absurd widths and depths (grow/limits.py) before planning
        plan = None
        if q.width is not None:
            kw = dict(seed=q.seed, allow_lossy=q.allow_lossy, dtype=dt, gate_values=gate_values(ck))
            plan = build_plan(ck.config, r, q.width, Units(q.ffn, q.heads), **kw)
        if deep:
            plan = depth.build(ck.config, plan, (q.layers, q.depth_method, q.insert_at), r, q.seed, dt, gate_values(ck))
    except GrowError as e:
        raise GrowError(f"{src}: {e}") from None
    return Expansion(src, ck, plan, out, carry, q.force, shard_size, untie)


def run_expand(job: Expansion, *, progress=None, timings: dict | None = None) -> Expansion:
    """Grow and write ``job`` (from ``prepare_expand``); fills in ``job.path`` (and ``job.loss`` for
    a lossy plan: the loss of function measured at gate 0 on 4 random sequences).
    ``timings``: a dict that receives seconds: "read" (reads with their NaN / Inf check) and "grow",
    summed over the ``producers`` threads (they overlap each other and the writing), "sha256_wait"
    (waiting for the source hash, inside the save), "save" (the wall of the streaming save) and
    "total" (the wall of this call)."""
    ck, plan, out = job.ck, job.plan, job.out
    limits.check_space(checkpoint.specs_nbytes(plan.outputs()), out)  # before any work
    t_all = time.perf_counter()
    source_hash = checkpoint.SourceHash(ck)  # hashed while the output is grown and written
    lineage = ck.lineage + [lineage_entry(plan, source_hash.token, job.untied)]
    work = engine.Workspace(machine.surgery_threads())  # memory reused from tensor to tensor
    read = functools.partial(ck.get, into=work.source)  # each tensor's source read into reused memory
    produce = producer(plan, ck, work, read)
    deep = isinstance(plan, depth.Grown)
    if timings is not None and not deep:
        produce = _timed_producer(job, work, timings)
        source_hash.value = _timed_wait(source_hash.value, timings)
    specs = plan.outputs()
    try:
        with (
            machine.surgery_threading(streaming=True) as producers,
            _bar(progress, len(specs), checkpoint.specs_nbytes(specs)) as bar,
        ):
            workers = _producers(plan, producers, machine.resident_bytes())  # fewer where memory is short
            t_save = time.perf_counter()
            files = lambda: job.carry.files(plan.cfg, source_hash.fill(lineage), job.src, Path(out).name)  # noqa: E731
            options = Output(job.force, [job.src], job.shard_size, files, bar, job.carry.record, source_hash)
            place = None if deep else work.place  # (depth: outputs are made under their sources' names)
            made = Producer(produce, work.recycle, workers, place, _pieces(plan))
            job.path = checkpoint.save(out, plan.cfg, lineage, specs, made, options)
            t_save = time.perf_counter() - t_save
    finally:
        source_hash.cancel()
    work = None  # its blocks are not needed by what follows
    if timings is not None:
        timings.update(producers=workers, save=t_save, total=time.perf_counter() - t_all)
    if plan.lossy:
        job.loss = measure_loss(job)
    return job


def producer(plan, ck, work=None, read=None):
    """``produce(name, rows=None)``: an output tensor of ``plan`` from checkpoint ``ck``; a depth
    plan (``depth.Grown``) places the width plan's tensors (or the source's own, width kept)."""
    width = plan.width if isinstance(plan, depth.Grown) else plan
    if width is None:
        grow = lambda n, rows=None: ck.get(n) if rows is None else ck.get(n, rows=rows)  # noqa: E731
    else:
        grow = lambda n, rows=None: engine.grow_tensor(n, width, ck.get, work, read, rows)  # noqa: E731
    if isinstance(plan, depth.Grown):
        return lambda n, rows=None: plan.grow_tensor(n, grow, rows)
    return grow


def _pieces(plan):
    """``pieces(name)`` of a width plan (``engine.pieces``) or a depth plan (``depth.Grown.pieces``)."""
    return plan.pieces if isinstance(plan, depth.Grown) else functools.partial(engine.pieces, plan)


def _producers(plan, threads: int, resident: int) -> int:
    """How many of ``threads`` may produce at once (``engine.producers``, for a depth plan its own)."""
    return (
        plan.producers(threads, resident)
        if isinstance(plan, depth.Grown)
        else engine.producers(plan, threads, resident)
    )


def lineage_entry(plan, token: str, untied: bool = False) -> dict:
    """The one lineage entry of an expand (width, depth or both); ``untie`` true when the tied head
    was made a tensor of its own."""
    if isinstance(plan, depth.Grown):
        entry = depth.lineage_entry(plan, token, plan.width and width_entry(plan.width, token))
    else:
        entry = width_entry(plan, token)
    return {**entry, "untie": True} if untied else entry


def _timed_producer(job: Expansion, work, timings: dict):
    """``produce`` adding each tensor's seconds to ``timings``: "read" (its reads, with the NaN /
    Inf check) and "grow" (the rest), summed over the producing threads."""
    ck, plan, lock = job.ck, job.plan, threading.Lock()
    timings.update(read=0.0, grow=0.0)

    def produce(name, rows=None):
        spent = [0.0]

        def get(*args, **kw):
            t0 = time.perf_counter()
            try:
                return ck.get(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - t0

        t0 = time.perf_counter()
        y = engine.grow_tensor(name, plan, get, work, functools.partial(get, into=work.source), rows)
        with lock:
            timings["read"] += spent[0]
            timings["grow"] += time.perf_counter() - t0 - spent[0]
        return y

    return produce


def _timed_wait(value, timings: dict):
    """The source hash's ``value`` adding the time spent waiting for it to ``timings["sha256_wait"]``."""
    timings["sha256_wait"] = 0.0

    def timed():
        t0 = time.perf_counter()
        try:
            return value()
        finally:
            timings["sha256_wait"] += time.perf_counter() - t0

    return timed


def measure_loss(job: Expansion):
    """The loss of function of a lossy plan at gate 0, in memory (a ``check.Comparison``)."""
    from growtool.check import compare, random_batches
    from growtool.nn.model import LM

    ck, plan = job.ck, job.plan
    src = ck.model()
    grow = producer(plan, ck)
    grown = LM.from_tensors(plan.cfg, {n: grow(n) for n, _, _ in plan.outputs()})
    return compare(src, grown, random_batches(ck.config.vocab_size, ck.config.context, 4, job.plan.seed), alpha=0.0)


def expand(
    src: str, *, width: int | None = None, out: str | None = None, recipe="srio", progress=None, **options
) -> Path:
    """Grow the checkpoint ``src`` (a .safetensors file, an HF folder, a nanoGPT ckpt.pt) to residual
    width ``width``; returns the written path (``out``; by default beside ``src``, named after the width).
    A training run folder (``last.safetensors`` + ``last.pt``) grows into the new run folder ``out``
    (``grow_run_folder``).

    Options (keywords, the fields of ``Request``): ``sets`` ("KEY=VALUE" recipe overrides), ``ffn``,
    ``heads``, ``seed``, ``allow_lossy`` (else a plan that does not keep the function is refused),
    ``dtype`` ("float32" / "bfloat16" / "float16" or a torch dtype; default the input's),
    ``shard_size`` (bytes or "2GB": shards in a folder ``out``), ``force`` (replace ``out``),
    ``tokenizer_path``, ``untie`` (a tied head becomes a tensor of its own); depth: ``layers``,
    ``depth_method`` ("stack", "interleave", "middle", "identity"), ``insert_at`` ("P[:S],...").
    ``progress``: see the module docstring."""
    request = Request(width=width, out=out, recipe=recipe, **options)
    src = _expand_args(src, request)  # every argument checked, a run folder's too
    if is_run_folder(src):
        return grow_run_folder(src, request).out
    job = run_expand(prepare_expand(src, request), progress=progress)
    return Path(job.path)


def is_run_folder(src) -> bool:
    """A training run folder (it holds the resumable state ``last.pt``)."""
    return Path(src).is_dir() and (Path(src) / "last.pt").exists()


def pre_decay_beside(src) -> Path | None:
    """The run folder's ``pre-decay/`` when ``src`` is a run folder's last or final checkpoint and the
    run kept its state before its decay (docs/training.md, "Grow a finished run"): growing that state and
    resuming it ends lower than training the decayed model (bench/results/budget_d64/WRITEUP.md)."""
    from growtool.training.run_folder import FINAL, MODEL, PRE_DECAY, STATE

    p = Path(str(src))
    pre = p.parent / PRE_DECAY
    return pre if p.name in (FINAL, MODEL) and (pre / STATE).is_file() else None


@dataclass
class RunGrowth:
    """What ``grow_run_folder`` did: the plan, the step the run is at, the new run folder."""

    plan: object
    step: int
    out: Path


def grow_run_folder(src, request: Request) -> RunGrowth:
    """Grow a run's resumable state (model + AdamW moments) into the new run folder ``request.out``
    (``training.stages.expand_run``), to continue with ``growtool train --resume``."""
    from growtool.io import confine
    from growtool.training.stages import Growth, expand_run

    q = request
    if q.shard_size is not None or q.dtype or q.tokenizer_path or q.untie:
        raise GrowError(
            f"{src}: a run folder grows into a run folder: shard_size, dtype, untie and tokenizer do not apply"
        )
    if q.out in (None, "-"):
        raise GrowError(f"{src}: a run folder grows into a new run folder: give -o NEW_RUN_DIR")
    confine.check_output(q.out, [src])  # not inside the source run, nor holding it
    with machine.surgery_threading():
        growth = Growth(q.width, q.loaded_recipe(), q.seed, q.ffn, q.heads, q.allow_lossy, q.depth())
        plan, step = expand_run(Path(src), Path(q.out), growth, q.force)
    return RunGrowth(plan, step, Path(q.out))


@dataclass
class Folding:
    """What ``run_fold`` wrote: the path, whether the model had gates, the tokenizer note."""

    path: str
    gated: bool
    note: str | None


def run_fold(
    grown: str,
    *,
    alpha: float,
    out: str,
    dtype=None,
    shard_size=None,
    force: bool = False,
    tokenizer_path: str | None = None,
    progress=None,
) -> Folding:
    """``fold``, returning what the command line reports."""
    grown, alpha = args.path("grown", grown), args.real("alpha", alpha, 0, 1)
    out, _, shard_size = _writer_args(out, dtype, shard_size, force, tokenizer_path)
    if out is None:
        raise GrowError("out must be a path (a non-empty string), got None")
    check_destination(out, [grown], force)  # fail before any work
    ck = checkpoint.load(grown)
    carry = tokenizer.carry(ck, tokenizer_path)
    dt = _dtype(dtype) or ck.main_dtype()
    cfg = fold_config(ck.config)
    specs = [(n, shp, dt) for n, shp in expected_shapes(cfg).items()]
    source_hash = checkpoint.SourceHash(ck)  # hashed while the output is written
    lineage = ck.lineage + [{"op": "fold", "alpha": alpha, "source_sha256": source_hash.token}]
    work = engine.Workspace()  # memory reused from tensor to tensor
    try:
        with (
            machine.surgery_threading(streaming=True),
            _bar(progress, len(specs), checkpoint.specs_nbytes(specs)) as bar,
        ):
            files = lambda: carry.files(cfg, source_hash.fill(lineage), grown, Path(out).name)  # noqa: E731
            options = Output(force, [grown], shard_size, files, bar, carry.record, source_hash)
            fold_one = lambda n: fold_tensor(n, ck.config, alpha, ck.get, dt, work)  # noqa: E731
            # reading and writing: on a disk one producer was faster than two, in less memory
            path = checkpoint.save(out, cfg, lineage, specs, Producer(fold_one, work.recycle, 1, work.place), options)
    finally:
        source_hash.cancel()
    return Folding(path, ck.config.gated, carry.note)


def fold(grown: str, *, alpha: float, out: str, progress=None, **options) -> Path:
    """Bake the growth gates of ``grown`` away at gate value ``alpha`` (0 = the source's function,
    1 = the plain grown model): a gate-free checkpoint written to ``out``; returns its path.
    Options: ``dtype``, ``shard_size``, ``force``, ``tokenizer_path`` (as ``expand``)."""
    return Path(run_fold(grown, alpha=alpha, out=out, progress=progress, **options).path)
