"""Token-level model comparison (growtool.compare)."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from growtool.init import init_model
from growtool.lab.compare import bin_tokens, compare_models, js_divergence, token_stats
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError

from helpers import make_config

V = 32


def tiny(seed=0, family="llama"):
    cfg = make_config(family, width=16, layers=1, heads=2, ffn=32, vocab=V, context=32)
    return init_model(cfg, gamma=0.5, seed=seed)


class Boosted(nn.Module):
    """A model that adds ``c`` to the logit of (last token + 1) mod V: on windows that count up
    by one, that is the target everywhere, so it puts strictly more mass on every target."""

    def __init__(self, base, c):
        super().__init__()
        self.base, self.c, self.cfg = base, c, base.cfg

    def forward(self, x):
        return self.base(x) + self.c * F.one_hot((x + 1) % V, V).float()


def counting_windows(n=12, t=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(V, (n, 1), generator=g)
    return (starts + torch.arange(t)) % V


def random_windows(n=10, t=17, seed=1):
    return torch.randint(V, (n, t), generator=torch.Generator().manual_seed(seed))


def test_identical_models_zero_gap_and_js_in_every_bin():
    a = tiny()
    b = tiny()  # same seed: an identical, separate model
    rows = compare_models(a, b, random_windows(), bins=5)
    assert [r.bin for r in rows] == ["0", "1", "2", "3", "4", "all"]
    for r in rows:
        assert r.gap == 0.0 and r.abs_gap == 0.0 and r.gain == 0.0
        assert abs(r.js) < 1e-12
        assert r.loss_a == r.loss_b


def test_strictly_better_model_positive_gain_in_every_bin():
    a = tiny()
    b = Boosted(a, 2.0)
    rows = compare_models(a, b, counting_windows(), bins=4)
    for r in rows:
        assert r.gain > 0 and r.gap > 0 and r.js > 0
        assert r.loss_b < r.loss_a
    # per token too, not only on average
    s = token_stats(a, b, counting_windows())
    assert bool((s["loss_b"] < s["loss_a"]).all()) and bool((s["p_b"] > s["p_a"]).all())


def test_bins_partition_the_tokens_and_are_ordered():
    a, b = tiny(0), tiny(1)
    w = random_windows(n=7, t=13)  # 84 tokens: not a multiple of 5
    s = token_stats(a, b, w)
    n = w.shape[0] * (w.shape[1] - 1)
    assert len(s["loss_a"]) == n
    rows, index = bin_tokens(s, bins=5)
    counts = torch.bincount(index, minlength=5)
    assert counts.tolist() == [r.tokens for r in rows[:5]]
    assert int(counts.sum()) == n == rows[-1].tokens
    assert int(counts.max() - counts.min()) <= 1
    diff = (s["loss_a"] + s["loss_b"]) / 2
    for k in range(4):  # every token of bin k is no harder than every token of bin k+1
        assert float(diff[index == k].max()) <= float(diff[index == k + 1].min())
        assert rows[k].difficulty_hi <= rows[k + 1].difficulty_lo
    # the "all" row is the plain validation-loss difference
    assert math.isclose(rows[-1].gain, rows[-1].loss_a - rows[-1].loss_b, rel_tol=1e-9, abs_tol=1e-12)


def test_token_losses_match_the_models_cross_entropy():
    a, b = tiny(0), tiny(1, family="gpt2")
    w = random_windows()
    s = token_stats(a, b, w, batch=3)
    with torch.no_grad():
        _, la = a(w[:, :-1], w[:, 1:])
        _, lb = b(w[:, :-1], w[:, 1:])
    assert math.isclose(float(s["loss_a"].mean()), float(la), rel_tol=1e-5)
    assert math.isclose(float(s["loss_b"].mean()), float(lb), rel_tol=1e-5)


def test_swapping_models_negates_gain_and_gap_keeps_the_rest():
    a, b = tiny(0), tiny(1)
    w = random_windows()
    ab = compare_models(a, b, w, bins=3)
    ba = compare_models(b, a, w, bins=3)
    for r, q in zip(ab, ba):
        assert r.tokens == q.tokens
        assert math.isclose(r.gain, -q.gain, abs_tol=1e-12) and math.isclose(r.gap, -q.gap, abs_tol=1e-12)
        assert math.isclose(r.js, q.js, rel_tol=1e-9) and math.isclose(r.abs_gap, q.abs_gap, rel_tol=1e-9)
    assert any(abs(r.gain) > 1e-6 for r in ab)


def test_js_divergence_known_values():
    lp = torch.tensor([[0.0, -math.inf], [math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    lq = torch.tensor([[-math.inf, 0.0], [math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    js = js_divergence(lp, lq)
    assert math.isclose(float(js[0]), math.log(2), rel_tol=1e-12)  # disjoint supports: the maximum
    assert abs(float(js[1])) < 1e-15
    p = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64)
    m = (p + q) / 2
    want = 0.5 * float((p * (p / m).log()).sum()) + 0.5 * float((q * (q / m).log()).sum())
    assert math.isclose(float(js_divergence(p.log()[None], q.log()[None])[0]), want, rel_tol=1e-12)


def test_bad_input_is_a_grow_error():
    a = tiny()
    with pytest.raises(GrowError):
        token_stats(a, a, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(GrowError):
        compare_models(a, a, random_windows(n=1, t=4), bins=5)  # 3 tokens, 5 bins
    other = init_model(
        ModelConfig(
            family="llama", vocab_size=V + 1, width=16, layers=1, heads=2, kv_heads=2, head_dim=8, ffn=32, context=32
        ),
        seed=0,
    )
    with pytest.raises(GrowError):
        token_stats(a, other, random_windows())
