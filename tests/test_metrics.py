"""Condensation metrics (growtool.metrics): stable rank and row cosine on matrices whose values are
known, and the stable rank against an SVD on random matrices of either orientation."""

import json
import weakref

import pytest
import torch

from growtool.io import checkpoint
from growtool.metrics import matrix_metrics, row_cosine, stable_rank

from helpers import cli, make_config, random_tensors, write_ckpt


@pytest.mark.parametrize("shape", [(7, 7), (24, 96), (96, 24), (300, 40)])
def test_stable_rank_equals_the_svd_figure(shape):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(*shape, generator=g) * torch.linspace(0.1, 3.0, shape[1])  # unequal column scales
    s = torch.linalg.svdvals(w.double())
    want = float((s**2).sum() / s[0] ** 2)
    assert stable_rank(w) == pytest.approx(want, rel=1e-5)
    assert stable_rank(w.to(torch.bfloat16)) == pytest.approx(stable_rank(w.to(torch.bfloat16).float()), rel=1e-12)


def test_stable_rank_of_known_matrices():
    u = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(1)))[0]
    v = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(2)))[0]
    for k in (1, 5, 32):  # k equal singular values: stable rank k
        w = u[:, :k] @ (2.5 * v[:, :k]).T
        assert stable_rank(w) == pytest.approx(k, rel=1e-5)
    assert stable_rank(torch.outer(torch.arange(1.0, 9.0), torch.ones(16))) == pytest.approx(1.0, rel=1e-6)
    assert stable_rank(torch.zeros(4, 6)) == 0.0


def test_row_cosine_of_known_rows():
    assert row_cosine(torch.ones(5, 3) * torch.arange(1.0, 6.0)[:, None]) == pytest.approx(1.0)  # one direction
    assert row_cosine(torch.eye(6)) == pytest.approx(0.0)  # orthogonal rows
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0]])  # |cos| 1/sqrt2, 1, 1/sqrt2 per pair
    assert row_cosine(w) == pytest.approx((2 / 2**0.5 + 1) / 3)
    assert row_cosine(torch.ones(1, 4)) == 0.0


def test_inspect_metrics_reads_one_tensor_at_a_time(tmp_path, monkeypatch):
    """``growtool inspect --metrics`` holds one tensor of the checkpoint at a time (a 7B model's
    matrices need not fit in memory together) and reports the metrics of the tensors themselves."""
    cfg = make_config(width=32, layers=3, vocab=64)
    src = write_ckpt(tmp_path / "a.safetensors", cfg, seed=3)
    live, most = [0], [0]
    real_get = checkpoint.Checkpoint.get

    def get(self, name, *a, **kw):
        t = real_get(self, name, *a, **kw)
        live[0] += 1
        most[0] = max(most[0], live[0])
        weakref.finalize(t, lambda: live.__setitem__(0, live[0] - 1))
        return t

    monkeypatch.setattr(checkpoint.Checkpoint, "get", get)
    r = cli("inspect", src, "--metrics", "--json")
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)["metrics"]
    tensors = random_tensors(cfg, seed=3)
    want = matrix_metrics(cfg, tensors.__getitem__, tensors)
    assert got.keys() == want.keys() and all(got[n] == pytest.approx(want[n], rel=1e-6) for n in want)
    assert len(got) == 7 * cfg.layers + 2  # q, k, v, o, gate, up, down per block; embedding, head
    assert most[0] <= 2
