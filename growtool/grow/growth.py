"""Width growth as a plan, then an execution: ``plan = build_plan(...)``; ``grow_tensor(name, plan, get)``.

The plan fixes everything before a tensor is touched: the target config, the residual map (the
rotation angle, or none) and why, the expansion of every unit axis in every block and of the
residual axis, whether the result keeps the function (and if not, why), and for every output
tensor the list of steps that make it. The printed plan table and the execution both read those
steps, so they cannot disagree.

Steps (each a small class below, with ``apply`` and ``describe``):
  FoldGain        fold the norm gain into a reader (rotated RMSNorm readers)
  ExpandUnits     grow the unit axis (new heads / FFN neurons) by the recipe's kind; Net2Net split
  ExpandResidual  grow the residual axis by a kind; "tile" units fill the new-new block
  ZeroOldWrites   old (ungated) units write nothing into the new residual dims
  Rotate          the SRIO rotation along the residual axis
  PadRotate       ExpandResidual by zeros + Rotate in one pass that skips the zeros (same bytes)
  BreakSymmetry   recipe ``noise``: noise on new units that keeps the function at gate 0
  NormGain, PadZero, Keep, GateZero   norms, biases, per-head norms, warm-up gates
"""

from __future__ import annotations

import contextlib
import math
import threading
import zlib
from dataclasses import dataclass, field, replace

import torch

from growtool.grow import ops
from growtool.io.checkpoint import Checkpoint, linux_call
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import TensorSpec, arch_of, expected_shapes, tensor_specs, unit_count

# ---- memory ---------------------------------------------------------------------------------

HUGE = 2 << 20  # a transparent huge page (x86-64, and arm64 with 4 KB pages)


def fresh(nbytes: int) -> torch.Tensor:
    """``nbytes`` of new uint8 memory, which Linux is asked to back with 2 MB pages
    (``madvise(MADV_HUGEPAGE)``: transparent huge pages, where the system grants them on request,
    /sys/kernel/mm/transparent_hugepage/enabled = "madvise" or "always"). Fresh memory costs a page
    fault on its first touch, one per 4 KB page: on this machine 300 MB of new memory took 230-410 ms
    to fill the first time and 25-45 ms the second; as 2 MB pages, 56-69 ms the first time
    (bench/README, round 7). Only whole 2 MB pages can be huge, so the memory starts on a 2 MB
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


# ---- steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    plan: Plan
    get: object  # source tensor by name
    name: str
    spec: TensorSpec
    layer: int | None
    shape: tuple | None = None  # the grown tensor's shape: steps that grow it build it in place (``canvas``)
    buf: list = field(default_factory=list)  # the float32 tensor of that shape, once allocated
    work: Workspace | None = None  # memory to build it in, reused from tensor to tensor
    scratch: bool = False  # the built float32 tensor is rounded into the output (else it is the output)
    row0: int = 0  # a piece / block of rows (``_row_blocks``): the index of its first row in the whole tensor
    rows_from: torch.Tensor | None = None  # a block gathered from the source: each row's source row (-1: none)
    out: torch.Tensor | None = None  # the output (block) in the plan's dtype, for a last step that rounds into it

    def canvas(self, shape) -> torch.Tensor:
        """A float32 tensor of ``shape`` for a step's result: the leading corner of one tensor of the
        grown shape when it fits there, so the steps after it grow it in place (one allocation per
        grown tensor instead of one per step); a new tensor otherwise."""
        shape = tuple(shape)
        if self.shape is None or len(shape) != len(self.shape) or any(a > b for a, b in zip(shape, self.shape)):
            return torch.empty(shape)
        if not self.buf:
            if self.work is None:
                self.buf.append(torch.empty(self.shape))
            elif self.scratch:
                self.buf.append(self.work.tensor(self.shape))
            else:
                self.buf.append(self.work.output(self.shape, torch.float32, (self.name, self.row0)))
        v = self.buf[0]
        for axis, n in enumerate(shape):
            v = v.narrow(axis, 0, n)
        return v


class Workspace:
    """Memory reused by ``grow_tensor`` from one tensor to the next. Fresh memory costs a page fault
    per 4 KB on first touch - several times the arithmetic - so:

    * ``tensor``: a float32 block per producing thread, in which every tensor with another output
      dtype is built (its float32 result is rounded into the output, so the block is free again);
    * ``source``: a block per producing thread that each tensor's source is read into;
    * ``output``: the output tensors themselves, in blocks handed back by ``recycle(t)`` once ``t``
      is written (``checkpoint.save(..., recycle=)``); up to KEEP idle blocks are kept. Outputs
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
        (``checkpoint.save(place=)``)."""
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


class Step:
    raw = False  # takes the source tensor in its stored dtype (float32 / bfloat16 / float16), converting exactly
    row_local = False  # on a 2-D tensor with the residual axis last, row r of the result is made from row r alone
    rounds = False  # as the last step, rounds its result into ``Ctx.out`` when given one (and returns it)

    def apply(self, t: torch.Tensor, c: Ctx) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self, plan: Plan, spec: TensorSpec) -> str:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class GateZero(Step):
    def apply(self, t, c):
        return torch.zeros(1)

    def describe(self, plan, spec):
        return "warm-up gate = 0"


@dataclass(frozen=True)
class Keep(Step):
    why: str = ""

    def apply(self, t, c):
        return t

    def describe(self, plan, spec):
        return "keep" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class NormGain(Step):
    uniform: bool  # gains folded into the readers: every dim sqrt(d/D)
    offset: float = 0.0  # the stored gain is w with effective gain offset + w (Gemma)
    extra: float = 1.0  # a further factor (the final norm of a tied, embedding-scaled head)

    def apply(self, t, c):
        g = ops.grow_norm_gain(t + self.offset, c.plan.cfg.width, uniform=self.uniform) * self.extra
        return g - self.offset

    def describe(self, plan, spec):
        text = "uniform sqrt(d/D) (gain folded into readers)" if self.uniform else "gain * sqrt(d/D), new = mean"
        if self.offset:
            text = text.replace("gain", f"({self.offset:g} + w)", 1) + f", stored as w = gain - {self.offset:g}"
        return text + (f", x {self.extra:.6g} (tied head scale)" if self.extra != 1.0 else "")


@dataclass(frozen=True)
class UnitNormGain(Step):
    """A norm over all units at once (OLMo-2's q/k norms): new units enter with zero activations,
    so the RMS over n' units is sqrt(n/n') times the old one; old gains absorb it."""

    def apply(self, t, c):
        kind = c.spec.units[0]
        e, block = c.plan.units[c.layer][kind], unit_count(c.plan.src, kind)[1]
        out = ops.expand_axis(t + c.plan.offset, 0, e, block)
        out[: e.n * block] *= (e.n / e.n_new) ** 0.5
        return out - c.plan.offset

    def describe(self, plan, spec):
        return "old gains * sqrt(n/n'), new units as their sources"


@dataclass(frozen=True)
class ZeroNewUnits(Step):
    """New units' rows (or biases) zero: they must not change a norm shared with the old units."""

    def apply(self, t, c):
        for _, e, block, seg in _grown_segments(t, c):
            seg.narrow(c.spec.unit_axis, e.n * block, e.added * block).zero_()
        return t

    def describe(self, plan, spec):
        return "new units 0 (shared q/k norm)"


