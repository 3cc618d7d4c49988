"""Compare two models' logits: the measurement behind ``growtool verify`` and the tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .model import LM, logit_scale


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
