"""verify: streamed one block at a time (same figures as whole models, bounded memory) and aware of
low precision (an exact bf16/fp16 growth passes by default, a lossy one still fails)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from growtool.check import compare, figures, random_batches, streamed_logits
from growtool.io import checkpoint

from conftest import FIXTURES, cli
from helpers_hardening import make_config, write_ckpt
from test_hardening import CHILD


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_streamed_figures_equal_the_whole_model_ones(name, tmp_path):
    src, grown = FIXTURES[name], tmp_path / "g.safetensors"
    assert cli("expand", src, "--width", 96, "-q", "-o", grown).exit_code == 0
    a, b = checkpoint.load(src), checkpoint.load(grown)
    x = random_batches(a.config.vocab_size, a.config.context, 12, seed=3)
    for alpha in (0.0, 1.0):
        whole = compare(a.model(), b.model(), x, alpha)
        streamed = figures(streamed_logits(a, x, 0.0), streamed_logits(b, x, alpha), alpha)
        assert streamed.tokens == whole.tokens and streamed.top1 == whole.top1
        assert streamed.max_dlogit == pytest.approx(whole.max_dlogit, rel=1e-5, abs=1e-7)
        assert streamed.logit_scale == pytest.approx(whole.logit_scale, rel=1e-6)


def _lowp_source(tmp_path, family, dtype):
    cfg = make_config(family=family, width=64, heads=4, kv_heads=2 if family == "llama" else 4, tie=True)
    return write_ckpt(tmp_path / f"{family}.safetensors", cfg, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_exact_growth_passes_and_lossy_fails(dtype, tmp_path):
    name = str(dtype).replace("torch.", "")
    for family in ("llama", "gpt2"):
        src, grown = _lowp_source(tmp_path, family, dtype), tmp_path / f"{family}-g.safetensors"
        assert cli("expand", src, "--width", 96, "-q", "-o", grown).exit_code == 0
        assert checkpoint.load(grown).main_dtype() == dtype
        r = cli("verify", src, grown, "--json", "--samples", 8)
        rep = json.loads(r.stdout)
        assert r.exit_code == 0, rep
        assert rep["dtype"] == name and rep["floor"] > rep["tol"]  # the tolerance alone would fail it
        assert rep["results"][0]["rel"] <= rep["floor"] == rep["limit"]
        assert rep["results"][0]["rel"] > rep["tol"]  # really a low-precision error, not an exact match
    lossy = tmp_path / "nrio.safetensors"  # no operator on LayerNorm: ~40% of the logit scale
    assert (
        cli(
            "expand", _lowp_source(tmp_path, "gpt2", dtype), "--width", 96, "--recipe", "nrio", "-q", "-o", lossy
        ).exit_code
        == 0
    )
    r = cli("verify", tmp_path / "gpt2.safetensors", lossy, "--json", "--samples", 8)
    rep = json.loads(r.stdout)
    assert r.exit_code == 1 and rep["results"][0]["rel"] > 5 * rep["floor"], rep


def test_float32_has_no_floor(tmp_path):
    grown = tmp_path / "g.safetensors"
    assert cli("expand", FIXTURES["llama-gqa"], "--width", 96, "-q", "-o", grown).exit_code == 0
    rep = json.loads(cli("verify", FIXTURES["llama-gqa"], grown, "--json", "--samples", 4).stdout)
    assert rep["floor"] == 0.0 and rep["limit"] == rep["tol"] and rep["dtype"] == "float32"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_verify_peak_memory_is_a_block_not_the_model(tmp_path):
    """verify of a 2-layer and an 8-layer model (and their growths) in one process: the peak
    resident set must not grow with the number of layers by more than four of the largest tensors
    in float32 (the 6 extra layers of both models hold ~50 of them). Measured on this configuration:
    whole models in memory +247 MiB from 2 to 8 layers, streamed +5 to +9 MiB, same figures."""
    kw = dict(width=384, heads=6, ffn=1536, vocab=256, context=64)
    runs = []
    for layers in (2, 8):
        src = write_ckpt(tmp_path / f"s{layers}.safetensors", make_config(layers=layers, **kw))
        grown = tmp_path / f"g{layers}.safetensors"
        assert cli("expand", src, "--width", 512, "-q", "-o", grown).exit_code == 0
        runs.append(f"verify|{src}|{grown}|--samples|4|-q")
    p = subprocess.run([sys.executable, "-c", CHILD, *runs], capture_output=True, text=True, timeout=300)
    res = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert res["codes"] == [0, 0], p.stderr
    out = checkpoint.load(tmp_path / "g8.safetensors")
    largest = max(4 * torch.Size(out.shape(n)).numel() for n in out.names())
    model_bytes = sum(4 * torch.Size(out.shape(n)).numel() for n in out.names())
    p_small, p_big = res["peaks"]
    assert model_bytes > 25 * largest
    assert p_big - p_small < 4 * largest, (p_small, p_big, largest)