@dataclass(frozen=True)
class Scale(Step):
    factor: float
    why: str
    row_local = True

    def apply(self, t, c):
        if c.buf and t.untyped_storage().data_ptr() == c.buf[0].untyped_storage().data_ptr():
            return t.mul_(self.factor)  # the grown tensor's own memory: scale in place
        return t * self.factor

    def describe(self, plan, spec):
        return f"x {self.factor:.6g} ({self.why})"


@dataclass(frozen=True)
class PadZero(Step):
    def apply(self, t, c):
        return ops.grow_norm_bias(t, c.plan.cfg.width)

    def describe(self, plan, spec):
        return "keep, new = 0"


@dataclass(frozen=True)
class FoldGain(Step):
    norm: str  # pattern of the norm feeding the reader
    raw = True
    row_local = True

    def apply(self, t, c):
        gain = c.get(self.norm.format(i=c.layer) + ".weight").float() + c.plan.offset
        return ops.fold_gain(t, gain, c.spec.res_axis, out=c.canvas(t.shape))

    def describe(self, plan, spec):
        return "fold gain"


@dataclass(frozen=True)
class ExpandUnits(Step):
    writer: bool  # writers take the Net2Net split of copied units
    raw = True

    def apply(self, t, c):
        plan, spec = c.plan, c.spec
        if c.rows_from is not None:  # a block of rows already gathered from the source (``_row_blocks``)
            out = c.canvas(t.shape)
            if not ops.same_view(out, t):
                out.copy_(t)  # the source's rows, converted exactly
            zero = torch.nonzero(c.rows_from < 0).squeeze(1)  # units grown by "zero"
            return out.index_fill_(0, zero, 0.0) if zero.numel() else out
        counts = [unit_count(plan.src, k) for k in spec.units]
        shape = list(t.shape)
        shape[spec.unit_axis] = sum(plan.units[c.layer][k].n_new * b for k, (_, b) in zip(spec.units, counts))
        out = c.canvas(shape)
        if len(spec.units) > 1 and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            t = t.clone()  # the kinds' segments move: read them before they are overwritten
        off_in = off_out = 0
        for kind, (n, block) in zip(spec.units, counts):
            e = plan.units[c.layer][kind]
            seg = ops.expand_axis(
                t.narrow(spec.unit_axis, off_in, n * block),
                spec.unit_axis,
                e,
                block,
                out=out.narrow(spec.unit_axis, off_out, e.n_new * block),
            )
            if self.writer and plan.split[c.layer].get(kind) is not None:
                ops.scale_axis(seg, spec.unit_axis, plan.split[c.layer][kind], block, inplace=True)
            off_in += n * block
            off_out += e.n_new * block
        return out

    def source_rows(self, plan: Plan, spec: TensorSpec, layer: int) -> torch.Tensor | None:
        """The source row each grown row copies (-1: a row of zeros), when the unit axis is the rows
        (readers) and the growth only copies units (old units, "tile", "copy", "zero"): the tensor is
        then grown by blocks of rows, each gathered from the source (``_row_blocks``). None for
        mixtures of units ("convex", "mean") and for writers."""
        if self.writer or spec.unit_axis != 0:
            return None
        parts, off_in = [], 0
        for kind in spec.units:
            e, (n, block) = plan.units[layer][kind], unit_count(plan.src, kind)
            if e.added and e.kind not in ("tile", "copy", "zero"):
                return None
            parts.append(torch.arange(off_in, off_in + n * block))
            if e.added and e.kind == "zero":
                parts.append(torch.full((e.added * block,), -1))
            elif e.added:
                parts.append(off_in + (e.index[:, 0:1] * block + torch.arange(block)).reshape(-1))
            off_in += n * block
        return torch.cat(parts)

    def describe(self, plan, spec):
        kinds = plan.units[0]  # the same expansion kinds in every block
        split = self.writer and any(plan.split[0].get(k) is not None for k in spec.units)
        return "units " + "/".join(sorted({kinds[k].kind for k in spec.units})) + (" split" if split else "")


