"""Token-level comparison of two language models on the same text, binned by difficulty.

The question it answers: *where* (on which tokens) is model B better or worse than model A?
The small-init paper reports that the gains of small initialisation concentrate on mid-to-hard
tokens; this is the measurement behind that claim.

Definition (all logs natural, all quantities per predicted token)
----------------------------------------------------------------
Take windows of tokens x_1..x_T. Each position t < T is one *predicted token*: both models see
x_1..x_t and predict y = x_{t+1}. Let P and Q be the predictive distributions of A and B
(softmax of the logits, computed in float64), and

* loss_A = -log P(y),   loss_B = -log Q(y)
* gain   = loss_A - loss_B                     (> 0: B is better on this token)
* gap    = Q(y) - P(y)                         the probability gap on the target, in [-1, 1]
* |gap|  = |Q(y) - P(y)|
* js     = JS(P, Q) = 1/2 KL(P || M) + 1/2 KL(Q || M),  M = (P + Q) / 2,  in [0, log 2]
           (Jensen-Shannon divergence between the two whole predictive distributions)
* difficulty = (loss_A + loss_B) / 2           the mean of both models' losses

Why the mean of both losses as difficulty: binning by one model's own loss selects the tokens
that model happens to get wrong, so its hardest bin shows a spurious advantage for the other
model (regression to the mean). The mean treats both models alike, so the comparison is
symmetric: swapping A and B leaves the bins, |gap| and js unchanged and negates gain and gap.

Tokens are sorted by difficulty (ties by position) and cut into ``bins`` quantile bins of equal
count (sizes differ by at most one), bin 0 the easiest. The bins partition the tokens. Each bin
reports: its token count, its difficulty range, the mean of loss_A, loss_B, gain, gap, |gap| and
js over its tokens. The row ``"all"`` is the same over every token; its mean gain equals
mean(loss_A) - mean(loss_B), the usual difference in validation loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from growtool.nn.errors import GrowError

FIELDS = ("loss_a", "loss_b", "gain", "gap", "abs_gap", "js")


@torch.no_grad()
def token_stats(model_a, model_b, windows: torch.Tensor, batch: int = 8) -> dict[str, torch.Tensor]:
    """Per-token float64 vectors (see module docstring): loss_a, loss_b, p_a, p_b, js.

    ``windows`` is a LongTensor [N, T] (T >= 2); the N * (T - 1) predicted tokens are flattened
    in row-major order. Both models run in eval mode on the same windows.
    """
    if windows.dim() != 2 or windows.shape[1] < 2:
        raise GrowError(f"windows must be [N, T] with T >= 2, got shape {tuple(windows.shape)}")
    if model_a.cfg.vocab_size != model_b.cfg.vocab_size:
        raise GrowError(f"vocab sizes differ: {model_a.cfg.vocab_size} vs {model_b.cfg.vocab_size}")
    out = {k: [] for k in ("loss_a", "loss_b", "p_a", "p_b", "js")}
    for m in (model_a, model_b):
        m.eval()
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        x, y = w[:, :-1], w[:, 1:].reshape(-1, 1)
        la = F.log_softmax(model_a(x).double(), -1).flatten(0, 1)
        lb = F.log_softmax(model_b(x).double(), -1).flatten(0, 1)
        ta, tb = la.gather(1, y).squeeze(1), lb.gather(1, y).squeeze(1)
        out["loss_a"].append(-ta)
        out["loss_b"].append(-tb)
        out["p_a"].append(ta.exp())
        out["p_b"].append(tb.exp())
        out["js"].append(js_divergence(la, lb))
    return {k: torch.cat(v) for k, v in out.items()}


def js_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence (nats) between distributions given as log-probabilities."""
    logm = torch.logaddexp(logp, logq) - math.log(2.0)
    p, q = logp.exp(), logq.exp()
    kl_pm = torch.where(p > 0, p * (logp - logm), torch.zeros_like(p)).sum(-1)
    kl_qm = torch.where(q > 0, q * (logq - logm), torch.zeros_like(q)).sum(-1)
    return (0.5 * (kl_pm + kl_qm)).clamp_min(0.0)


@dataclass
class BinRow:
    bin: str  # "0".."bins-1" (easy -> hard) or "all"
    tokens: int
    difficulty_lo: float
    difficulty_hi: float
    loss_a: float
    loss_b: float
    gain: float
    gap: float
    abs_gap: float
    js: float


def bin_tokens(stats: dict[str, torch.Tensor], bins: int = 5) -> tuple[list[BinRow], torch.Tensor]:
    """Quantile bins by difficulty. Returns (rows: bins rows then "all", bin index per token)."""
    n = len(stats["loss_a"])
    if bins < 1:
        raise GrowError(f"bins must be >= 1, got {bins}")
    if n < bins:
        raise GrowError(f"{n} tokens cannot fill {bins} bins")
    diff = (stats["loss_a"] + stats["loss_b"]) / 2
    per = {
        "loss_a": stats["loss_a"],
        "loss_b": stats["loss_b"],
        "gain": stats["loss_a"] - stats["loss_b"],
        "gap": stats["p_b"] - stats["p_a"],
        "abs_gap": (stats["p_b"] - stats["p_a"]).abs(),
        "js": stats["js"],
    }
    order = torch.argsort(diff, stable=True)
    index = torch.empty(n, dtype=torch.long)
    rows = []
    start = 0
    for b in range(bins):
        size = n // bins + (1 if b < n % bins else 0)
        sel = order[start : start + size]
        index[sel] = b
        rows.append(_row(str(b), sel, diff, per))
        start += size
    rows.append(_row("all", order, diff, per))
    return rows, index


def _row(name: str, sel: torch.Tensor, diff: torch.Tensor, per: dict) -> BinRow:
    d = diff[sel]
    return BinRow(name, len(sel), float(d.min()), float(d.max()), **{k: float(per[k][sel].mean()) for k in FIELDS})


def compare_models(model_a, model_b, windows: torch.Tensor, bins: int = 5, batch: int = 8) -> list[BinRow]:
    """The binned token-level comparison of B against A on ``windows`` (see module docstring)."""
    rows, _ = bin_tokens(token_stats(model_a, model_b, windows, batch=batch), bins)
    return rows
