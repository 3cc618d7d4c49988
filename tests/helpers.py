"""The tests' shared helpers (one module; no test module imports another): the CLI in-process
(``cli``) and as a process (``run``, ``sh``), tiny configs (``make_config``, ``tiny_cfg``) and
checkpoints with non-trivial weights, hashing, a toy text (``make_text``), the fixtures folder."""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import torch
from click.testing import CliRunner

from growtool.cli import main
from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.config import ModelConfig

GROWTOOL = str(Path(sys.executable).parent / "growtool")
NOBODY = 65534


def make_config(
    family="llama",
    width=32,
    layers=2,
    heads=4,
    kv_heads=None,
    head_dim=None,
    ffn=None,
    vocab=64,
    context=32,
    tie=False,
    attn_gate=False,
    qkv_bias=False,
    norm_eps=1e-5,
) -> ModelConfig:
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        width=width,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim or width // heads,
        ffn=ffn or 2 * width,
        context=context,
        norm_eps=norm_eps,
        tie=tie,
        attn_gate=attn_gate,
        qkv_bias=qkv_bias and family == "llama",
    )


def random_tensors(cfg: ModelConfig, seed: int = 0, gamma: float = 0.5, perturb: float = 0.3) -> dict:
    """gamma-init weights plus random norm gains / biases (1-d tensors), so gain folding is exercised."""
    t = init_model(cfg, gamma=gamma, seed=seed).tensors()
    g = torch.Generator().manual_seed(seed + 1)
    for n, v in t.items():
        if v.dim() == 1 and "growth_gate" not in n:
            v.add_(perturb * torch.randn(v.shape, generator=g))
    return t


def write_ckpt(path, cfg: ModelConfig, seed: int = 0, dtype=torch.float32, **kw) -> Path:
    tensors = {n: v.to(dtype) for n, v in random_tensors(cfg, seed).items()}
    checkpoint.save_tensors(str(path), cfg, [], tensors, force=True, **kw)
    return Path(path)


def sha256(path) -> str:
    """Hash of a file's bytes, or of every file in a folder (relative names and contents, sorted)."""
    p = Path(path)
    if not p.is_dir():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(str(f.relative_to(p)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def listing(folder) -> dict[str, int]:
    """Every path under ``folder`` (hidden ones included) with its size: detects leftovers."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*")}


def cli(*args, input=None, env=None):
    """The CLI in-process (``env``: variables set for the call); click's Result has exit_code, stdout, stderr."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input, env=env)


def run(*args, input=None, user=None, cwd=None, timeout=1800, env=None) -> subprocess.CompletedProcess:
    """The installed ``growtool`` as a subprocess (optionally as another user, or with ``env``);
    ``timeout`` is a hang guard, never a time limit a loaded machine could hit."""
    kw = dict(user=user, group=user, extra_groups=[]) if user is not None else {}
    return subprocess.run(
        [GROWTOOL, *map(str, args)], input=input, capture_output=True, cwd=cwd, timeout=timeout, env=env, **kw
    )


def raw_safetensors(header: dict, data: bytes, pad: bool = True) -> bytes:
    """Hand-made safetensors bytes (any header, valid or not)."""
    hb = json.dumps(header).encode()
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def read_raw(path) -> tuple[dict, bytes]:
    """(header dict incl. __metadata__, data bytes) of a safetensors file."""
    b = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", b[:8])
    return json.loads(b[8 : 8 + n]), b[8 + n :]


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


ROOT = Path(__file__).resolve().parent.parent
FIXTURES = {p.stem: p for p in sorted((ROOT / "fixtures").glob("*.safetensors"))}
SEQ = 32  # the training tests' sequence length (``tiny_cfg``'s context)


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


def make_text(n_sentences: int, seed: int = 0) -> str:
    """A learnable toy language: fixed sentence frames, number agreement, a few word lists."""
    r = random.Random(seed)
    nouns = [("cat", "cats"), ("dog", "dogs"), ("fox", "foxes"), ("king", "kings"), ("bird", "birds")]
    verbs = [("sees", "see"), ("likes", "like"), ("finds", "find"), ("helps", "help")]
    out = []
    for _ in range(n_sentences):
        pl = r.random() < 0.5
        out.append(f"{'some' if pl else 'the'} {r.choice(nouns)[pl]} {r.choice(verbs)[pl]} the {r.choice(nouns)[0]}.")
    return " ".join(out) + "\n"


def tiny_cfg(**kw):
    base = dict(
        family="llama",
        vocab_size=256,
        width=32,
        layers=1,
        heads=4,
        kv_heads=4,
        head_dim=8,
        ffn=128,
        context=SEQ,
        norm_eps=1e-12,
        tie=False,
        attn_gate=True,
    )
    return ModelConfig(**{**base, **kw})


# peak memory of a run in a child process (test_hardening, test_verify): VmHWM around each command
CHILD = r"""
import json, re, sys
def hwm():
    return int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
import torch, growtool.cli, growtool.grow.engine, growtool.check  # everything a run imports
from growtool.cli import main
res = {"baseline": hwm(), "peaks": [], "codes": []}
for args in sys.argv[1:]:
    try:
        main(args.split("|"), standalone_mode=False)
        res["codes"].append(0)
    except SystemExit as e:
        res["codes"].append(e.code)
    res["peaks"].append(hwm())
print("RESULT " + json.dumps(res))
"""


# ---- growth inside training (test_stages, test_growth_options) -------------------------------

STAGES_KW = dict(batch=8, seq=32, eval_batches=2, device="cpu", progress=False, lr=1e-2)


def stages_world(d: Path) -> dict:
    """A toy text and a tiny llama (``tiny_cfg``, seed 0) saved in ``d``: {"dir", "text", "base"}."""
    text = d / "toy.txt"
    text.write_text(make_text(1500))
    base = checkpoint.save_tensors(
        str(d / "base.safetensors"), tiny_cfg(), [], init_model(tiny_cfg(), seed=0).tensors()
    )
    return {"dir": d, "text": text, "base": base}


def strip(records):
    return [{k: v for k, v in r.items() if k != "tok_s"} for r in records]


def tree(folder) -> dict[str, str]:
    """Every path under ``folder`` (hidden ones too) -> sha256 of its bytes ('dir' / 'link:...')."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "special"
    return out


def refused(r, code: int, *fragments, folder=None, before=None) -> str:
    """Assert the contract on a finished run (subprocess or CliRunner): exit ``code``, one stderr line
    containing ``fragments``, no traceback, and (with ``folder``) the folder's tree as ``before``."""
    if hasattr(r, "returncode"):
        rc, err = r.returncode, r.stderr.decode(errors="replace")
    else:
        rc, err = r.exit_code, r.stderr
    lines = err.strip().splitlines()
    assert rc == code, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    for f in fragments:
        assert f.lower() in lines[0].lower(), (f, lines[0])
    if folder is not None:
        assert tree(folder) == before
    return lines[0]


def text_file(path: Path) -> Path:
    path.write_text(" ".join(f"the cat {i % 7} sees the dog." for i in range(200)))
    return path