@dataclass(frozen=True)
class ExpandResidual(Step):
    key: str  # the residual expansion: "attn" / "ffn" (recipe columns), "zero", "mean"
    tile: bool = False  # units grown by "tile" live in the new-new block
    raw = True
    row_local = True

    def apply(self, t, c):
        plan, spec = c.plan, c.spec
        e = plan.res[self.key]
        shape = list(t.shape)
        shape[spec.res_axis] = e.n_new
        out = ops.expand_axis(t, spec.res_axis, e, out=c.canvas(shape))
        if self.tile:
            _tile_into_new_block(out, t, spec, plan, c.layer, c.row0)
        return out

    def describe(self, plan, spec):
        kind = plan.res[self.key].kind
        text = {"zero": "pad 0", "mean": "mean fill"}.get(kind, f"new cols {kind}")
        return text + (", tiled new-new block" if self.tile and _tiles(plan, spec) else "")


@dataclass(frozen=True)
class ZeroOldWrites(Step):
    def apply(self, t, c):
        plan, spec = c.plan, c.spec
        if plan.res[spec.group].kind == "zero":
            return t  # the new dims were padded with zeros (``ExpandResidual``): nothing to clear
        kind = spec.units[0]
        n_base = (plan.cfg.base_heads if kind == "q" else plan.cfg.base_ffn) * unit_count(plan.src, kind)[1]
        d, D = plan.src.width, plan.cfg.width
        t.narrow(spec.res_axis, d, D - d).narrow(spec.unit_axis, 0, n_base).zero_()
        return t

    def describe(self, plan, spec):
        return "old units write 0 to new dims"


@dataclass(frozen=True)
class Rotate(Step):
    row_local = True

    def apply(self, t, c):
        return ops.rotate_(t, c.plan.src.width, c.plan.eps, c.spec.res_axis)

    def describe(self, plan, spec):
        return f"R({plan.eps:.4g})"


@dataclass(frozen=True)
class PadRotate(Step):
    """``parts`` = ExpandResidual padding the new dims with 0 (units grown by "tile" in the new-new
    block), [ZeroOldWrites,] Rotate, done at once and rounded into the output (``Ctx.out``) - the
    same bytes as running ``parts`` and rounding (``ops.rotate_half_into``). Every vector along
    the residual axis is [x; 0], or [0; tile(x)] for a tiled unit, so its zero half is never added
    to or converted, nor, with the residual axis last (readers, embedding, head), written or summed:
    a third of the elements of the FFN and the embedding (bf16 1 GB: bench/README, round 9).
    Writers [out, in] still write and sum the zeros (``ops.rotate_half_into``: ``sums``)."""

    parts: tuple
    row_local: bool = True
    raw = True
    rounds = True

    def apply(self, t, c):
        plan, spec, ax = c.plan, c.spec, c.spec.res_axis
        if isinstance(plan.eps, torch.Tensor):  # a learned angle (learned.py): differentiable, through the parts
            for step in self.parts:
                t = step.apply(t, c)
            return t
        d, D, ua = plan.src.width, plan.cfg.width, spec.unit_axis
        shape = list(t.shape)
        shape[ax] = D
        grown = c.canvas(shape)  # float32: the output itself, or scratch
        x = c.canvas(t.shape)  # its leading d residual entries
        if not ops.same_view(x, t):
            x.copy_(t)  # the source's entries, converted exactly
        out = c.out if c.out is not None else grown
        sums = None
        if ax != t.dim() - 1:  # vectors along a strided axis (writers [out, in]): summed whole (ops.rotate_half_into)
            self.parts[0].apply(x, c)  # the zeros and tiles written into ``grown``
            sums = ops.rotation_sums(grown, d, ax)
        tiled = self.parts[0].tile and _tiled_ranges(plan, spec, c.layer, c.row0, t.shape[ua])
        if not tiled:  # every vector [x; 0]
            return ops.rotate_half_into(out, x, d, plan.eps, ax, zero_new=True, sums=sums)
        n, done = t.shape[ua], 0
        for lo, hi in tiled + [(n, n)]:
            if lo > done:  # [x; 0]
                part = (ua, done, lo - done)
                cut = sums and tuple(v.narrow(*part) for v in sums)
                ops.rotate_half_into(out.narrow(*part), x.narrow(*part), d, plan.eps, ax, True, cut)
            if hi > lo:  # [0; y], y the units' old entries tiled over the new dims
                part = (ua, lo, hi - lo)
                y = grown.narrow(*part).narrow(ax, d, D - d)
                if sums is None:
                    ops.tile_into(y, x.narrow(*part), ax)
                cut = sums and tuple(v.narrow(*part) for v in sums)
                ops.rotate_half_into(out.narrow(*part), y, d, plan.eps, ax, False, cut)
            done = hi
        return out

    def describe(self, plan, spec):
        return ", ".join(s.describe(plan, spec) for s in self.parts)


def _fuse_pad_rotate(steps: list[Step], plan) -> list[Step]:
    """``steps`` with a trailing ExpandResidual that pads zeros, [ZeroOldWrites (a no-op then),]
    Rotate made into one PadRotate."""
    for k in (2, 3):
        tail = steps[-k:]
        if (
            len(steps) >= k
            and isinstance(tail[0], ExpandResidual)
            and plan.res[tail[0].key].kind == "zero"
            and isinstance(tail[-1], Rotate)
            and all(isinstance(s, ZeroOldWrites) for s in tail[1:-1])
        ):
            return steps[:-k] + [PadRotate(tuple(tail), row_local=all(s.row_local for s in tail))]
    return steps


