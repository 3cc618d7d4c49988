"""The steps a grown tensor is made by (the growth plan lists them per tensor; ``engine.grow_tensor``
runs them). Each is a small frozen dataclass with ``apply(t, ctx)`` and ``describe(plan, spec)``;
``Ctx`` is what a step sees of the tensor being made.

  FoldGain        fold the norm gain into a reader (rotated RMSNorm readers)
  ExpandUnits     grow the unit axis (new heads / FFN neurons) by the recipe's kind; Net2Net split
  ExpandResidual  grow the residual axis by a kind; "tile" units fill the new-new block
  ZeroOldWrites   old (ungated) units write nothing into the new residual dims
  Rotate          the SRIO rotation along the residual axis
  PadRotate       ExpandResidual by zeros + Rotate in one pass that skips the zeros (same bytes)
  BreakSymmetry   recipe ``noise``: noise on new units that keeps the function at gate 0
  CancelPairs     recipe ``pair_noise``: +/- delta (relative to the unit) on split copies' writers
  NormGain, PadZero, Keep, GateZero   norms, biases, per-head norms, warm-up gates
  NewZero         a tensor the source lacks, all zeros (recipe ``add_biases``: a zero bias adds nothing)
  Duplicate, CopyOldWrites, PermuteHeads   the duplicated residual of an embedding norm (BLOOM), ALiBi order
  RefitEmbedding, RefitEmbedNorm   an untied embedding norm's table and norm, refit for any width (BLOOM)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from growtool.grow import ops
from growtool.nn.families import TensorSpec, arch_of, unit_count

# ---- steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    plan: object  # the plan.Plan the tensor is made for (steps.py is below plan.py: no import)
    get: object  # source tensor by name
    name: str
    spec: TensorSpec
    layer: int | None
    shape: tuple | None = None  # the grown tensor's shape: steps that grow it build it in place (``canvas``)
    buf: list = field(default_factory=list)  # the float32 tensor of that shape, once allocated
    work: object = None  # an engine.Workspace: memory to build it in, reused from tensor to tensor
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


class Step:
    raw = False  # takes the source tensor in its stored dtype (float32 / bfloat16 / float16), converting exactly
    row_local = False  # on a 2-D tensor with the residual axis last, row r of the result is made from row r alone
    rounds = False  # as the last step, rounds its result into ``Ctx.out`` when given one (and returns it)
    reads = True  # as the first step, takes the tensor's source (else ``t`` is None: nothing is read)

    def apply(self, t: torch.Tensor, c: Ctx) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self, plan, spec: TensorSpec) -> str:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class GateZero(Step):
    reads = False

    def apply(self, t, c):
        return torch.zeros(1)

    def describe(self, plan, spec):
        return "warm-up gate = 0"


@dataclass(frozen=True)
class NewZero(Step):
    """A bias the source does not have: zeros (y = Wx + 0 = Wx, so the function is kept)."""

    reads = False

    def apply(self, t, c):
        return torch.zeros(c.shape)

    def describe(self, plan, spec):
        return "new: zeros (add_biases)"


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
    why: str = "tied head scale"

    def apply(self, t, c):
        g = ops.grow_norm_gain(t + self.offset, c.plan.cfg.width, uniform=self.uniform) * self.extra
        return g - self.offset

    def describe(self, plan, spec):
        text = "uniform sqrt(d/D) (gain folded into readers)" if self.uniform else "gain * sqrt(d/D), new = mean"
        if self.offset:
            text = text.replace("gain", f"({self.offset:g} + w)", 1) + f", stored as w = gain - {self.offset:g}"
        return text + (f", x {self.extra:.6g} ({self.why})" if self.extra != 1.0 else "")


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
class Duplicate(Step):
    """The residual axis copied k = D/d times, [x; ..; x] (x ``factor``): an embedding-norm family's
    residual map (``plan.residual_map``). A vector (norm gain or bias) along its only axis."""

    factor: float = 1.0
    why: str = ""
    row_local = True

    def apply(self, t, c):
        axis = c.spec.res_axis if c.spec.res_axis is not None else 0
        d, D = c.plan.src.width, c.plan.cfg.width
        shape = list(t.shape)
        shape[axis] = D
        out = c.canvas(shape)
        old = out.narrow(axis, 0, d)
        if not ops.same_view(old, t):
            if t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
                t = t.clone()  # t lives in out's memory elsewhere: read it before it is overwritten
            old.copy_(t)
        ops.tile_into(out.narrow(axis, d, D - d), old, axis)
        return out.mul_(self.factor) if self.factor != 1.0 else out

    def describe(self, plan, spec):
        k = plan.cfg.width // plan.src.width
        return f"copied x{k}" + (f", x {self.factor:.6g} ({self.why})" if self.factor != 1.0 else "")


@dataclass(frozen=True)
class CopyOldWrites(Step):
    """Old (ungated) units write the same into every copy of the residual: their new dims are copies
    of their old ones (``Duplicate``); gated new units keep what the recipe gave them."""

    def apply(self, t, c):
        plan, spec, d, D = c.plan, c.spec, c.plan.src.width, c.plan.cfg.width
        for kind, _, block, seg in _grown_segments(t, c):  # a stacked writer: one segment per expert
            old = seg.narrow(spec.unit_axis, 0, plan.cfg.base_units(kind) * block)
            ops.tile_into(old.narrow(spec.res_axis, d, D - d), old.narrow(spec.res_axis, 0, d), spec.res_axis)
        return t

    def describe(self, plan, spec):
        return "old units write copies"


@dataclass(frozen=True)
class PermuteHeads(Step):
    """Heads put at their ALiBi positions (``attention.alibi_order``): head j of the growth order goes to
    position order[j], so every old head keeps its slope in the plain model."""

    order: tuple

    def apply(self, t, c):
        kind = c.spec.units[0]
        return ops.permute_units(t, c.spec.unit_axis, self.order, unit_count(c.plan.cfg, kind)[1])

    def describe(self, plan, spec):
        return f"heads to ALiBi positions {list(self.order[: plan.src.heads])}"


@dataclass(frozen=True)
class RefitEmbedding(Step):
    """The table read by an embedding LayerNorm (untied, any width): each row refit so that the grown
    norm outputs the old row's output, centered and zero-padded (``ops.refit_embedding_rows``)."""

    row_local = True

    def apply(self, t, c):
        gain, bias = _embed_norm(c)
        out = c.canvas((t.shape[0], c.plan.cfg.width))
        return ops.refit_embedding_rows(t, gain, bias, c.plan.src.norm_eps, c.plan.cfg.width, out)

    def describe(self, plan, spec):
        return "refit: each row its old embedding-norm output, centered, + a filler on new dims (one norm)"


