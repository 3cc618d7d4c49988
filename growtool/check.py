"""Compare two models' logits: the measurement behind ``growtool verify`` and the tests, and
``verify`` itself (the whole check of a grown checkpoint against its source, returning a ``Report``).

Two ways to get logits: a whole ``LM`` in memory (``compare``), or ``streamed_logits``, which reads
a checkpoint one block at a time and runs every input through that block before the next: peak
memory is one block, a chunk of an embedding's or head's rows (``EmbeddingRows``, ``StreamedHead``,
``figures_chunked``), and the activations, whatever the model's size or vocabulary.

Low precision (``floor``): an exactly grown bf16/fp16 checkpoint differs from its source by the
rounding of the grown weights on output, which no exact map avoids. The floor is the source's own
distance between running in its storage dtype and in float32, on the same inputs; ``verify``
passes when the grown model's error is within max(tol, floor). An exact growth stays well below it
(0.25-0.55 of it measured on Gemma/OLMo-2/Llama, tests/test_architectures.py); a lossy recipe
(nrio on GPT-2: ~40% of the logit scale) stays far above it.

float32 has a floor too: the source's own distance between running in float32 and in float64
(``floor_dtype``). A deep model's float32 round-off can exceed the fixed tolerance (a real 30-layer
Llama: 1.7e-4 x logit scale); the grown model carries its own round-off, that of its float32
weights and the source's, so the limit is max(tol, FLOAT32_K x floor) (``limit``).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from growtool.io import checkpoint
from growtool.nn import args
from growtool.nn.errors import GrowError
from growtool.nn.families import arch_of
from growtool.nn.model import LM, Block, head_logits, hidden, logit_scale, make_norm


@dataclass
class Comparison:
    alpha: float
    max_dlogit: float
    logit_scale: float
    rel: float  # max_dlogit / logit_scale
    kl: float  # mean KL(source || grown) per token, nats
    top1: float  # fraction of positions with the same argmax
    tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def random_batches(vocab: int, context: int, samples: int, seed: int = 0, seq: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(vocab, (samples, min(seq, context)), generator=g)


def text_batches(path: str, vocab: int, context: int, samples: int, seq: int = 64) -> torch.Tensor:
    """Byte-level tokens from a text file (ids >= vocab wrap around), ``samples`` windows spread over it."""
    raw = bytearray(open(path, "rb").read())
    if not raw:
        raise GrowError(f"{path}: empty file (no text to check on)")
    data = torch.frombuffer(raw, dtype=torch.uint8).long() % vocab
    seq = min(seq, context, max(1, len(data)))
    if len(data) < seq:
        return data.view(1, -1)
    starts = torch.linspace(0, len(data) - seq, samples).long()
    return torch.stack([data[s : s + seq] for s in starts])


class Streamed:
    """A checkpoint as ``model.run`` sees a model, built piece by piece on demand: the blocks are
    read, loaded and dropped one at a time (in ``dtype``)."""

    def __init__(self, ck, dtype=torch.float32, progress=None):
        self.ck, self.cfg, self.dtype, self.progress = ck, ck.config, dtype, progress
        self.arch = arch_of(ck.config)

    def _load(self, make, prefix: str, names: dict | None = None) -> nn.Module:
        """``make()`` built without memory (meta device), then given the checkpoint's tensors
        themselves (``assign``): one copy of each weight, no random initialisation."""
        with torch.device("meta"):
            module = make()
        sd = {}
        for k in module.state_dict():
            t = self.ck.get((names or {}).get(k, prefix + k))  # ``names``: a key stored elsewhere
            sd[k] = t.to(self.dtype)
            if self.progress:
                self.progress(prefix + k, t.numel() * t.element_size())
            del t
        module.load_state_dict(sd, assign=True)
        return module.eval()

    def _blocks(self):
        for i in range(self.cfg.layers):
            yield self._load(lambda i=i: Block(self.cfg, i), self.arch.block.format(i=i))

    def get_submodule(self, path: str) -> nn.Module:
        a, cfg = self.arch, self.cfg
        if path == a.blocks_path:
            return self._blocks()
        if path in (a.modules["final_norm"], a.modules.get("embed_norm")):
            return self._load(lambda: make_norm(cfg, cfg.width), path + ".")
        if path == a.modules["head"]:
            head = (a.modules["embed"] if cfg.tie else path) + "."
            bias = a.features.head_bias  # stored under the head's own name, also when the weight is tied
            make = lambda: nn.Linear(cfg.width, cfg.vocab_size, bias=bias)  # noqa: E731
            return self._load(make, head, {"bias": path + ".bias"})
        if path in (a.modules["embed"], a.modules.get("pos")):
            return EmbeddingRows(self, path + ".weight")
        rows = cfg.context + a.features.pos_offset if path == a.modules.get("pos") else cfg.vocab_size
        # _weight: no random init (normal_ on the meta device would import torch._dynamo: 1 s of start-up)
        return self._load(lambda: nn.Embedding(rows, cfg.width, _weight=torch.empty(rows, cfg.width)), path + ".")


CHUNK_BYTES = 16 * 2**20  # the most bytes of one chunk of rows of an embedding or head (and of its logits)


def row_chunks(ck, name: str, dtype, rows: int | None = None, progress=None):
    """(first row, rows [n, width] in ``dtype``) of a vocabulary-sized tensor, read CHUNK_BYTES at
    a time (or ``rows`` rows at a time); ``progress(name, nbytes)`` once, after the last chunk."""
    total, width = ck.shape(name)
    n = rows or max(1, CHUNK_BYTES // max(1, width * max(dtype.itemsize, ck.dtype(name).itemsize)))
    for r0 in range(0, total, n):
        yield r0, ck.get(name, rows=(r0, min(n, total - r0))).to(dtype)
    if progress:
        progress(name, ck.get_nbytes(name))


class EmbeddingRows:
    """An embedding as ``hidden`` calls it (``emb(idx)``), reading only the rows of the ids asked for,
    CHUNK_BYTES of the table at a time: the whole table is never held."""

    def __init__(self, model: Streamed, name: str):
        self.model, self.name = model, name

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        m = self.model
        ids, where = torch.unique(idx, return_inverse=True)  # sorted
        out = torch.empty(len(ids), m.ck.shape(self.name)[1], dtype=m.dtype)
        total, width = m.ck.shape(self.name)
        n = max(1, CHUNK_BYTES // max(1, width * 8))
        for r0 in range(0, total, n):  # only the chunks that hold some of the ids are read
            sel = (ids >= r0) & (ids < r0 + n)
            if sel.any():
                rows = m.ck.get(self.name, rows=(r0, min(n, total - r0)))
                out[sel] = rows[ids[sel] - r0].to(m.dtype)
                del rows
        if m.progress:
            m.progress(self.name, m.ck.get_nbytes(self.name))
        return out[where]


@torch.no_grad()
def streamed_hidden(ck, x: torch.Tensor, alpha=None, dtype=torch.float32, progress=None) -> torch.Tensor:
    """Final-norm outputs of checkpoint ``ck`` on every row of ``x``, one block in memory at a time."""
    gate = (0.0 if alpha is None else alpha) if ck.config.gated else None
    return hidden(Streamed(ck, dtype, progress), x, gate)


class StreamedHead:
    """A checkpoint's head (tied: its embedding), read in chunks of vocabulary rows, never whole:
    ``head(h) -> float32 logits``; ``head.chunks()`` the rows for ``figures_chunked``."""

    def __init__(self, ck, dtype=torch.float32, progress=None):
        self.ck, self.dtype, self.progress = ck, dtype, progress
        self.model = Streamed(ck, dtype, progress)  # head_logits reads the config (soft-cap) from it
        a = arch_of(ck.config)
        self.name = (a.modules["embed"] if ck.config.tie else a.modules["head"]) + ".weight"

    def chunks(self, rows: int | None = None):
        return row_chunks(self.ck, self.name, self.dtype, rows, self.progress)

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Float32 logits of final-norm outputs ``h`` for the vocabulary rows ``w``."""
        return head_logits(self.model, h.to(self.dtype), lambda x: F.linear(x, w)).float()

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.logits(h, w) for _, w in self.chunks()], dim=-1)