@dataclass(frozen=True)
class BreakSymmetry(Step):
    """Recipe ``noise``: noise on new units that keeps the function at gate 0 (ops.break_symmetry_).
    Readers: the rows of new units whose outputs are gated, or whose writes are zero. Writers: the
    columns of Net2Net split copies, +delta on each copy and -delta on its source. The scale is
    ``noise`` x the RMS of the grown tensor; the draw depends only on the plan's seed and the name."""

    writer: bool

    def apply(self, t, c):
        plan, spec = c.plan, c.spec
        sigma = plan.recipe["noise"] * float(t.pow(2).mean().sqrt())
        gen = torch.Generator().manual_seed(plan.seed * 1_000_003 + zlib.crc32(c.name.encode()))
        for kind, e, block, seg in _grown_segments(t, c):
            if _noisy(plan, spec, c.layer, kind, self.writer):
                ops.break_symmetry_(seg, spec.unit_axis, e, block, sigma, gen, paired=self.writer)
        return t

    def describe(self, plan, spec):
        what = "+/- pairs on split copies" if self.writer else "on new units (gate 0)"
        return f"noise {plan.recipe['noise']:g} x rms {what}"


def _grown_segments(t: torch.Tensor, c: Ctx):
    """(kind, expansion, block, view of ``t``) for each unit kind of a grown tensor, in order along
    the unit axis (a fused qkv / gate_up tensor holds several kinds)."""
    off = 0
    for kind in c.spec.units:
        e, block = c.plan.units[c.layer][kind], unit_count(c.plan.src, kind)[1]
        yield kind, e, block, t.narrow(c.spec.unit_axis, off, e.n_new * block)
        off += e.n_new * block


def _noisy(plan, spec, layer: int, kind: str, writer: bool) -> bool:
    """Whether BreakSymmetry touches a unit kind of a tensor: writers of split copies; readers of new
    units that are gated or write zeros (never q/k rows under a q/k norm shared by all heads)."""
    e = plan.units[layer][kind]
    if not e.added:
        return False
    if writer:
        return plan.split[layer].get(kind) is not None
    gated_or_dead = plan.recipe["gate"] or ops.KINDS[e.kind].dead
    return gated_or_dead and spec.qk_norm != "full"


def _symmetry(plan, spec, writer: bool) -> list:
    """[BreakSymmetry] where the recipe asks for noise and some unit kind of this tensor takes it."""
    if not plan.recipe.get("noise") or not any(_noisy(plan, spec, 0, k, writer) for k in spec.units):
        return []
    return [BreakSymmetry(writer)]


def _tiles(plan, spec) -> bool:
    return any(ops.KINDS[plan.units[0][k].kind].fills_new_new_block and plan.units[0][k].added for k in spec.units)


def _tile_into_new_block(
    out: torch.Tensor, t_units: torch.Tensor, spec: TensorSpec, plan, layer: int, row0: int = 0
) -> None:
    """Units grown by "tile" live in the new residual dims only (in place on ``out``).

    Their weights on the old residual dims are 0 and those on the new dims are the old matrix
    tiled and cropped: the new-new block of the grown matrix is W[i mod n, j mod d]. Such units
    pass through the gate, so the function at gate 0 is unchanged whatever they hold. ``out`` and
    ``t_units`` may be a block of rows (the unit axis) starting at unit row ``row0``.
    """
    d, D = plan.src.width, plan.cfg.width
    for lo, hi in _tiled_ranges(plan, spec, layer, row0, out.shape[spec.unit_axis]):
        dst = out.narrow(spec.unit_axis, lo, hi - lo)  # may hold t_units' rows in its first d columns:
        src = t_units.narrow(spec.unit_axis, lo, hi - lo).narrow(spec.res_axis, 0, d)
        ops.tile_into(dst.narrow(spec.res_axis, d, D - d), src, spec.res_axis)  # new column j = old j mod d,
        dst.narrow(spec.res_axis, 0, d).zero_()  # read before they are zeroed


def _tiled_ranges(plan, spec: TensorSpec, layer: int, row0: int, rows: int) -> list[tuple[int, int]]:
    """[lo, hi) along the unit axis of the units grown by "tile", within ``rows`` units from ``row0``."""
    ranges, off = [], 0
    for kind in spec.units:
        e, block = plan.units[layer][kind], unit_count(plan.src, kind)[1]
        if ops.KINDS[e.kind].fills_new_new_block and e.added:
            lo = max(off + e.n * block, row0) - row0  # the new units' rows within this block
            hi = min(off + e.n_new * block, row0 + rows) - row0
            if hi > lo:
                ranges.append((lo, hi))
        off += e.n_new * block
    return ranges


# ---- the plan -------------------------------------------------------------------------------


