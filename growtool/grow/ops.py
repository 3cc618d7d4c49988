"""Growth operators: pure functions on tensors. Each docstring states the identity it keeps.

Notation: d old width, D new width, g = D - d; u_old = [1_d; 0]/sqrt(d), u_grow = [0; 1_g]/sqrt(g).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# ---- SRIO rotation ------------------------------------------------------------------------


def rotate(x: torch.Tensor, d: int, eps: float, axis: int) -> torch.Tensor:
    """Apply the SRIO rotation R(eps) to every vector of ``x`` along ``axis`` (size D > d).

    R is the rotation by theta, cos(theta) = eps, in the plane of u_old and u_grow, and the
    identity on its complement:
        R u_old  = eps u_old + sqrt(1-eps^2) u_grow
        R u_grow = -sqrt(1-eps^2) u_old + eps u_grow
    Writers take W <- R [W; 0] and readers W <- [W, X] R^T; both are "rotate the vectors along
    the residual axis". R is orthogonal, so a reader applied to a rotated residual sees the old
    one. Cost O(D) per vector: the D x D matrix is never built. eps = 1 returns x unchanged.
    ``eps`` may be a 0-d tensor: the result is then differentiable in eps (same arithmetic).
    """
    if not isinstance(eps, torch.Tensor) and eps == 1.0:
        return x
    return rotate_(x.clone(memory_format=torch.contiguous_format), d, eps, axis)


def rotate_(x: torch.Tensor, d: int, eps: float, axis: int) -> torch.Tensor:
    """``rotate``, in place on ``x`` (returned): the same arithmetic, without the copy. For
    tensors the caller owns (a freshly grown tensor); autograd-safe on non-leaf tensors."""
    if isinstance(eps, torch.Tensor):
        s = torch.sqrt((1.0 - eps * eps).clamp_min(0.0))
    elif eps == 1.0:
        return x
    else:
        s = math.sqrt(max(0.0, 1.0 - eps * eps))
    xm = x.movedim(axis, -1)
    c_old, c_new = _shifts(*_sums(xm, d), d, xm.shape[-1] - d, eps, s)
    xm[..., :d] += c_old
    xm[..., d:] += c_new
    return x


def _sums(xm: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a = <u_old, x>, b = <u_grow, x> of each vector x along ``xm``'s last axis (kept, size 1)."""
    a = xm[..., :d].sum(-1, keepdim=True) / math.sqrt(d)
    return a, xm[..., d:].sum(-1, keepdim=True) / math.sqrt(xm.shape[-1] - d)


def _shifts(a, b, d: int, g: int, eps, s) -> tuple[torch.Tensor, torch.Tensor]:
    """What R adds to each old and each new entry of a vector with sums a, b (``_sums``), s =
    sqrt(1 - eps^2): R x = x + (eps-1)(a u_old + b u_grow) + s (a u_grow - b u_old)."""
    return ((eps - 1.0) * a - s * b) / math.sqrt(d), ((eps - 1.0) * b + s * a) / math.sqrt(g)


