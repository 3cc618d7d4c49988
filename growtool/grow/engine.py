"""The execution engine of a growth plan: ``grow_tensor(name, plan, get)`` runs a tensor's steps,
in memory reused from tensor to tensor (``Workspace``: huge pages, per-thread blocks, output
blocks placed for the writer) and, for large row-local tensors, one block of rows at a time.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from growtool.grow import ops
from growtool.grow.steps import Ctx, ExpandUnits
from growtool.machine import linux_call
from growtool.nn.families import expected_shapes

if TYPE_CHECKING:
    from growtool.grow.plan import Plan


# ---- memory ---------------------------------------------------------------------------------

HUGE = 2 << 20  # a transparent huge page (x86-64, and arm64 with 4 KB pages)


def fresh(nbytes: int) -> torch.Tensor:
    """``nbytes`` of new uint8 memory, which Linux is asked to back with 2 MB pages
    (``madvise(MADV_HUGEPAGE)``: transparent huge pages, where the system grants them on request,
    /sys/kernel/mm/transparent_hugepage/enabled = "madvise" or "always"). Fresh memory costs a page
    fault on its first touch, one per 4 KB page: on this machine 300 MB of new memory took 230-410 ms
    to fill the first time and 25-45 ms the second; as 2 MB pages, 56-69 ms the first time
    (bench/results/surgery/ROUNDS.md, round 7). Only whole 2 MB pages can be huge, so the memory starts on a 2 MB
    boundary and the advice covers it to the end of its last 2 MB page (up to 2 MB more of
    resident memory per block; the space before the boundary is never touched). The result is a
    view: its storage starts earlier. Under 1 MB, or without madvise, plain memory; the bytes
    computed in it are the same either way."""
    madvise = linux_call("madvise", "c_void_p", "c_size_t", "c_int") if nbytes >= HUGE // 2 else None
    if madvise is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    span = -(-nbytes // HUGE) * HUGE  # whole 2 MB pages
    raw = torch.empty(span + HUGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE
    madvise(raw.data_ptr() + skip, span, 14)  # MADV_HUGEPAGE; a refusal only means 4 KB pages
    return raw[skip : skip + nbytes]


class Workspace:
    """Memory reused by ``grow_tensor`` from one tensor to the next. Fresh memory costs a page fault
    per 4 KB on first touch - several times the arithmetic - so:

    * ``tensor``: a float32 block per producing thread, in which every tensor with another output
      dtype is built (its float32 result is rounded into the output, so the block is free again);
    * ``source``: a block per producing thread that each tensor's source is read into;
    * ``output``: the output tensors themselves, in blocks handed back by ``recycle(t)`` once ``t``
      is written (the writer's ``Producer.recycle``); up to KEEP idle blocks are kept. Outputs
      under 1 MB are plain new tensors, and blocks over 64 MB are not kept.

    Thread-safe: producing threads (``checkpoint.prefetch``'s workers) each have their own float32
    and source blocks and share the pool; ``recycle`` may be called from any thread. Without
    ``recycle`` calls, the last few outputs stay referenced."""

    POOL_MIN = 1 << 20
    POOL_MAX = 1 << 26
    PAGE = 4096
    KEEP = 4  # idle blocks kept (the writer holds up to 3 outputs per producer: ``checkpoint.write_stream``)

    def __init__(self, threads: int = 1):
        self.threads = threads  # threads a large tensor may be split among (``_row_blocks``)
        self._splitting = 0  # threads now running row blocks of a split tensor (``lend_threads``)
        self._mine = threading.local()  # .flat, .src: this thread's float32 and source blocks
        self._pool: list[torch.Tensor] = []  # flat uint8 blocks written out and handed back
        self._lent: list[torch.Tensor] = []  # blocks of the outputs handed out (the newest few)
        self._lock = threading.Lock()
        self._offsets: dict[tuple, int] = {}  # (output name, first row) -> file offset (``place``)

    def tensor(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        flat = getattr(self._mine, "flat", None)
        if flat is None or flat.numel() < n:
            self._mine.flat = None  # release the smaller block first (peak memory)
            self._mine.flat = flat = fresh(4 * n).view(torch.float32)
        return flat[:n].view(shape)

    def source(self, nbytes: int) -> torch.Tensor:
        """Memory to read a source tensor into (``Checkpoint.get(name, into=work.source)``): this
        thread's uint8 block, reused from tensor to tensor (valid until this thread's next call).
        Under 1 MB, new memory."""
        if nbytes < self.POOL_MIN:
            return torch.empty(nbytes, dtype=torch.uint8)
        block = getattr(self._mine, "src", None)
        if block is None or block.numel() < nbytes:
            self._mine.src = None  # release the smaller block first (peak memory)
            self._mine.src = block = fresh(nbytes)
        return block[:nbytes]

    def output(self, shape, dtype: torch.dtype, key: tuple | None = None) -> torch.Tensor:
        """Memory for an output tensor (or piece). With ``place``d file offsets, the output ``key``
        = (name, first row) starts at an address with the offset's place within a 4 KB page, so that
        the writer can send most of its bytes to the disk straight from this memory
        (``checkpoint.DirectSink``)."""
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes < self.POOL_MIN:
            return torch.empty(shape, dtype=dtype)
        want = nbytes + self.PAGE
        with self._lock:
            fits = [b for b in self._pool if b.numel() >= want]
            block = min(fits, key=torch.Tensor.numel) if fits else None
            # all too small: freed before a new one is made (peak memory)
            self._pool = [b for b in self._pool if b is not block] if fits else []
        if block is None:
            block = fresh(want)
        with self._lock:
            self._lent = self._lent[-11:] + [block]
        skip = (self._offsets.get(key, 0) - block.data_ptr()) % self.PAGE
        if skip % dtype.itemsize:  # an offset no tensor of this dtype can start at: not placed
            skip = 0
        return block[skip : skip + nbytes].view(dtype).view(shape)

    @contextlib.contextmanager
    def lend_threads(self, wanted: int):
        """Up to ``wanted`` threads for one tensor's row blocks (the caller's own included; at least
        1): what ``threads`` leaves once the other tensors being split have theirs. With every
        producer growing a large tensor, none gets helpers; with one, it gets the idle cores. So
        the threads splitting tensors stay within ``threads`` plus one per other producer (8
        producers splitting 8 ways each would run 64, each helper with a fresh block of memory)."""
        with self._lock:
            n = max(1, min(wanted, self.threads - self._splitting))
            self._splitting += n
        try:
            yield n
        finally:
            with self._lock:
                self._splitting -= n

    def place(self, offsets: dict[tuple, int]) -> None:
        """The file offsets at which the outputs will be written, keyed (name, first row)
        (the writer's ``Producer.place``)."""
        self._offsets = dict(offsets)

    def recycle(self, t: torch.Tensor) -> None:
        """``t`` (an output of ``grow_tensor``) is written and dropped: its block may be reused."""
        with self._lock:
            for i, block in enumerate(self._lent):
                if t.untyped_storage().data_ptr() == block.untyped_storage().data_ptr():
                    del self._lent[i]
                    if block.numel() <= self.POOL_MAX:  # an embedding's block, kept idle through every
                        # layer, would add to the peak when the head is made: such blocks are freed
                        self._pool = sorted(self._pool + [block], key=torch.Tensor.numel)[-self.KEEP :]
                    return


def grow_tensor(
    name: str, plan: Plan, get, work: Workspace | None = None, read=None, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """The grown tensor ``name``: its source (read lazily with ``get``) through the plan's steps.

    The arithmetic is float32 with one rounding to ``plan.dtype`` at the end. Steps that grow the
    tensor build it in place in one float32 tensor of the grown shape. With a ``work`` space that
    tensor and the output come from its reused memory (see ``Workspace``: hand each output back with
    ``work.recycle`` once written). ``read(name)`` (default ``get``) reads the tensor's own source,
    e.g. into ``work.source`` memory; steps read anything else (norm gains) with ``get``. On a large
    2-D tensor whose residual axis is the last, the trailing row-local steps run one block of rows
    at a time (``_row_blocks``). ``rows=(r0, n)``, one of ``pieces(plan, name)``: only those rows
    of the grown tensor, from the same rows of the source (``get(name, rows=)``)."""
    spec, layer = plan.specs[name]
    steps, shape = plan.steps[name], plan.shapes.get(name)
    if rows is not None:
        if rows not in (pieces(plan, name) or []):
            raise ValueError(f"{name}: rows {rows} are not one of pieces(plan, {name!r})")
        shape = (rows[1], *shape[1:])
    held = {}

    def get_once(n):  # a norm gain read by every block: read (and checked) once
        if n not in held:
            held[n] = get(n)
        return held[n]

    if steps and not steps[0].reads:  # made without a source (a gate, a new zero bias)
        t = src = None
    else:
        t = src = (read or get)(name) if rows is None else (read or get)(name, rows=rows)
    if t is not None and not (t.dtype in _EXACT_IN_F32 and steps and steps[0].raw):
        t = t.float()
    scratch = plan.dtype != torch.float32  # else the float32 tensor built is the output itself
    row0 = rows[0] if rows else 0
    whole = _whole_steps(plan, name, shape)
    out = None
    if scratch and steps and steps[-1].rounds and whole == len(steps):  # the last step rounds into it
        out = work.output(shape, plan.dtype, (name, row0)) if work is not None else torch.empty(shape, dtype=plan.dtype)
    c = Ctx(plan, get_once, name, spec, layer, shape=shape, work=work, scratch=scratch, row0=row0, out=out)
    for step in steps[:whole]:
        t = step.apply(t, c)
    if whole < len(steps):
        return _row_blocks(t, steps[whole:], c)
    if out is not None:
        return t if ops.same_view(t, out) else out.copy_(t)
    if work is not None and scratch and t.dim():
        return work.output(t.shape, plan.dtype, (name, row0)).copy_(t)  # the one rounding (as .to: the same conversion)
    out = t.to(plan.dtype).contiguous()  # the one rounding to the output dtype
    if src is not None and out.untyped_storage().data_ptr() == src.untyped_storage().data_ptr():
        out = out.clone()  # the source unchanged (a kept tensor): its memory may be a reused read buffer
    return out


# Float32 elements of a block of rows (``_row_blocks``): 4 MB, which stays in the cache shared by
# the cores (the L3, 32 MB here). With 1 MB blocks (a core's L2) the 1 GB bf16 expansion took
# 1.26-1.28 s in-process against 1.09-1.12 s (bench/README, section 3): each of the ~15 torch calls
# a block takes costs about 5-10 us of dispatch whatever its size.
ROW_BLOCK = 1 << 20
BLOCKED_FROM = 1 << 20  # grown elements from which a tensor is made by blocks of rows (q_proj of d1536: 2.4M)
PIECE = 8 * ROW_BLOCK  # grown elements of a piece of a large row-local tensor (``pieces``)


def _whole_steps(plan: Plan, name: str, shape) -> int:
    """How many of ``name``'s steps run on the whole tensor; the others run by blocks of rows when
    the tensor is 2-D with the residual axis last and has BLOCKED_FROM grown elements or more: the
    trailing row-local steps (the embedding, the head, readers after their unit growth), and all of
    a reader's steps when its unit growth only copies rows (``ExpandUnits.source_rows``: FFN
    readers grown by "tile", any reader grown by "copy") and the steps before it are row-local."""
    (spec, layer), steps = plan.specs[name], plan.steps[name]
    if shape is None or len(shape) != 2 or spec.res_axis != 1 or shape[0] * shape[1] < BLOCKED_FROM:
        return len(steps)
    k = len(steps)
    while k > 0 and steps[k - 1].row_local:
        k -= 1
    if k and isinstance(steps[k - 1], ExpandUnits) and all(s.row_local for s in steps[: k - 1]):
        if steps[k - 1].source_rows(plan, spec, layer) is not None:
            return 0
    return k


# ---- pieces and producers: how the writer asks for tensors ---------------------------------------


def pieces(plan: Plan, name: str) -> list[tuple[int, int]] | None:
    """The row ranges (r0, n) in which a streaming writer makes ``name`` (the writer's
    ``Producer.pieces``, ``grow_tensor(..., rows=)``): a tensor of more than PIECE grown elements whose
    steps are all row-local (the embedding and the head), so that no vocabulary-sized block
    is needed and its first rows are written while the last are grown. None: whole."""
    shape = plan.shapes.get(name)
    gathers = any(isinstance(s, ExpandUnits) for s in plan.steps[name])  # rows that are not the source's
    if gathers or _whole_steps(plan, name, shape) != 0 or shape[0] * shape[1] <= PIECE:
        return None
    rows = max(1, PIECE // shape[1])
    first = max(1, ROW_BLOCK // shape[1])  # the first piece one block:
    starts = [0, *range(first, shape[0], rows)]  # the disk starts sooner (the embedding opens the file)
    return [(a, b - a) for a, b in zip(starts, starts[1:] + [shape[0]])]


def producer_bytes(plan: Plan) -> int:
    """About the most memory one producing thread holds while it makes a tensor (``Workspace``):
    the float32 tensor it builds a whole tensor in when the output is in another dtype (for a
    float32 output that tensor is the output itself), or one block of rows; plus the source
    read and its float32 copy (6 bytes per element for a 2-byte dtype; 4 for float32, whose
    copy is the read itself)."""
    old, most = expected_shapes(plan.src), 0
    for name, shape, _ in plan.outputs():
        steps = plan.steps[name]
        parts = pieces(plan, name)
        lead = shape[0] if shape else 1  # a 0-d scalar (Apertus' xIELU beta, eps) is one row
        rows = parts[0][1] if parts else lead
        src = math.prod(old[name]) * rows // lead if name in old else 0
        if _whole_steps(plan, name, shape) < len(steps):
            f32 = 4 * ROW_BLOCK
        else:
            f32 = 4 * math.prod(shape) if plan.dtype != torch.float32 else 0
        most = max(most, f32 + src * (4 if plan.dtype == torch.float32 else 4 + plan.dtype.itemsize))
    return most


def producers(plan: Plan, threads: int, resident: int = 256 << 20) -> int:
    """How many of ``threads`` may produce tensors at once (the writer's ``Producer.workers``) within
    the memory bound of a streaming expand, 3 x the largest output tensor + 0.5 GB. The writer
    holds up to 2 x that tensor (``checkpoint.write_stream``); ``resident`` is what the process
    holds before the work (the interpreter and torch: 227 MB with torch's CPU build, 496 MB
    with a CUDA build); the producers get the rest, 1 x that tensor + 0.5 GB - ``resident``,
    and at least one producer. (Without this cap a d4096 bf16 model on 8 producers would need
    about 6 GB against a bound of 1.7 GB.)"""
    largest = max(math.prod(shape) * plan.dtype.itemsize for _, shape, _ in plan.outputs())
    room = largest + (512 << 20) - resident
    return max(1, min(threads, room // max(1, producer_bytes(plan))))


def _row_blocks(t: torch.Tensor, steps: list, c: Ctx) -> torch.Tensor:
    """Run row-local ``steps`` on ``t`` (its rows are the output's rows) one block of about
    ROW_BLOCK grown elements at a time, each block rounded into the output as soon as it is built
    (a float32 output is built in place). Each element gets exactly the arithmetic of the
    whole-tensor path (the rotation's sums are per row), so the bytes are the same; but a block
    stays in the core's cache through every step, where a whole tensor (hundreds of MB for a
    vocabulary) goes through memory once per step. When ``steps`` grow the units by copying rows
    (``ExpandUnits.source_rows``), ``t`` is the source and each block is gathered from it, a block
    never straddling two runs of copied rows (a view of the source, no copy). A tensor of 16 blocks
    or more is split among the threads ``work.lend_threads`` grants (contiguous runs of blocks): the
    largest readers (FFN) would otherwise be grown on one core while the other producers wait for
    the writer. (The embedding and the head come in pieces of fewer blocks, ``pieces``, which
    the producers share.)"""
    plan, shape = c.plan, c.shape
    rows = max(1, ROW_BLOCK // shape[1])
    gather = next((s for s in steps if isinstance(s, ExpandUnits)), None)  # ``t`` is then the source
    src_rows = gather.source_rows(plan, c.spec, c.layer) if gather else None
    runs = _runs(src_rows) if gather else [(0, 0, shape[0])]
    if len(runs) > shape[0] // rows + 8:  # rows copied from scattered units ("copy"): gathered by index
        runs = [(0, -1, shape[0])]
    spans = [(a + r, min(rows, k - r), s + r if s >= 0 else None) for a, s, k in runs for r in range(0, k, rows)]
    full = c.canvas(shape) if (c.buf or not c.scratch) else None  # earlier steps' float32 tensor / the output
    if not c.scratch:
        out = full
    elif c.work is not None:
        out = c.work.output(shape, plan.dtype, (c.name, c.row0))
    else:
        out = torch.empty(shape, dtype=plan.dtype)

    def run(first: int, last: int) -> None:  # spans first..last-1
        block = None  # one float32 block of rows, reused (this thread's, from the workspace)
        if full is None:
            n = min(rows, shape[0])
            block = c.work.tensor((n, shape[1])) if c.work is not None else torch.empty(n, shape[1])
        for r0, n, s0 in spans[first:last]:
            buf = full.narrow(0, r0, n) if full is not None else block[:n]
            dst = out.narrow(0, r0, n)
            to = dst if c.scratch and steps[-1].rounds else None  # the last step rounds into the output
            bc = Ctx(plan, c.get, c.name, c.spec, c.layer, shape=(n, shape[1]), buf=[buf], row0=c.row0 + r0, out=to)
            if not gather:
                x = t.narrow(0, r0, n)
            else:
                bc = replace(bc, rows_from=src_rows[r0 : r0 + n])
                x = t.narrow(0, s0, n) if s0 is not None else t.index_select(0, bc.rows_from.clamp_min(0))
            for step in steps:
                x = step.apply(x, bc)
            if not ops.same_view(x, dst):
                dst.copy_(x)  # the one rounding (as .to: the same conversion)

    _over_threads(c.work, len(spans), run)
    return out


def _over_threads(work, blocks: int, run) -> None:
    """``run(first, last)`` over ``blocks`` spans: split into contiguous runs among the threads
    ``work.lend_threads`` grants when there are 16 or more, else in this thread; the first error
    of any thread is raised here."""
    errors: list[BaseException] = []

    def guarded(first: int, last: int) -> None:
        try:
            run(first, last)
        except BaseException as e:  # raised in the calling thread below
            errors.append(e)

    split = work is not None and blocks >= 16
    with work.lend_threads(min(work.threads, blocks)) if split else contextlib.nullcontext(1) as parts:
        bounds = [blocks * k // parts for k in range(parts + 1)]
        helpers = [threading.Thread(target=guarded, args=bounds[k : k + 2], daemon=True) for k in range(1, parts)]
        for h in helpers:
            h.start()
        guarded(bounds[0], bounds[1])
        for h in helpers:
            h.join()
    if errors:
        raise errors[0]


def _runs(src_rows: torch.Tensor) -> list[tuple[int, int, int]]:
    """(first row, its source row or -1, length) of each run of rows copying consecutive source rows
    (-1: a run of zero rows)."""
    starts = [0] + (torch.nonzero(src_rows.diff() != 1).squeeze(1) + 1).tolist() + [src_rows.numel()]
    return [(a, int(src_rows[a]), b - a) for a, b in zip(starts, starts[1:]) if b > a]


_EXACT_IN_F32 = (torch.float32, torch.bfloat16, torch.float16)  # converted to float32 without rounding