@torch.no_grad()
def streamed_logits(ck, x: torch.Tensor, alpha=None, dtype=torch.float32, progress=None) -> torch.Tensor:
    """Logits (float32) of checkpoint ``ck`` on every row of ``x``, one block in memory at a time."""
    h = streamed_hidden(ck, x, alpha, dtype, progress)
    return StreamedHead(ck, dtype, progress)(h)


def reads(ck) -> tuple[tuple[int, int], tuple[int, int]]:
    """((tensors, bytes) of one ``streamed_hidden`` pass, (tensors, bytes) of loading the head):
    a pass reads everything but an untied head; the head is one tensor (tied: the embedding)."""
    a = arch_of(ck.config)
    head = a.embed if ck.config.tie else a.modules["head"] + ".weight"
    body = [n for n in ck.entries if ck.config.tie or n != head]
    return (len(body), sum(ck.get_nbytes(n) for n in body)), (1, ck.get_nbytes(head))


@torch.no_grad()
def figures(a, b, alpha: float, batch: int = 8, head_a=None, head_b=None) -> Comparison:
    """The comparison of ``b`` against reference ``a``: logits [N, T, V], or final-norm outputs
    [N, T, width] with ``head_a`` / ``head_b`` mapping them to logits one sequence at a time (the
    logits of all inputs are never held). The logit scale is the mean of the standard deviations
    of chunks of ``batch`` sequences of ``a``'s logits."""
    mx, kl, agree, n, scale = 0.0, 0.0, 0, 0, []
    s1 = s2 = 0.0
    m = 0
    for j, (ai, bi) in enumerate(zip(a, b)):
        ai = (head_a(ai[None])[0] if head_a else ai).float()
        bi = (head_b(bi[None])[0] if head_b else bi).float()
        mx = max(mx, float((ai - bi).abs().max()))
        la, lb = F.log_softmax(ai, -1), F.log_softmax(bi, -1)
        kl += float((la.exp() * (la - lb)).sum())
        agree += int((ai.argmax(-1) == bi.argmax(-1)).sum())
        n += ai.shape[0]
        ad = ai.double()
        s1, s2, m = s1 + float(ad.sum()), s2 + float((ad * ad).sum()), m + ad.numel()
        if (j + 1) % batch == 0 or j + 1 == len(a):  # the chunk's std (unbiased, as torch.std)
            scale.append(max(((s2 - s1 * s1 / m) / max(m - 1, 1)) ** 0.5, 1e-6))
            s1 = s2 = 0.0
            m = 0
    s = sum(scale) / len(scale)
    return Comparison(alpha, mx, s, mx / s, kl / n, agree / n, n)