@dataclass(frozen=True)
class RefitEmbedNorm(Step):
    """The embedding LayerNorm over the refit rows: gain gamma on old dims, 0 on new; bias 0."""

    def apply(self, t, c):
        if c.spec.role == "norm_bias":
            return torch.zeros(c.plan.cfg.width)
        gain, bias = _embed_norm(c)
        return ops.refit_embed_norm_gain(gain, bias, c.plan.cfg.width, c.plan.cfg.norm_eps).float()

    def describe(self, plan, spec):
        return "0" if spec.role == "norm_bias" else "gamma = sqrt(eps' + B^2/D) on old dims, 0 on new"


def _embed_norm(c: Ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """The source's embedding LayerNorm gain and bias (a norm without bias: 0)."""
    name = arch_of(c.plan.src).modules["embed_norm"]
    gain = c.get(name + ".weight")
    bias = c.get(name + ".bias") if arch_of(c.plan.src).features.norm_bias else torch.zeros_like(gain)
    return gain, bias


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

    def source_rows(self, plan, spec: TensorSpec, layer: int) -> torch.Tensor | None:
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
        if all(k.startswith(("gdn_", "m_")) for k in spec.units):  # a mixer's inner units (Gated DeltaNet, Mamba)
            return "inner units kept"
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
        d, D = plan.src.width, plan.cfg.width
        for kind, _, block, seg in _grown_segments(t, c):  # a stacked writer: one segment per expert
            seg.narrow(spec.res_axis, d, D - d).narrow(spec.unit_axis, 0, plan.cfg.base_units(kind) * block).zero_()
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
    a third of the elements of the FFN and the embedding (bf16 1 GB: bench/results/surgery/ROUNDS.md, round 9).
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


@dataclass(frozen=True)
class CancelPairs(Step):
    """Recipe ``pair_noise``: writer-side cancelling pairs on Net2Net split copies (ops.cancel_pairs_):
    each copy's writer entries + delta, its source's - delta, delta ~ pair_noise x rms of the unsplit
    unit. The draw depends only on the plan's seed and the tensor's name."""

    def apply(self, t, c):
        plan = c.plan
        gen = torch.Generator().manual_seed(plan.seed * 1_000_003 + zlib.crc32(b"pairs:" + c.name.encode()))
        for kind, e, block, seg in _grown_segments(t, c):
            f = plan.split[c.layer].get(kind)
            if f is not None and e.added:
                ops.cancel_pairs_(seg, c.spec.unit_axis, e, block, f, plan.recipe["pair_noise"], gen)
        return t

    def describe(self, plan, spec):
        return f"cancelling pairs {plan.recipe['pair_noise']:g} x rms(v) on split copies"


def _grown_segments(t: torch.Tensor, c: Ctx):
    """(kind, expansion, block, view of ``t``) for each unit kind of a grown tensor, in order along
    the unit axis (a fused qkv / gate_up tensor holds several kinds). A kind spans its grown config's
    units: the expansion's, but a Mamba mixer's channels that grow with the width (``grow/mixer.py``)."""
    off = 0
    for kind in c.spec.units:
        e, block = c.plan.units[c.layer][kind], unit_count(c.plan.src, kind)[1]
        n = unit_count(c.plan.cfg, kind)[0] * block
        yield kind, e, block, t.narrow(c.spec.unit_axis, off, n)
        off += n


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
    """[BreakSymmetry] where the recipe asks for noise and some unit kind of this tensor takes it;
    [CancelPairs] on writers of split copies where it asks for ``pair_noise``."""
    out = []
    if plan.recipe.get("noise") and any(_noisy(plan, spec, 0, k, writer) for k in spec.units):
        out.append(BreakSymmetry(writer))
    if writer and plan.recipe.get("pair_noise") and any(_noisy(plan, spec, 0, k, True) for k in spec.units):
        out.append(CancelPairs())
    return out


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