@dataclass
class Plan:
    src: ModelConfig
    cfg: ModelConfig  # the grown config
    recipe: dict
    seed: int
    eps: float  # cos of the SRIO angle actually used (1 = no rotation)
    rotate_readers: bool  # RMSNorm with a real rotation: readers take R^T, norm gains fold into them
    residual_map: str  # the residual map chosen, and why
    lossy: list[str]  # reasons the function is not kept (empty = exact at gate 0)
    units: list[dict]  # per block: unit kind -> Expansion
    split: list[dict]  # per block: unit kind -> writer multipliers (Net2Net split) or None
    res: dict  # residual expansions: "attn", "ffn", "tile", "zero", "mean"
    dtype: torch.dtype
    specs: dict = field(default_factory=dict)  # output name -> (TensorSpec, layer or None)
    steps: dict = field(default_factory=dict)  # output name -> [Step]
    shapes: dict = field(default_factory=dict)  # output name -> grown shape
    warnings: list[str] = field(default_factory=list)  # exact, but probably not what the user wants

    @property
    def exact(self) -> bool:
        return not self.lossy

    @property
    def offset(self) -> float:
        return arch_of(self.src).features.norm_offset

    def outputs(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(n, shp, self.dtype) for n, shp in expected_shapes(self.cfg).items()]

    def pieces(self, name: str) -> list[tuple[int, int]] | None:
        """The row ranges (r0, n) in which a streaming writer makes ``name`` (``checkpoint.save(
        pieces=)``, ``grow_tensor(..., rows=)``): a tensor of more than PIECE grown elements whose
        steps are all row-local (the embedding and the head), so that no vocabulary-sized block
        is needed and its first rows are written while the last are grown. None: whole."""
        shape = self.shapes.get(name)
        gathers = any(isinstance(s, ExpandUnits) for s in self.steps[name])  # rows that are not the source's
        if gathers or _whole_steps(self, name, shape) != 0 or shape[0] * shape[1] <= PIECE:
            return None
        rows, first = max(1, PIECE // shape[1]), max(1, ROW_BLOCK // shape[1])  # the first piece one block:
        starts = [0, *range(first, shape[0], rows)]  # the disk starts sooner (the embedding opens the file)
        return [(a, b - a) for a, b in zip(starts, starts[1:] + [shape[0]])]

    def producer_bytes(self) -> int:
        """About the most memory one producing thread holds while it makes a tensor (``Workspace``):
        the float32 tensor it builds a whole tensor in when the output is in another dtype (for a
        float32 output that tensor is the output itself), or one block of rows; plus the source
        read and its float32 copy (6 bytes per element for a 2-byte dtype; 4 for float32, whose
        copy is the read itself)."""
        old, most = expected_shapes(self.src), 0
        for name, shape, _ in self.outputs():
            steps = self.steps[name]
            pieces = self.pieces(name)
            rows = pieces[0][1] if pieces else shape[0]
            src = math.prod(old[name]) * rows // shape[0] if name in old else 0
            if _whole_steps(self, name, shape) < len(steps):
                f32 = 4 * ROW_BLOCK
            else:
                f32 = 4 * math.prod(shape) if self.dtype != torch.float32 else 0
            most = max(most, f32 + src * (4 if self.dtype == torch.float32 else 4 + self.dtype.itemsize))
        return most

    def producers(self, threads: int, resident: int = 256 << 20) -> int:
        """How many of ``threads`` may produce tensors at once (``checkpoint.save(workers=)``) within
        the memory bound of a streaming expand, 3 x the largest output tensor + 0.5 GB. The writer
        holds up to 2 x that tensor (``checkpoint.write_stream``); ``resident`` is what the process
        holds before the work (the interpreter and torch: 227 MB with torch's CPU build, 496 MB
        with a CUDA build); the producers get the rest, 1 x that tensor + 0.5 GB - ``resident``,
        and at least one producer. (Without this cap a d4096 bf16 model on 8 producers would need
        about 6 GB against a bound of 1.7 GB.)"""
        largest = max(math.prod(shape) * self.dtype.itemsize for _, shape, _ in self.outputs())
        room = largest + (512 << 20) - resident
        return max(1, min(threads, room // max(1, self.producer_bytes())))

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(tensor pattern, old shape, new shape, operation) - one row per pattern, from the steps."""
        old, new = expected_shapes(self.src), expected_shapes(self.cfg)
        seen, out = set(), []
        for name, (spec, _) in self.specs.items():
            if spec.pattern in seen:
                continue
            seen.add(spec.pattern)
            o = "x".join(map(str, old[name])) if name in old else "-"
            op = ", ".join(s.describe(self, spec) for s in self.steps[name])
            out.append((spec.pattern, o, "x".join(map(str, new[name])), op))
        return out


def embed_factor(plan: Plan) -> float:
    """Embeddings scaled by sqrt(width) inside the model (Gemma): the grown embedding takes
    sqrt(d)/sqrt(D), each rounded to the output dtype as the model rounds it, so the scaled
    embedding is the old one. 1 where the architecture has no embedding scale."""
    if not arch_of(plan.src).features.embed_scale:
        return 1.0

    def s(w):
        return float(torch.tensor(w**0.5).to(plan.dtype))

    return s(plan.src.width) / s(plan.cfg.width)


def qk_scale(plan: Plan, spec: TensorSpec) -> float:
    """Scale of q/k rows that keeps a q/k RMSNorm exact although the config's single norm eps was
    multiplied by d/D for the residual norms. RMSNorm is scale-invariant except for eps: scaling
    its input by s turns eps' = eps d/D into eps d/D / s^2. A norm over n -> n' elements whose new
    ones are zero (OLMo-2's q/k norms over all heads) sees a mean square n/n' times the old one,
    so it needs eps n/n' there: s^2 = (d/D) (n'/n). Per head (Qwen3, Gemma 3) n' = n: s^2 = d/D."""
    s2 = plan.src.width / plan.cfg.width
    if spec.qk_norm == "full":
        n_old, n_new = (unit_count(plan.src, spec.units[0])[0], unit_count(plan.cfg, spec.units[0])[0])
        s2 *= n_new / n_old
    return s2**0.5


def tensor_steps(spec: TensorSpec, name: str, plan: Plan) -> list[Step]:
    """The steps that make the grown tensor ``name`` from its source."""
    return _fuse_pad_rotate(_steps(spec, name, plan), plan)


def _steps(spec: TensorSpec, name: str, plan: Plan) -> list[Step]:
    role, rot = spec.role, [Rotate()] if plan.eps != 1.0 else []
    a, f = arch_of(plan.src), embed_factor(plan)
    if role == "growth_gate":
        return [GateZero()]
    if role == "norm_gain":
        extra = 1.0 / f if (plan.src.tie and spec.pattern == a.modules["final_norm"] + ".weight") else 1.0
        return [NormGain(uniform=plan.rotate_readers, offset=plan.offset, extra=extra)]
    if role == "norm_bias":
        return [PadZero()]
    if role == "head_norm":
        return [Keep("over head_dim, which is fixed")]
    if role == "unit_norm":
        return [UnitNormGain()]
    if role in ("embedding", "writer_bias"):
        if _mean_filled(name, plan):
            return [ExpandResidual("mean")]
        scale = [Scale(f, "embedding scale sqrt(d)/sqrt(D)")] if (name == a.embed and f != 1.0) else []
        return [ExpandResidual("zero")] + scale + rot
    qk = []  # q/k feeding a q/k norm: see qk_scale; new units must not move a norm shared by all units
    if spec.qk_norm:
        qk = [Scale(qk_scale(plan, spec), "q/k norm eps")] + ([ZeroNewUnits()] if spec.qk_norm == "full" else [])
    if role == "unit_bias":
        return [ExpandUnits(writer=False)] + qk
    fold = [FoldGain(spec.norm)] if plan.rotate_readers else []
    rrot = rot if plan.rotate_readers else []
    if role == "head":
        return fold + [ExpandResidual("zero")] + rrot
    if role == "reader":
        steps = fold + [ExpandUnits(writer=False)] + qk + [ExpandResidual(spec.group, tile=True)] + rrot
        return steps + _symmetry(plan, spec, writer=False)
    if role == "writer":
        steps = [ExpandUnits(writer=True), ExpandResidual(spec.group, tile=True), ZeroOldWrites()] + rot
        return steps + _symmetry(plan, spec, writer=True)
    raise AssertionError(role)  # pragma: no cover - the architecture tables only use the roles above


def _mean_filled(name: str, plan) -> bool:
    """The tied LayerNorm embedding is also the head: its new columns take the mean (LEMON)."""
    return plan.src.norm == "layernorm" and plan.src.tie and name == arch_of(plan.src).embed


def _heads_for(src: ModelConfig, D: int) -> int:
    """Query heads for width D when --heads is not given. Where heads must fill the width, D /
    head_dim; else D / head_dim if that keeps whole KV groups and the source had heads x head_dim
    == width; else the whole-KV-group count nearest to heads x D / d (ties upward)."""
    hd, r = src.head_dim, src.heads // src.kv_heads
    if not arch_of(src).features.free_head_dim:
        if D % hd:
            raise GrowError(f"target width {D} is not a multiple of head_dim {hd}")
        return D // hd
    if src.heads * hd == src.width and D % hd == 0 and (D // hd) % r == 0:
        return D // hd
    want = src.heads * D / src.width
    lo = max(src.heads, int(want // r) * r)
    return min((lo, lo + r), key=lambda h: (abs(h - want), -h))


def target_config(src: ModelConfig, width: int, ffn: int | None, heads: int | None) -> ModelConfig:
    d, D = src.width, width
    if not isinstance(D, int) or D <= d:
        raise GrowError(f"target width {D} is not larger than the source width {d}")
    hd, r = src.head_dim, src.heads // src.kv_heads
    bound = not arch_of(src).features.free_head_dim
    if heads is None:
        heads = _heads_for(src, D)
    if bound and heads * hd != D:
        raise GrowError(f"target width {D} is not heads x head_dim ({heads} x {hd}); {src.family} needs them equal")
    if heads < src.heads:
        raise GrowError(f"target heads {heads} fewer than the source's {src.heads}")
    if heads % r:
        ok = [h for h in range(src.heads, 2 * heads + r) if h % r == 0][:4]
        raise GrowError(
            f"target heads {heads} not a multiple of the {r} query heads per KV head "
            f"(pass --heads {' or '.join(map(str, ok))})"
        )
    if bound and (D // hd) % r:
        raise GrowError(f"width {D} gives {D // hd} heads, not a multiple of {r} query heads per KV head")
    if ffn is None:
        ffn = round(src.ffn * D / d)
    if ffn < src.ffn:
        raise GrowError(f"target ffn {ffn} smaller than the source's {src.ffn}")
    return src.replace(
        width=D, heads=heads, kv_heads=heads // r, ffn=ffn, norm_eps=ops.grow_norm_eps(src.norm_eps, d, D)
    )


def residual_map(src: ModelConfig, D: int, eps) -> tuple[float, str, list[str]]:
    """(eps, the map and why, reasons it is lossy) for the recipe's ``rotation.eps``.

    LayerNorm removes the residual mean: only R(sqrt(d/D)) (or mean fill) keeps it exact.
    RMSNorm commutes with any rotation once gains fold into the readers - unless the head is the
    tied embedding, which cannot take the final norm's gain: then only eps 1 (zero padding).
    """
    exact = ops.exact_layernorm_eps(src.width, D)
    tied_rms = src.norm == "rmsnorm" and src.tie
    post = arch_of(src).features.post_norms
    if eps == "auto":
        eps = 1.0 if (tied_rms or post) else exact
    eps, lossy = float(eps), []
    if post:
        exact_map = (
            "eps 1 (zero padding): norms on sublayer outputs put their gains on residual coordinates, "
            "which no rotation passes; every norm gain is rescaled by sqrt(d/D)"
        )
        if eps != 1.0:
            lossy.append(
                "post-norm gains sit on residual coordinates, so only eps=1 (no rotation) keeps the function, "
                f"not eps={eps:g}"
            )
    elif src.norm == "layernorm":
        exact_map = f"R({exact:.4f}) = R(sqrt(d/D)): LayerNorm removes the mean, and only this angle maps it onto 1_D"
        if abs(eps - exact) > 1e-9:
            lossy.append(
                f"LayerNorm cannot absorb rotation eps={eps:g}: only the exact angle eps=sqrt(d/D)={exact:.6f} "
                "keeps the function"
            )
    elif tied_rms:
        exact_map = (
            "eps 1 (zero padding): a tied RMSNorm head cannot absorb a rotation "
            "(the final norm's gain cannot fold into the embedding)"
        )
        if eps != 1.0:
            lossy.append(
                "a tied head cannot take the final RMSNorm gain, so only eps=1 (no rotation) keeps the function, "
                f"not eps={eps:g}"
            )
    elif eps == 1.0:
        exact_map = (
            "eps 1 (zero padding), as the recipe asks: RMSNorm commutes with any rotation, the identity included"
        )
    else:
        exact_map = f"R({eps:.4f}): RMSNorm commutes with any rotation once its gains fold into the readers"
    why = exact_map if not lossy else f"R({eps:.4f}) as the recipe asks: LOSSY, the exact map is {exact_map}"
    return eps, why, lossy


def build_plan(
    src: ModelConfig,
    recipe: dict,
    width: int,
    ffn: int | None = None,
    heads: int | None = None,
    seed: int = 0,
    allow_lossy: bool = False,
    dtype: torch.dtype = torch.float32,
    gate_values: list[float] | None = None,
) -> Plan:
    cfg = target_config(src, width, ffn, heads)
    eps, why, lossy = residual_map(src, width, recipe["rotation"]["eps"])
    gated = recipe["gate"]
    if src.gated:
        if not gated:
            raise GrowError(
                f"recipe {recipe['name']!r} adds ungated units but the source has growth gates: "
                "fold it first (growtool fold --alpha 0|1)"
            )
        if gate_values and any(v != 0.0 for v in gate_values):
            raise GrowError(
                f"the source's growth gates are open (values up to {max(gate_values):g}): "
                "fold it first (growtool fold --alpha ...)"
            )
    if gated:
        cfg = cfg.replace(base_heads=src.base_heads, base_ffn=src.base_ffn)
    else:
        cfg = cfg.replace(base_heads=cfg.heads, base_ffn=cfg.ffn)
        if arch_of(src).features.qk_norm == "full" and cfg.heads > src.heads:
            lossy.append(
                "new heads written without a warm-up gate must start with zero q/k rows (the q/k norm is "
                "shared by all heads), so split copies no longer compute their sources' outputs"
            )
        for sec, key in (("attention", "new_heads"), ("ffn", "new_units")):
            mode = recipe[sec][key]
            added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
            if added and not ops.KINDS[mode].exact_without_gate:
                lossy.append(f"new {sec} units filled by {mode!r} write without a warm-up gate")
    k = recipe["convex_k"]
    units, split = [], []
    r = src.heads // src.kv_heads
    for i in range(src.layers):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        kv = ops.make_expansion(recipe["attention"]["new_heads"], src.kv_heads, cfg.kv_heads, gen, k)
        q = ops.group_to_heads(kv, r)
        f = ops.make_expansion(recipe["ffn"]["new_units"], src.ffn, cfg.ffn, gen, k)
        units.append({"q": q, "kv": kv, "qkv": q, "qgate": q, "ffn": f})
        split.append(
            {
                kind: ops.split_factors(e) if (not gated and ops.KINDS[e.kind].splits_writers) else None
                for kind, e in (("q", q), ("ffn", f))
            }
        )
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    d, D = src.width, cfg.width
    res = {
        "attn": ops.make_expansion(recipe["attention"]["new_columns"], d, D, gen, k),
        "ffn": ops.make_expansion(recipe["ffn"]["new_columns"], d, D, gen, k),
        "tile": ops.make_expansion("tile", d, D, gen),
        "zero": ops.make_expansion("zero", d, D, gen),
        "mean": ops.make_expansion("mean", d, D, gen),
    }
    warnings = []
    for sec, key, what in (("attention", "new_heads", "heads"), ("ffn", "new_units", "FFN neurons")):
        added = (cfg.heads > src.heads) if sec == "attention" else (cfg.ffn > src.ffn)
        if added and ops.KINDS[recipe[sec][key]].dead:
            warnings.append(
                f"new {what} are all zeros ({sec}.{key}: zero): their inputs and outputs sit at a "
                "zero-gradient saddle, so training never moves them (dead capacity)"
            )
    if recipe["lossy"] is False and lossy and not allow_lossy:
        raise GrowError(f"refused: {lossy[0]} (pass --allow-lossy to grow anyway)")
    plan = Plan(
        src,
        cfg,
        recipe,
        seed,
        eps,
        src.norm == "rmsnorm" and eps != 1.0,
        why,
        lossy,
        units,
        split,
        res,
        dtype,
        warnings=warnings,
    )
    for name, spec in tensor_specs(cfg).items():
        layer = None
        if "{i}" in spec.pattern:
            layer = int(name[len(spec.pattern.split("{i}")[0]) :].split(".")[0])
        plan.specs[name] = (spec, layer)
        plan.steps[name] = tensor_steps(spec, name, plan)
    plan.shapes.update(expected_shapes(cfg))
    return plan


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
    at a time (``_row_blocks``). ``rows=(r0, n)``, one of ``plan.pieces(name)``: only those rows
    of the grown tensor, from the same rows of the source (``get(name, rows=)``)."""
    spec, layer = plan.specs[name]
    steps, shape = plan.steps[name], plan.shapes.get(name)
    if rows is not None:
        if rows not in (plan.pieces(name) or []):
            raise ValueError(f"{name}: rows {rows} are not one of plan.pieces({name!r})")
        shape = (rows[1], *shape[1:])
    held = {}

    def get_once(n):  # a norm gain read by every block: read (and checked) once
        if n not in held:
            held[n] = get(n)
        return held[n]

    if spec.role == "growth_gate":
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
PIECE = 8 * ROW_BLOCK  # grown elements of a piece of a large row-local tensor (``Plan.pieces``)


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
    the writer. (The embedding and the head come in pieces of fewer blocks, ``Plan.pieces``, which
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

    errors: list[BaseException] = []

    def guarded(first: int, last: int) -> None:
        try:
            run(first, last)
        except BaseException as e:  # raised in the calling thread below
            errors.append(e)

    blocks = len(spans)
    split = c.work is not None and blocks >= 16
    with c.work.lend_threads(min(c.work.threads, blocks)) if split else contextlib.nullcontext(1) as parts:
        bounds = [blocks * k // parts for k in range(parts + 1)]
        helpers = [threading.Thread(target=guarded, args=bounds[k : k + 2], daemon=True) for k in range(1, parts)]
        for h in helpers:
            h.start()
        guarded(bounds[0], bounds[1])
        for h in helpers:
            h.join()
    if errors:
        raise errors[0]
    return out


def _runs(src_rows: torch.Tensor) -> list[tuple[int, int, int]]:
    """(first row, its source row or -1, length) of each run of rows copying consecutive source rows
    (-1: a run of zero rows)."""
    starts = [0] + (torch.nonzero(src_rows.diff() != 1).squeeze(1) + 1).tolist() + [src_rows.numel()]
    return [(a, int(src_rows[a]), b - a) for a, b in zip(starts, starts[1:]) if b > a]


_EXACT_IN_F32 = (torch.float32, torch.bfloat16, torch.float16)  # converted to float32 without rounding


def lineage_entry(plan: Plan, source_sha256: str) -> dict:
    from growtool import __version__

    return {
        "op": "expand",
        "source_sha256": source_sha256,
        "width_from": plan.src.width,
        "width_to": plan.cfg.width,
        "heads": [plan.src.heads, plan.cfg.heads],
        "ffn": [plan.src.ffn, plan.cfg.ffn],
        "recipe": plan.recipe["name"],
        "recipe_full": plan.recipe,
        "eps": plan.eps,
        "residual_map": plan.residual_map,
        "seed": plan.seed,
        "exact": plan.exact,
        "growtool": __version__,
    }


def gate_values(ck: Checkpoint) -> list[float]:
    if not ck.config.gated:
        return []
    a = arch_of(ck.config)
    return [float(ck.get(a.gate_name(i))[0]) for i in range(ck.config.layers)]


# ---- fold ---------------------------------------------------------------------------------


def fold_config(cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(base_heads=cfg.heads, base_ffn=cfg.ffn, new_layers=None)


def fold_tensor(
    name: str, cfg: ModelConfig, alpha: float, get, dtype: torch.dtype, work: Workspace | None = None
) -> torch.Tensor:
    """Bake gate ``alpha`` into the writers: gated units' output weights times alpha.

    A gated unit's write is gate * W_col * h; with the gate fixed at alpha, alpha * W_col is the same
    function without a gate, so the folded model is a plain checkpoint.

    With a ``work`` space (``get`` then takes ``into=``, as ``Checkpoint.get``) the result is made in
    one of its output blocks, placed for the writer (hand it back with ``work.recycle`` once
    written): a source whose elements have the output's size is read straight into that block (and
    scaled or converted there through this thread's float32 block); any other source is read into
    this thread's source block. The same bytes, without fresh memory or a copy per tensor.
    """
    if cfg.new_layers:  # blocks added by depth growth: their gate goes into writers or post-norms
        from growtool.grow import depth

        width_only = cfg.replace(new_layers=None)
        t = depth.fold_new_block_tensor(
            name, cfg, alpha, get, dtype, lambda n, dt: fold_tensor(n, width_only, alpha, get, dt)
        )
        if t is not None:
            return t
        cfg = width_only
    spec = tensor_specs(cfg)[name]
    part = None  # (axis, start, length) of the gated units' weights
    if spec.role == "writer":
        kind = spec.units[0]
        base = cfg.base_heads if kind == "q" else cfg.base_ffn
        n = cfg.heads if kind == "q" else cfg.ffn
        if base != n:
            block = unit_count(cfg, kind)[1]
            part = (spec.unit_axis, base * block, (n - base) * block)
    if work is None:
        t = get(name)
        if part is None:
            return t.to(dtype)
        t = t.float().clone()
        t.narrow(*part).mul_(alpha)
        return t.to(dtype)
    key, size = (name, 0), math.prod(expected_shapes(cfg)[name]) * dtype.itemsize
    placed = []  # the output block the source was read into (never a checkpoint's own tensor)

    def into(nbytes: int) -> torch.Tensor:
        if nbytes != size:
            return work.source(nbytes)
        placed.append(work.output((nbytes,), torch.uint8, key))
        return placed[0]

    t = get(name, into=into)
    if part is None and t.dtype == dtype:
        return t  # as read: in the output's block (or a held checkpoint's tensor, as .to returns it)
    f = work.tensor(t.shape).copy_(t)
    if part is not None:
        f.narrow(*part).mul_(alpha)
    out = t.view(dtype) if placed else work.output(t.shape, dtype, key)
    return out.copy_(f)  # as .to: the same conversion


__all__ = [
    "Plan",
    "Workspace",
    "build_plan",
    "grow_tensor",
    "fold_tensor",
    "fold_config",
    "target_config",
    "residual_map",
]