class _Softmax:
    """Running per-token figures of logits seen a chunk of the vocabulary at a time: the max and the
    sum of exponentials (a log-sum-exp), the argmax, and per sequence the sum and sum of squares."""

    def __init__(self, seqs: int, tokens: int):
        self.max = torch.full((tokens,), -torch.inf, dtype=torch.float64)
        self.sum, self.best = torch.zeros(tokens, dtype=torch.float64), torch.zeros(tokens, dtype=torch.long)
        self.s1, self.s2 = torch.zeros(seqs, dtype=torch.float64), torch.zeros(seqs, dtype=torch.float64)
        self.seqs, self.n = seqs, 0

    def add(self, z: torch.Tensor, r0: int) -> torch.Tensor:
        """Take logits z [tokens, rows] of vocabulary rows r0..; returns exp(old max - new max)."""
        cm, ci = z.max(-1)
        cm = cm.double()
        self.best = torch.where(cm > self.max, ci + r0, self.best)  # the first maximum, as argmax
        new = torch.maximum(self.max, cm)
        rescale = torch.exp(self.max - new)
        self.sum = self.sum * rescale + torch.exp(z.double() - new[:, None]).sum(-1)
        self.max = new
        zs = z.double().view(self.seqs, -1)
        self.s1, self.s2, self.n = self.s1 + zs.sum(-1), self.s2 + (zs * zs).sum(-1), self.n + zs.shape[1]
        return rescale

    def lse(self) -> torch.Tensor:
        return self.max + self.sum.log()

    def scale(self, batch: int) -> float:
        """The mean over chunks of ``batch`` sequences of the logits' std (unbiased, as torch.std)."""
        per_seq, out = self.n, []  # logits per sequence
        for g in range(0, self.seqs, batch):
            s1, s2 = float(self.s1[g : g + batch].sum()), float(self.s2[g : g + batch].sum())
            m = per_seq * min(batch, self.seqs - g)
            out.append(max(((s2 - s1 * s1 / m) / max(m - 1, 1)) ** 0.5, 1e-6))
        return sum(out) / len(out)


