"""Compare two models' logits: the measurement behind ``growtool verify`` and the tests, and
``verify`` itself (the whole check of a grown checkpoint against its source, returning a ``Report``).

Two ways to get logits: a whole ``LM`` in memory (``compare``), or ``streamed_logits``, which reads
a checkpoint one block at a time and runs every input through that block before the next: peak
memory is one block, the embedding and head, and the activations, whatever the model's size.

Low precision (``floor``): an exactly grown bf16/fp16 checkpoint differs from its source by the
rounding of the grown weights on output, which no exact map avoids. The floor is the source's own
distance between running in its storage dtype and in float32, on the same inputs; ``verify``
passes when the grown model's error is within max(tol, floor). An exact growth stays well below it
(0.25-0.55 of it measured on Gemma/OLMo-2/Llama, tests/test_architectures.py); a lossy recipe
(nrio on GPT-2: ~40% of the logit scale) stays far above it.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from growtool.io import checkpoint
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
    data = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8).long() % vocab
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

    def _load(self, make, prefix: str) -> nn.Module:
        """``make()`` built without memory (meta device), then given the checkpoint's tensors
        themselves (``assign``): one copy of each weight, no random initialisation."""
        with torch.device("meta"):
            module = make()
        sd = {}
        for k in module.state_dict():
            t = self.ck.get(prefix + k)
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
        if path == a.modules["final_norm"]:
            return self._load(lambda: make_norm(cfg, cfg.width), path + ".")
        if path == a.modules["head"]:
            head = (a.modules["embed"] if cfg.tie else path) + "."
            return self._load(lambda: nn.Linear(cfg.width, cfg.vocab_size, bias=False), head)
        rows = cfg.context if path == a.modules.get("pos") else cfg.vocab_size
        # _weight: no random init (normal_ on the meta device would import torch._dynamo: 1 s of start-up)
        return self._load(lambda: nn.Embedding(rows, cfg.width, _weight=torch.empty(rows, cfg.width)), path + ".")


@torch.no_grad()
def streamed_hidden(ck, x: torch.Tensor, alpha=None, dtype=torch.float32, progress=None) -> torch.Tensor:
    """Final-norm outputs of checkpoint ``ck`` on every row of ``x``, one block in memory at a time."""
    gate = (0.0 if alpha is None else alpha) if ck.config.gated else None
    return hidden(Streamed(ck, dtype, progress), x, gate)


class StreamedHead:
    """A checkpoint's head (tied: its embedding), loaded once: ``head(h) -> float32 logits``."""

    def __init__(self, ck, dtype=torch.float32, progress=None):
        self.model = Streamed(ck, dtype, progress)
        self.head = self.model.get_submodule(arch_of(ck.config).modules["head"])

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return head_logits(self.model, h, self.head).float()


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


LOW_PRECISION = (torch.bfloat16, torch.float16)


def floor(src_ck, x: torch.Tensor, dtype: torch.dtype, reference=None, head=None, progress=None) -> float:
    """The source's own max |dlogit| / logit scale between running in ``dtype`` and in float32:
    the error a checkpoint stored in ``dtype`` carries anyway (0 for float32). ``reference`` and
    ``head``: the float32 final-norm outputs and head, when the caller has them already."""
    if dtype not in LOW_PRECISION:
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
    the low-precision ``floor``, ``limit`` = max(tol, floor), and ``generate`` (a
    ``sample.Generations`` or None)."""

    passed: bool
    logits_ok: bool
    alpha: float
    tol: float
    floor: float
    limit: float
    dtype: str  # the low-precision dtype the floor was measured in, else "float32"
    rows: list  # [(label, Comparison)]
    generate: object = None

    @property
    def low_precision(self) -> bool:
        return self.dtype != "float32"

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
) -> Report:
    """Check that ``grown`` computes ``source``'s function at gate ``alpha``; returns a ``Report``.

    ``source`` / ``grown``: paths (as ``growtool.load`` takes them) or loaded checkpoints. Both are
    read one block at a time (bounded memory), on ``samples`` random sequences and, with ``data``,
    byte tokens of that text file too; a gated ``grown`` is also measured at gate 1 (for
    information). For bf16/fp16 checkpoints the limit is max(tol, floor), the floor being the
    source's own error from running in that dtype. ``generate=N``: also compare greedy N-token
    continuations of ``prompts`` (default: from ``data``, else random ids). ``progress``: called once
    as ``progress(items, nbytes)`` with the reads to come; returns a context manager that yields the
    ``progress(name, amount)`` callback (``growtool.console.Bar``)."""
    if source == "-" and grown == "-":
        raise GrowError("only one of SOURCE and GROWN can be standard input")
    a = checkpoint.load(source) if isinstance(source, (str, Path)) else source
    b = checkpoint.load(grown) if isinstance(grown, (str, Path)) else grown
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
    items, nbytes = _reads_to_come(a, b, len(sets), len(alphas), low)
    bar = progress(items, nbytes) if progress else contextlib.nullcontext()
    with bar as tick:  # final-norm outputs first, then the heads, once
        rows, floors = _measure(a, b, sets, alpha, alphas, low, tick)
    fl = max(floors, default=0.0)
    limit = max(tol, fl)
    ok = all(c.rel <= limit for label, c in rows if "(info)" not in label)
    gen = None
    if generate is not None:
        from growtool.sample import compare_generations, verify_prompts

        ma, mb = a.model(), b.model()
        gen = compare_generations(ma, mb, verify_prompts(a, prompts, data, samples, seed), generate, alpha)
    dtype = str(low).replace("torch.", "") if low else "float32"
    return Report(ok and (gen is None or gen.ok), ok, alpha, tol, fl, limit, dtype, rows, gen)


def _reads_to_come(a, b, n_sets: int, n_alphas: int, low) -> tuple[int, int]:
    """Tensors and bytes ``_measure`` reads: each pass reads a checkpoint once."""
    a_passes, b_passes = n_sets * (2 if low else 1), n_sets * n_alphas
    ((ia, ba), (ha, hba)), ((ib, bb), (hb, hbb)) = reads(a), reads(b)
    items = ia * a_passes + ib * b_passes + ha * (2 if low else 1) + hb
    nbytes = ba * a_passes + bb * b_passes + hba * (2 if low else 1) + hbb
    return items, nbytes


def _measure(a, b, sets: dict, alpha: float, alphas: list, low, progress) -> tuple[list, list]:
    """The rows (label, Comparison) and the low-precision floors, streaming both checkpoints."""
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
    for label, (ref, got, *lows) in hidden.items():
        for al in alphas:
            c = figures(ref, got[al], al, head_a=head_a, head_b=head_b)
            rows.append((label if al == alpha else label + " (info)", c))
        if low:
            floors.append(figures(ref, lows[0], 0.0, head_a=head_a, head_b=head_low).rel)
    return rows, floors