def rotate_half_into(
    out: torch.Tensor, x: torch.Tensor, d: int, eps: float, axis: int, zero_new: bool, sums=None
) -> torch.Tensor:
    """``out`` <- R(eps) v, rounded once to ``out``'s dtype, for vectors v along ``axis`` with a zero
    half: v = [x; 0] (``zero_new``: x holds their d old entries) or v = [0; x] (x: their g = D - d
    new entries); ``out`` has D entries along ``axis``, ``x`` is float32 and is overwritten with its
    half of R v (before rounding; it may be that half of ``out`` itself).

    Bit for bit ``rotate_`` on the materialised v, rounded: the zero half sums to +0, so a, b and
    the two added constants are those ``rotate_`` computes, and each zero entry becomes 0 + its
    half's constant. But the zeros are never added to or converted, and where ``axis`` is the
    last (contiguous) one never written or summed either: the zero half of ``out`` is one constant
    per vector. Along another axis torch's sum of one vector depends on the vectors summed with
    it, so the caller passes ``sums`` = (a, b) as ``rotate_`` computes them on the whole
    materialised tensor (``rotation_sums``), cut to these vectors.
    """
    s = math.sqrt(max(0.0, 1.0 - eps * eps))
    xm, om = x.movedim(axis, -1), out.movedim(axis, -1)
    g = om.shape[-1] - d
    zero = xm.new_zeros((*xm.shape[:-1], 1))
    if sums is not None:
        a, b = (v.movedim(axis, -1) for v in sums)
    elif zero_new:
        a, b = xm.sum(-1, keepdim=True) / math.sqrt(d), zero / math.sqrt(g)
    else:
        a, b = zero / math.sqrt(d), xm.sum(-1, keepdim=True) / math.sqrt(g)
    c_old, c_new = _shifts(a, b, d, g, eps, s)  # as in rotate_
    kept, filled = (om[..., :d], om[..., d:]) if zero_new else (om[..., d:], om[..., :d])
    xm += c_old if zero_new else c_new
    if not same_view(kept, xm):
        kept.copy_(xm)  # the one rounding (as .to: the same conversion)
    filled.copy_((zero + (c_new if zero_new else c_old)).to(out.dtype).expand(filled.shape))
    return out


