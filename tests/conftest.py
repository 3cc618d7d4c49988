import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from growtool.cli import main
from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint

from helpers_hardening import make_config

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = {p.stem: p for p in sorted((ROOT / "fixtures").glob("*.safetensors"))}


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests (a shared 2-core machine runs them steadier so)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cli(*args, input=None):
    """Run the CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def sh(cmd: str, **kw) -> subprocess.CompletedProcess:
    """Run a shell pipeline with the growtool of this interpreter first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(cmd, shell=True, capture_output=True, env=env, **kw)


def verify_json(source, grown, *extra):
    r = cli("verify", source, grown, "--json", "--samples", 4, *extra)
    assert r.exit_code in (0, 1), r.stderr
    return r.exit_code, json.loads(r.stdout)


def perturbed(model, scale=0.2, seed=0):
    """Give a fresh model non-trivial norm gains and biases (so growth must handle them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 and "growth_gate" not in n:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def grown_gpt2(d: Path, layers: int) -> tuple[Path, str, str]:
    """A small text and a gated GPT-2 (width 32, tied head) saved in ``d``, then grown to width 48 by
    srio: (text, source path, grown path). For the data-parallel tests."""
    text = d / "d.txt"
    text.write_text(
        " ".join(
            f"the {w} sees {v} number {i % 7}."
            for i, (w, v) in enumerate(zip(["cat", "dog", "fox", "owl"] * 100, ["a hat", "the sea", "one tree"] * 134))
        )
    )
    cfg = make_config("gpt2", width=32, layers=layers, heads=4, ffn=64, vocab=256, context=16, tie=True, attn_gate=True)
    source = checkpoint.save_tensors(str(d / "a.safetensors"), cfg, [], init_model(cfg, gamma=0.5, seed=0).tensors())
    ck = checkpoint.load(source)
    plan = build_plan(cfg, recipes.load("srio"), 48)
    grown = {n: grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()}
    return text, source, checkpoint.save_tensors(str(d / "g.safetensors"), plan.cfg, [], grown)


@pytest.fixture(params=sorted(FIXTURES))
def fixture_ckpt(request):
    return FIXTURES[request.param]