@torch.no_grad()
def figures_chunked(pairs: list, batch: int = 8) -> list[Comparison]:
    """``figures`` of several comparisons, over the vocabulary a chunk of rows at a time, each head's
    rows read once for all of them: ``pairs`` lists (ref, head_a, got, head_b, alpha), final-norm
    outputs [N, T, width] and ``StreamedHead``s. No head is held whole: at most one chunk of rows
    of each head and its logits for all inputs (CHUNK_BYTES each, and float64 copies). The same
    figures as ``figures`` (KL(a || b) from running log-sum-exps, in float64)."""
    heads = {id(h): h for p in pairs for h in (p[1], p[3])}
    outs = {id(t): t for p in pairs for t in (p[0], p[2])}
    tokens = max(t.shape[0] * t.shape[1] for t in outs.values())
    widest = max(h.ck.shape(h.name)[1] * max(h.dtype.itemsize, h.ck.dtype(h.name).itemsize) for h in heads.values())
    rows = max(1, min(CHUNK_BYTES // (8 * tokens), CHUNK_BYTES // widest))  # the same chunks for every head
    soft = {(id(t), id(h)): _Softmax(t.shape[0], t.shape[0] * t.shape[1]) for p in pairs for t, h in (p[:2], p[2:4])}
    mx, kl_num = [0.0] * len(pairs), [0.0] * len(pairs)  # kl_num: sum_v exp(z_a - max_a) (z_a - z_b) per token
    readers = [h.chunks(rows) for h in heads.values()]
    for chunks in zip(*readers):
        r0, w = chunks[0][0], {k: c[1] for k, c in zip(heads, chunks)}
        z = {key: heads[key[1]].logits(outs[key[0]].reshape(-1, outs[key[0]].shape[-1]), w[key[1]]) for key in soft}
        rescale = {key: soft[key].add(zk, r0) for key, zk in z.items()}
        for j, (ref, head_a, got, head_b, _) in enumerate(pairs):
            ka, kb = (id(ref), id(head_a)), (id(got), id(head_b))
            mx[j] = max(mx[j], float((z[ka] - z[kb]).abs().max()))
            pa = torch.exp(z[ka].double() - soft[ka].max[:, None])
            kl_num[j] = kl_num[j] * rescale[ka] + (pa * (z[ka].double() - z[kb].double())).sum(-1)
        del z, w
    for r in readers:  # every reader to its end (its progress call)
        next(r, None)
    out = []
    for j, (ref, head_a, got, head_b, alpha) in enumerate(pairs):
        sa, sb = soft[(id(ref), id(head_a))], soft[(id(got), id(head_b))]
        kl = kl_num[j] / sa.sum - sa.lse() + sb.lse()
        n, scale = len(kl), sa.scale(batch)
        out.append(
            Comparison(alpha, mx[j], scale, mx[j] / scale, float(kl.sum()) / n, int((sa.best == sb.best).sum()) / n, n)
        )
    return out


LOW_PRECISION = (torch.bfloat16, torch.float16)
FLOAT32_K = 4  # an exact float32 growth passes within max(tol, FLOAT32_K x floor); measured 1.2-3.6 x floor


def floor_dtype(*dtypes: torch.dtype) -> torch.dtype | None:
    """The dtype the source runs in for its floor, against its reference: a low-precision storage
    dtype of either checkpoint (against float32), float64 when both are float32 (against float32
    itself), else None (no floor)."""
    low = next((d for d in dtypes if d in LOW_PRECISION), None)
    if low is not None:
        return low
    return torch.float64 if all(d == torch.float32 for d in dtypes) else None


def storage_name(dtype: torch.dtype | None) -> str:
    """The checkpoints' dtype as verify reports it, from ``floor_dtype``'s answer."""
    return str(dtype).replace("torch.", "") if dtype in LOW_PRECISION else "float32"


def floor_note(dtype: torch.dtype, fl: float, lim: float) -> str:
    """The line verify prints about the floor."""
    if dtype == torch.float64:
        return (
            f"float32 floor: the source run in float32 is {fl:.3g} x logit scale from itself in float64; "
            f"limit max(tol, {FLOAT32_K} x floor) = {lim:.3g}"
        )
    name = storage_name(dtype)
    return (
        f"{name} floor: the source run in {name} is {fl:.3g} x logit scale from itself in float32; "
        f"limit max(tol, floor) = {lim:.3g}"
    )


def limit(tol: float, fl: float, dtype: torch.dtype | None) -> float:
    """The pass limit of verify: max(tol, floor), for float32 (``dtype`` float64) max(tol, FLOAT32_K x floor)."""
    return max(tol, (FLOAT32_K if dtype == torch.float64 else 1) * fl)


def floor(src_ck, x: torch.Tensor, dtype: torch.dtype, reference=None, head=None, progress=None) -> float:
    """The source's own max |dlogit| / logit scale between running in ``dtype`` and in float32:
    the error a checkpoint stored in ``dtype`` carries anyway (float64: float32's own round-off;
    0 for other dtypes). ``reference`` and ``head``: the float32 final-norm outputs and head, when
    the caller has them already."""
    if dtype not in (*LOW_PRECISION, torch.float64):
        return 0.0
    head = head or StreamedHead(src_ck, progress=progress)
    ref = streamed_hidden(src_ck, x, 0.0, progress=progress) if reference is None else reference
    low = streamed_hidden(src_ck, x, 0.0, dtype=dtype, progress=progress)
    return figures(ref, low, 0.0, head_a=head, head_b=StreamedHead(src_ck, dtype, progress)).rel


@torch.no_grad()
def compare(
    src: LM, grown: LM, batches: torch.Tensor, alpha: float, src_alpha: float = 0.0, batch: int = 8, progress=None
) -> Comparison:
    """Run both models in float32 on the same tokens; grown at gate ``alpha``. ``progress(label, n)``
    is called after each ``n`` sequences."""
    mx, kl, agree, n, scale = 0.0, 0.0, 0, 0, []
    for i in range(0, len(batches), batch):
        x = batches[i : i + batch]
        a = src(x, alpha=src_alpha if src.cfg.gated else None).float()
        b = grown(x, alpha=alpha if grown.cfg.gated else None).float()
        mx = max(mx, float((a - b).abs().max()))
        la, lb = F.log_softmax(a, -1), F.log_softmax(b, -1)
        kl += float((la.exp() * (la - lb)).sum(-1).sum())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += a.shape[0] * a.shape[1]
        scale.append(logit_scale(a))
        if progress:
            progress("compare", len(x))
    s = sum(scale) / len(scale)
    return Comparison(alpha, mx, s, mx / s, kl / n, agree / n, n)


# ---- the whole check: ``growtool.verify`` -----------------------------------------------------


@dataclass
class Report:
    """What ``verify`` found. ``passed`` is the verdict (the logits within ``limit`` at the checked
    gate, and the greedy continuations identical where they were asked for); beside it the figures:
    one ``Comparison`` per (inputs, gate) row (rows labelled "... (info)" are shown, not judged),
    the ``floor``, ``limit`` = max(tol, floor) (float32: max(tol, FLOAT32_K x floor)), and ``generate`` (a
    ``sample.Generations`` or None)."""

    passed: bool
    logits_ok: bool
    alpha: float
    tol: float
    floor: float
    limit: float
    dtype: str  # the low-precision dtype the floor was measured in, else "float32" (floor against float64)
    rows: list  # [(label, Comparison)]
    generate: object = None

    @property
    def low_precision(self) -> bool:
        return self.dtype != "float32"

    @property
    def floor_dtype(self) -> torch.dtype | None:
        """The dtype the source's floor ran in (float64: float32's own round-off), None without one."""
        if self.low_precision:
            return getattr(torch, self.dtype)
        return torch.float64 if self.floor > 0 else None

    def as_dict(self) -> dict:
        """The figures as ``growtool verify --json`` prints them."""
        return {
            "pass": self.passed,
            "tol": self.tol,
            "floor": self.floor,
            "limit": self.limit,
            "dtype": self.dtype,
            "results": [{"inputs": l, **c.as_dict()} for l, c in self.rows],  # noqa: E741
            **({"generate": self.generate.as_dict()} if self.generate else {}),
        }


def _checkpoint_arg(name: str, value):
    """A checkpoint argument: a loaded ``Checkpoint`` as it is, else a path (as a str)."""
    return value if isinstance(value, checkpoint.Checkpoint) else args.path(name, value)


def verify(
    source,
    grown,
    *,
    alpha: float = 0.0,
    samples: int = 16,
    data: str | None = None,
    tol: float = 1e-4,
    seed: int = 0,
    generate: int | None = None,
    prompts=(),
    progress=None,
    reference: str = "growtool",
) -> Report:
    """Check that ``grown`` computes ``source``'s function at gate ``alpha``; returns a ``Report``.

    ``source`` / ``grown``: paths (as ``growtool.load`` takes them) or loaded checkpoints. Both are
    read one block at a time (bounded memory), on ``samples`` random sequences and, with ``data``,
    byte tokens of that text file too; a gated ``grown`` is also measured at gate 1 (for
    information). For bf16/fp16 checkpoints the limit is max(tol, floor), the floor being the
    source's own error from running in that dtype; for float32 ones max(tol, FLOAT32_K x floor),
    the floor being the source's float32 round-off (against float64). ``generate=N``: also compare greedy N-token
    continuations of ``prompts`` (default: from ``data``, else random ids). ``progress``: called once
    as ``progress(items, nbytes)`` with the reads to come; returns a context manager that yields the
    ``progress(name, amount)`` callback (``growtool.console.Bar``). ``reference``: ``against_transformers``."""
    source, grown = _checkpoint_arg("source", source), _checkpoint_arg("grown", grown)
    _check_numbers(alpha, samples, data, tol, seed, generate, prompts)
    if source == "-" and grown == "-":
        raise GrowError("only one of SOURCE and GROWN can be standard input")
    args.text("reference", reference, ("growtool", "transformers"))
    a = checkpoint.load(source) if isinstance(source, str) else source
    b = checkpoint.load(grown) if isinstance(grown, str) else grown
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
    low = floor_dtype(b.main_dtype(), a.main_dtype())  # float64 for float32 checkpoints: float32's round-off
    items, nbytes = _reads_to_come(a, b, len(sets), len(alphas), low)
    bar = progress(items, nbytes) if progress else contextlib.nullcontext()
    with bar as tick:  # final-norm outputs first, then the heads, once
        rows, floors = _measure(a, b, sets, alpha, alphas, low, tick)
    if reference == "transformers":
        rows += against_transformers(source, a, b, sets, alpha)
    fl = max(floors, default=0.0)
    lim = limit(tol, fl, low)
    ok = all(c.rel <= lim for label, c in rows if "(info)" not in label)
    gen = None
    if generate is not None:
        from growtool.sample import compare_generations, verify_prompts

        ma, mb = a.model(), b.model()
        gen = compare_generations(ma, mb, verify_prompts(a, prompts, data, samples, seed), generate, alpha)
    return Report(ok and (gen is None or gen.ok), ok, alpha, tol, fl, lim, storage_name(low), rows, gen)


def against_transformers(source, a, b, sets: dict, alpha: float) -> list:
    """``reference="transformers"`` (``source`` a Hugging Face folder): rows comparing growtool's
    source and the grown model at gate ``alpha`` with transformers' own forward of ``source``
    (``io.hf_reference``) on every input set, judged like the others; both models are held whole."""
    from growtool.io.hf_reference import Reference

    ref = Reference(source if isinstance(source, str) else a.source)
    ma, mb, rows = a.model(), b.model(), []
    with torch.no_grad():
        for label, x in sets.items():
            rows.append((f"{label}: source vs transformers", compare(ref, ma, x, 0.0)))
            rows.append((f"{label}: grown vs transformers", compare(ref, mb, x, alpha)))
    return rows


def _check_numbers(alpha, samples, data, tol, seed, generate, prompts) -> None:
    """GrowError naming the first of ``verify``'s own arguments of the wrong type or value."""
    args.real("alpha", alpha, 0, 1)
    args.integer("samples", samples, 1)
    args.path("data", data, optional=True)
    args.real("tol", tol, 0)
    args.seed("seed", seed)
    args.integer("generate", generate, 1, optional=True)
    args.texts("prompts", prompts)


def _reads_to_come(a, b, n_sets: int, n_alphas: int, low) -> tuple[int, int]:
    """Tensors and bytes ``_measure`` reads: each pass reads a checkpoint once."""
    a_passes, b_passes = n_sets * (2 if low else 1), n_sets * n_alphas
    ((ia, ba), (ha, hba)), ((ib, bb), (hb, hbb)) = reads(a), reads(b)
    items = ia * a_passes + ib * b_passes + ha * (2 if low else 1) + hb
    nbytes = ba * a_passes + bb * b_passes + hba * (2 if low else 1) + hbb
    return items, nbytes


def _measure(a, b, sets: dict, alpha: float, alphas: list, low, progress) -> tuple[list, list]:
    """The rows (label, Comparison) and the floors, streaming both checkpoints."""
    rows, floors, hidden = [], [], {}
    for label, x in sets.items():
        hidden[label] = (
            streamed_hidden(a, x, 0.0, progress=progress),
            {al: streamed_hidden(b, x, al, progress=progress) for al in alphas},
        )
        if low:
            hidden[label] += (streamed_hidden(a, x, 0.0, dtype=low, progress=progress),)
    head_a, head_b = StreamedHead(a, progress=progress), StreamedHead(b, progress=progress)
    head_low = StreamedHead(a, low, progress=progress) if low else None
    pairs, labels = [], []  # every comparison in one pass over the heads' vocabulary chunks
    for label, (ref, got, *lows) in hidden.items():
        for al in alphas:
            pairs.append((ref, head_a, got[al], head_b, al))
            labels.append(label if al == alpha else label + " (info)")
        if low:
            pairs.append((ref, head_a, lows[0], head_low, 0.0))
            labels.append(None)  # a floor
    for label, c in zip(labels, figures_chunked(pairs)):
        rows.append((label, c)) if label else floors.append(c.rel)
    return rows, floors