def rotation_sums(v: torch.Tensor, d: int, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) = (<u_old, v>, <u_grow, v>) of each vector along ``axis``, as ``rotate_`` computes them;
    size 1 along ``axis``."""
    a, b = _sums(v.movedim(axis, -1), d)
    return a.movedim(-1, axis), b.movedim(-1, axis)


def exact_layernorm_eps(d: int, D: int) -> float:
    """The angle LayerNorm absorbs: R(eps*) u_old = 1_D / sqrt(D) exactly when eps* = sqrt(d/D).

    Then a residual R[h; 0] differs from [h - mean(h); 0] only along 1_D, which LayerNorm removes.
    """
    return math.sqrt(d / D)


# ---- expansions: how new units / new residual dims are filled from old ones ---------------


@dataclass(frozen=True)
class Kind:
    """What an expansion kind guarantees (the one place these properties are stated)."""

    exact_without_gate: bool  # new units may write ungated and the function is kept (split / zero)
    splits_writers: bool  # the copied unit's writes are shared with its copies (Net2Net split)
    fills_new_new_block: bool  # new units live in the new residual dims only (tile)
    dead: bool  # new units are all zeros: a zero-gradient saddle, training never moves them
    units: bool = True  # usable for new units (heads, FFN neurons)
    columns: bool = True  # usable for readers' new residual columns


KINDS = {
    "convex": Kind(exact_without_gate=False, splits_writers=False, fills_new_new_block=False, dead=False),
    "tile": Kind(exact_without_gate=False, splits_writers=False, fills_new_new_block=True, dead=False),
    "copy": Kind(exact_without_gate=True, splits_writers=True, fills_new_new_block=False, dead=False, columns=False),
    "mean": Kind(exact_without_gate=False, splits_writers=False, fills_new_new_block=False, dead=False, units=False),
    "zero": Kind(exact_without_gate=True, splits_writers=False, fills_new_new_block=False, dead=True),
}


@dataclass(frozen=True)
class Expansion:
    """New entries of an axis of size n -> n_new as mixtures of old entries.

    New entry j (index n + j) = sum_k weight[j, k] * old entry index[j, k].  ``kind`` is
    "convex" (non-negative weights summing to 1), "tile" (j -> j mod n), "copy" (a random old
    entry), "mean" (the mean of all old entries), or "zero".
    """

    kind: str
    n: int
    n_new: int
    index: torch.Tensor | None = None  # [n_new - n, k] long
    weight: torch.Tensor | None = None  # [n_new - n, k] float32

    @property
    def added(self) -> int:
        return self.n_new - self.n


def make_expansion(kind: str, n: int, n_new: int, gen: torch.Generator, k: int = 2) -> Expansion:
    """Build an expansion. Convex: each new entry mixes ``k`` distinct random old entries with
    Dirichlet(1) weights (LiGO-inspired, static). Copy: each new entry copies one random old
    entry (Net2Net). Tile: new entry j copies old entry j mod n (the old block tiled and cropped).
    """
    m = n_new - n
    if kind in ("zero", "mean") or m == 0:
        return Expansion(kind, n, n_new)
    if kind == "tile":
        idx = (torch.arange(m) % n).unsqueeze(1)
        return Expansion(kind, n, n_new, idx, torch.ones(m, 1))
    if kind == "copy":
        idx = torch.randint(n, (m, 1), generator=gen)
        return Expansion(kind, n, n_new, idx, torch.ones(m, 1))
    if kind == "convex":
        k = max(1, min(k, n))
        idx = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(m)])
        w = -torch.log(torch.rand(m, k, generator=gen, dtype=torch.float64).clamp_min(1e-12))  # Exp(1)
        w = (w / w.sum(1, keepdim=True)).float()
        return Expansion(kind, n, n_new, idx, w)
    raise ValueError(f"unknown expansion kind {kind!r}")


def group_to_heads(e: Expansion, per_group: int) -> Expansion:
    """Lift a KV-group expansion to the query heads of each group (GQA: head h uses group h // r).

    New group j's query heads (r of them) mix the same-position query heads of j's source groups,
    so new query heads belong to new KV groups and head_dim and the q-per-kv ratio are kept.
    """
    r = per_group
    if e.index is None:
        return Expansion(e.kind, e.n * r, e.n_new * r)
    m, k = e.index.shape
    idx = (e.index.unsqueeze(1) * r + torch.arange(r).view(1, r, 1)).reshape(m * r, k)
    w = e.weight.unsqueeze(1).expand(m, r, k).reshape(m * r, k)
    return Expansion(e.kind, e.n * r, e.n_new * r, idx, w)


def expand_axis(
    x: torch.Tensor, axis: int, e: Expansion, block: int = 1, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Grow ``axis`` from e.n * block to e.n_new * block entries; old entries are kept bit for bit.

    Entries come in blocks (a head is ``block`` = head_dim consecutive rows); a new block is the
    expansion's mixture of old blocks. ``out`` (optional) receives the result: a tensor of the grown
    shape, possibly of another dtype (a float32 result of a bfloat16 ``x``: the old entries are
    converted exactly and the mixtures computed in ``out``'s dtype). When ``x`` already is
    ``out.narrow(axis, 0, e.n * block)`` the old entries stay where they are (growth in place).
    """
    assert x.shape[axis] == e.n * block, (x.shape, e.n, block)
    shape = list(x.shape)
    shape[axis] = e.n_new * block
    if out is None:
        out = x.new_empty(shape)  # the one allocation; filled through views (autograd-safe)
    assert list(out.shape) == shape, (out.shape, shape)
    old = out.narrow(axis, 0, e.n * block)
    if not same_view(old, x):
        if x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            x = x.clone()  # x lives in out's memory elsewhere: read it before it is overwritten
        old.copy_(x)
    if e.added == 0:
        return out
    new = out.narrow(axis, e.n * block, e.added * block)
    if e.kind == "zero":
        new.zero_()
    elif e.kind == "mean":  # from x as it was (the same float32 arithmetic as before: a reduction's order)
        src = x if x.dtype == out.dtype else x.to(out.dtype)
        xb = src.movedim(axis, 0).unflatten(0, (e.n, block))
        new.movedim(axis, 0).unflatten(0, (e.added, block)).copy_(
            xb.mean(0, keepdim=True).expand(e.added, *xb.shape[1:])
        )
    elif e.kind == "tile":  # new block j is old block j mod n: contiguous runs of old blocks, copied
        tile_into(new, old, axis, block)
    else:  # mixtures of old blocks, gathered along ``axis`` itself (no transposed copies)
        k = e.index.shape[1]
        idx = e.index.t() if block == 1 else e.index.t().unsqueeze(2) * block + torch.arange(block)
        terms = None  # along a later axis, all k terms in one gather (index_select there first copied
        if axis:  # the strided ``old`` whole, then one strided slice per index)
            flat = idx.reshape(-1)
            shape = list(old.shape)
            shape[axis] = flat.numel()
            terms = torch.gather(old, axis, along(flat, axis, old.dim()).expand(shape))
        for j in range(k):
            n_j = e.added * block
            term = terms.narrow(axis, j * n_j, n_j) if axis else old.index_select(axis, idx[j].reshape(-1))
            if e.kind in ("tile", "copy"):  # weight 1 there: the product is the entry itself
                wj = None
            else:
                wj = along(e.weight[:, j].to(out.dtype).repeat_interleave(block), axis, out.dim())
            if j > 0:
                new.add_(term if wj is None else term.mul_(wj))
            elif wj is None:
                new.copy_(term)
            elif term.requires_grad or new.requires_grad:
                new.copy_(term * wj)
            else:
                torch.mul(term, wj, out=new)  # the product written in place (no pass through a copy)
    return out


def tile_into(dst: torch.Tensor, src: torch.Tensor, axis: int, block: int = 1) -> torch.Tensor:
    """``dst`` along ``axis`` filled with ``src``'s blocks repeated: dst block j = src block j mod n
    (n = src's blocks), as runs of whole copies (the same bytes as gathering with index j mod n).
    ``dst`` must not overlap ``src``."""
    n, m = src.shape[axis] // block, dst.shape[axis] // block
    for start in range(0, m, n):
        k = min(n, m - start)
        dst.narrow(axis, start * block, k * block).copy_(src.narrow(axis, 0, k * block))
    return dst


def along(v: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    """The 1-d ``v`` shaped to broadcast along ``axis`` of an ``ndim``-dimensional tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.view(shape)


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same elements of the same memory (same start, shape and strides)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def permute_units(x: torch.Tensor, axis: int, order, block: int = 1) -> torch.Tensor:
    """Units (blocks of ``block`` entries along ``axis``) moved: unit j to position order[j]."""
    inv = torch.empty(len(order), dtype=torch.long)
    inv[torch.tensor(list(order))] = torch.arange(len(order))
    idx = (inv.unsqueeze(1) * block + torch.arange(block)).reshape(-1)
    return x.index_select(axis, idx)


def split_factors(e: Expansion, alpha: float = 0.5) -> torch.Tensor:
    """Net2Net's split: a unit copied c times and its copies each write 1/(1+c) of its output.

    Returns the [n_new] multipliers for the writer's unit axis; with identical inputs, the sum of
    the split writes equals the original write, so the function is kept without any gate.

    ``alpha`` != 1/2 is LEMON's unequal split (arXiv 2310.07999): the source keeps 2 alpha / (1+c)
    and each of its c copies takes (1 - 2 alpha / (1+c)) / c, so one copy gives alpha v and
    (1 - alpha) v. The shares of a unit and its copies still sum to 1 (the same identity), but
    their writer columns differ, so their gradients differ from the first step. alpha = 1/2 is the
    even split, bit for bit.
    """
    counts = torch.ones(e.n)
    if e.index is not None and e.added:
        counts += torch.bincount(e.index[:, 0], minlength=e.n).float()
    f = 1.0 / counts
    if alpha == 0.5 or e.index is None or not e.added:
        tail = f[e.index[:, 0]] if (e.index is not None and e.added) else torch.ones(e.added)
        return torch.cat([f, tail])
    src = torch.where(counts > 1, 2.0 * alpha * f, f)  # units never copied keep their whole write
    c = counts[e.index[:, 0]]
    return torch.cat([src, (1.0 - src[e.index[:, 0]]) / (c - 1.0)])


def cancel_pairs_(
    x: torch.Tensor, axis: int, e: Expansion, block: int, factors: torch.Tensor, sigma: float, gen: torch.Generator
) -> torch.Tensor:
    """Writer-side cancelling pairs (in place on ``x``, returned): new unit j, a split copy of old
    unit i = index[j], gets delta_j added to its writer entries and i gets -delta_j.

    Both compute the same activation a_i (identical readers), so the sum of their writes is
    unchanged: (f_i v_i - sum_j delta_j) a_i + sum_j (f_j v_i + delta_j) a_i = v_i a_i, the function
    kept without a gate; the pair's writer columns now differ, hence their gradients from the first
    step. delta_j ~ sigma x rms(v_i) x N(0, 1) per entry, v_i the unit's unsplit writer entries
    (its entries over its split factor ``factors[i]``): the noise is relative to the unit it splits.
    Blocks of ``block`` entries along ``axis`` are one unit (a head's head_dim columns).
    """
    if e.added == 0 or sigma == 0.0 or e.index is None:
        return x
    xm = x.movedim(axis, 0).unflatten(0, (e.n_new, block))
    src = e.index[:, 0]
    v = xm[src].float() / factors[src].to(torch.float32).view(-1, *[1] * (xm.dim() - 1))
    scale = v.pow(2).flatten(1).mean(1).sqrt().view(-1, *[1] * (xm.dim() - 1))
    delta = (torch.randn(v.shape, generator=gen, dtype=torch.float32) * scale * sigma).to(x.dtype)
    xm[e.n :] += delta
    xm[: e.n].index_add_(0, src, -delta)
    return x


def break_symmetry_(
    x: torch.Tensor, axis: int, e: Expansion, block: int, sigma: float, gen: torch.Generator, paired: bool
) -> torch.Tensor:
    """Add N(0, sigma^2) noise to the new units' entries along ``axis`` (in place on ``x``; blocks of
    ``block`` entries are one unit).

    Unpaired (readers of new units whose outputs are gated at 0 or whose writes are zero): the noise
    reaches the output only through a factor 0, so the function is unchanged.
    Paired (writers of Net2Net split copies, ``e.kind == "copy"``): new unit j copies old unit i = index[j]
    and both compute the same activation a_i; the copy's write gets +delta_j and its source's -delta_j,
    so sum(writes) is unchanged: (w_i - sum_j delta_j) a_i + sum_j (w_i' + delta_j) a_i = the split's sum.
    Without it identical copies receive identical gradients forever (a cloned-unit manifold).
    """
    if e.added == 0 or sigma == 0.0:
        return x
    xm = x.movedim(axis, 0).unflatten(0, (e.n_new, block))
    noise = torch.randn(xm[e.n :].shape, generator=gen, dtype=torch.float32).to(x.dtype) * sigma
    xm[e.n :] += noise
    if paired:
        xm[: e.n].index_add_(0, e.index[:, 0], -noise)
    return x


def scale_axis(
    x: torch.Tensor, axis: int, factors: torch.Tensor, block: int = 1, inplace: bool = False
) -> torch.Tensor:
    """Multiply entries (in blocks) along ``axis`` by ``factors`` (``inplace``: into ``x``, returned)."""
    f = along(factors.to(x.dtype).repeat_interleave(block), axis, x.dim())
    return x.mul_(f) if inplace else x * f


# ---- norms -------------------------------------------------------------------------------


def grow_norm_gain(gain: torch.Tensor, D: int, uniform: bool) -> torch.Tensor:
    """New norm gain of width D for a residual carried as R[h; 0].

    rms over D of R[h; 0] is sqrt(d/D) x rms over d (and with eps' = eps d/D the same holds with
    eps inside), so a gain of sqrt(d/D) turns the grown normalisation into the old one. With
    ``uniform`` the old gain has been folded into the readers and the new gain is sqrt(d/D) on
    every dim (exact for any rotation); otherwise old dims keep gain * sqrt(d/D) and new dims,
    which the norm maps to zero, take the mean old gain (exact when readers are not rotated).
    """
    d = gain.shape[0]
    c = math.sqrt(d / D)
    if uniform:
        return torch.full((D,), c, dtype=gain.dtype)
    return torch.cat([gain * c, gain.mean().expand(D - d) * c])


def grow_norm_bias(bias: torch.Tensor, D: int) -> torch.Tensor:
    """LayerNorm bias: old entries kept, new entries 0 (the normed output is [old; 0])."""
    return torch.cat([bias, bias.new_zeros(D - bias.shape[0])])


def grow_norm_eps(eps: float, d: int, D: int) -> float:
    """eps' = eps * d / D keeps sqrt(mean_D(x^2) + eps') = sqrt(d/D) sqrt(mean_d(x^2) + eps)."""
    return eps * d / D


def fold_gain(w: torch.Tensor, gain: torch.Tensor, axis: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Fold a norm gain into a reader: W diag(gain) along the residual axis (same function).
    With ``out`` the product is written there, in its dtype (a bfloat16 ``w`` converts exactly)."""
    if out is None:
        return w * along(gain.to(w.dtype), axis, w.dim())
    g = along(gain.to(out.dtype), axis, w.dim())
    if w.dtype != out.dtype:  # convert first: a mixed-dtype multiply takes torch's slow element-wise path
        return out.copy_(w).mul_(g)
    return torch.mul(w, g, out=out)


# ---- an embedding LayerNorm refit (BLOOM, untied, any width) -------------------------------


def embed_norm_bound(gain: torch.Tensor, bias: torch.Tensor) -> float:
    """B = max|g| sqrt(d) + |b - mean(b)|: every centered output of the LayerNorm x -> g core(x) + b
    over d dims has norm below B, since |core(x)|^2 = d var / (var + eps) < d."""
    g, b = gain.double(), bias.double()
    return float(g.abs().max()) * math.sqrt(g.shape[0]) + float((b - b.mean()).norm())


def refit_embed_norm_gain(gain: torch.Tensor, bias: torch.Tensor, D: int, eps_new: float) -> torch.Tensor:
    """The grown embedding LayerNorm's gain: gamma = sqrt(eps' + B^2 / D) on the d old dims, 0 on the
    new ones (its bias is 0). With the rows of ``refit_embedding_rows`` (each of norm B, mean 0) the
    norm divides every row by sqrt(B^2 / D + eps') = gamma, so it outputs [C h0; 0]."""
    d = gain.shape[0]
    gamma = math.sqrt(eps_new + embed_norm_bound(gain, bias) ** 2 / D)
    return torch.cat([torch.full((d,), gamma, dtype=torch.float64), torch.zeros(D - d, dtype=torch.float64)])


def filler_direction(r: int) -> torch.Tensor:
    """A fixed unit vector of mean 0 over r >= 2 dims, spread evenly: alternating signs, centered."""
    v = torch.tensor([(-1.0) ** j for j in range(r)], dtype=torch.float64)
    v -= v.mean()
    return v / v.norm()


def refit_embedding_rows(
    e: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float, D: int, out: torch.Tensor
) -> torch.Tensor:
    """Rows x = [C h0; rho u] of width D (into ``out``) whose LayerNorm with the gain of
    ``refit_embed_norm_gain`` (bias 0) outputs [C h0; 0], for each table row e:

        h0 = gain * core(e) + bias   (the old embedding LayerNorm's output, eps ``eps``),
        C h0 = h0 - mean(h0),  rho = sqrt(B^2 - |C h0|^2),  u = ``filler_direction(D - d)``.

    Each x has mean 0 and norm B (``embed_norm_bound``), so its variance over D is B^2 / D for
    every row, and [C h0; 0] is the old output up to a multiple of 1_D, which every later LayerNorm
    removes: the residual R[h0; 0] of the LayerNorm width map. The new dims carry only the filler
    that gives every row the same variance; their gain 0 keeps it out of the residual."""
    d = e.shape[1]
    h = torch.nn.functional.layer_norm(e.double(), (d,), gain.double(), bias.double(), eps)
    h -= h.mean(-1, keepdim=True)
    B = embed_norm_bound(gain, bias)
    rho = (B * B - h.pow(2).sum(-1, keepdim=True)).clamp_min(0.0).sqrt()
    out[:, :d].copy_(h)
    out[:, d:].copy_(rho * filler_direction(D - d))
    return out
