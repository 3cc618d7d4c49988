import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from growtool.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = {p.stem: p for p in sorted((ROOT / "fixtures").glob("*.safetensors"))}


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


@pytest.fixture(params=sorted(FIXTURES))
def fixture_ckpt(request):
    return FIXTURES[request.param]
