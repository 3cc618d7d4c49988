"""The bad-input catalogue: every malformed input is refused with one line, exit 2, and no damage.

For each case: exactly one line on stderr (``growtool: error: ...``) naming the problem and the file
(or option) at fault, exit code 2, nothing on stdout, no Python traceback, no output or temporary
file left behind (the folder's listing is unchanged), and every input byte-identical afterwards.
The CLI runs in-process (click's CliRunner) except where a real process is needed (another user).
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.io import checkpoint
from growtool.nn.families import ARCHS

from helpers import (
    cli,
    listing,
    make_config,
    random_tensors,
    raw_safetensors,
    read_raw,
    run,
    sha256,
    write_ckpt,
)


@dataclass
class Case:
    args: list
    expect: list[str]  # fragments the error line must contain (case-insensitive): the problem and the file
    watch: list = field(default_factory=list)  # files / folders that must be byte-identical afterwards
    input: bytes | None = None  # standard input


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def base(tmp, name="a.safetensors", **kw) -> Path:
    return write_ckpt(tmp / name, make_config(**kw))


def edit_header(src: Path, dst: Path, fn) -> Path:
    """Copy ``src`` to ``dst`` with its header (incl. __metadata__) changed by ``fn(header)``."""
    h, data = read_raw(src)
    fn(h)
    dst.write_bytes(raw_safetensors(h, data))
    return dst


def edit_config(src: Path, dst: Path, **changes) -> Path:
    def fn(h):
        c = json.loads(h["__metadata__"]["config"])
        c.update(changes)
        h["__metadata__"]["config"] = json.dumps(c)

    return edit_header(src, dst, fn)


def expand(src, tmp, *extra):
    return ["expand", src, "--width", 48, "-q", "-o", tmp / "out.safetensors", *extra]


def saved_with(tmp, tensors: dict, cfg=None, name="bad.safetensors") -> Path:
    """Write ``tensors`` with safetensors itself (our writer would refuse some of these)."""
    cfg = cfg or make_config()
    p = tmp / name
    save_file(tensors, str(p), metadata=checkpoint.metadata(cfg, []))
    return p


# ---- the file itself ------------------------------------------------------------------------


@case
def truncated_file(tmp, mp):
    a = base(tmp)
    bad = tmp / "trunc.safetensors"
    bad.write_bytes(a.read_bytes()[: a.stat().st_size // 2])
    return Case(expand(bad, tmp), ["truncated", "trunc.safetensors"], [bad])


@case
def truncated_inside_length_prefix(tmp, mp):
    bad = tmp / "tiny.safetensors"
    bad.write_bytes(b"\x10\x00\x00")
    return Case(expand(bad, tmp), ["not a safetensors file", "tiny.safetensors"], [bad])


@case
def header_length_beyond_file(tmp, mp):
    a = base(tmp)
    b = bytearray(a.read_bytes())
    b[:8] = (len(b) + 10).to_bytes(8, "little")
    bad = tmp / "hlen.safetensors"
    bad.write_bytes(bytes(b))
    return Case(expand(bad, tmp), ["header length", "hlen.safetensors"], [bad])


@case
def header_invalid_json(tmp, mp):
    bad = tmp / "json.safetensors"
    hb = b'{"a": {"dtype": "F32",,}}  '
    bad.write_bytes(len(hb).to_bytes(8, "little") + hb + b"\0" * 16)
    return Case(expand(bad, tmp), ["not valid json", "json.safetensors"], [bad])


@case
def header_not_an_object(tmp, mp):
    bad = tmp / "list.safetensors"
    bad.write_bytes(raw_safetensors([1, 2, 3], b""))
    return Case(expand(bad, tmp), ["not a json object", "list.safetensors"], [bad])


@case
def tensor_offsets_overlap(tmp, mp):
    def fn(h):
        names = [n for n in h if n != "__metadata__" and h[n]["shape"] == [32]]  # two same-size tensors
        h[names[1]]["data_offsets"] = list(h[names[0]]["data_offsets"])

    bad = edit_header(base(tmp), tmp / "overlap.safetensors", fn)
    return Case(expand(bad, tmp), ["overlap", "overlap.safetensors"], [bad])


@case
def tensor_offsets_out_of_range(tmp, mp):
    def fn(h):
        e = h["model.norm.weight"]
        e["data_offsets"] = [e["data_offsets"][0] + 10**6, e["data_offsets"][1] + 10**6]

    bad = edit_header(base(tmp), tmp / "range.safetensors", fn)
    return Case(expand(bad, tmp), ["model.norm.weight", "outside", "range.safetensors"], [bad])


@case
def tensor_offsets_not_integers(tmp, mp):
    bad = edit_header(
        base(tmp), tmp / "offs.safetensors", lambda h: h["model.norm.weight"].update(data_offsets="0-128")
    )
    return Case(expand(bad, tmp), ["bad data offsets", "offs.safetensors"], [bad])


@case
def unknown_dtype(tmp, mp):
    bad = edit_header(base(tmp), tmp / "dt.safetensors", lambda h: h["model.norm.weight"].update(dtype="F12"))
    return Case(expand(bad, tmp), ["unknown dtype", "F12", "dt.safetensors"], [bad])


@case
def shape_and_byte_count_disagree(tmp, mp):
    bad = edit_header(base(tmp), tmp / "shape.safetensors", lambda h: h["model.norm.weight"].update(shape=[31]))
    return Case(expand(bad, tmp), ["model.norm.weight", "needs", "bytes", "shape.safetensors"], [bad])


@case
def metadata_not_strings(tmp, mp):
    bad = edit_header(base(tmp), tmp / "meta.safetensors", lambda h: h["__metadata__"].update(family=["llama"]))
    return Case(expand(bad, tmp), ["__metadata__", "meta.safetensors"], [bad])


@case
def not_safetensors_at_all(tmp, mp):
    bad = tmp / "notes.safetensors"
    bad.write_text("these are my notes about the model, not a checkpoint\n" * 3)
    return Case(expand(bad, tmp), ["not a checkpoint", "notes.safetensors", "a Hugging Face model folder"], [bad])


@case
def no_such_input(tmp, mp):
    return Case(expand(tmp / "missing.safetensors", tmp), ["no such file", "missing.safetensors"])


@case
def folder_without_config(tmp, mp):
    (tmp / "m").mkdir()
    shutil.copy(base(tmp), tmp / "m" / "model.safetensors")
    return Case(expand(tmp / "m", tmp), ["no config.json", str(tmp / "m")], [tmp / "m"])


def shards(tmp) -> tuple[Path, list[str]]:
    m = tmp / "m"
    write_ckpt(m, make_config(), shard_size=20_000)
    names = sorted(set(json.loads((m / "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert len(names) >= 3
    return m, names


@case
def sharded_index_names_missing_shard(tmp, mp):
    m, names = shards(tmp)
    (m / names[1]).unlink()
    return Case(expand(m, tmp), [f"shard {names[1]} is missing", "model.safetensors.index.json"], [m])


@case
def sharded_tensor_in_two_shards(tmp, mp):
    m, names = shards(tmp)
    s1, s2 = m / names[0], m / names[1]
    h1, d1 = read_raw(s1)
    h2, d2 = read_raw(s2)
    name = next(n for n in h1 if n != "__metadata__")
    off = len(d2)
    h2[name] = {**h1[name], "data_offsets": [off, off + h1[name]["data_offsets"][1] - h1[name]["data_offsets"][0]]}
    s2.write_bytes(raw_safetensors(h2, d2 + d1[slice(*h1[name]["data_offsets"])]))
    return Case(expand(m, tmp), [name, "also in", "model-0000"], [m])


# ---- the tensors ----------------------------------------------------------------------------


def _with_value(tmp, value, name):
    t = random_tensors(make_config())
    t["model.layers.1.mlp.down_proj.weight"][3, 5] = value
    p = tmp / name
    checkpoint.save_tensors(str(p), make_config(), [], t)
    return p


@case
def nan_weights(tmp, mp):
    bad = _with_value(tmp, float("nan"), "nan.safetensors")
    return Case(expand(bad, tmp), ["model.layers.1.mlp.down_proj.weight", "nan", "nan.safetensors"], [bad])


@case
def inf_weights(tmp, mp):
    bad = _with_value(tmp, float("inf"), "inf.safetensors")
    return Case(expand(bad, tmp), ["model.layers.1.mlp.down_proj.weight", "inf", "inf.safetensors"], [bad])


@case
def missing_tensor_for_the_family(tmp, mp):
    t = random_tensors(make_config())
    del t["model.layers.1.self_attn.k_proj.weight"]
    bad = saved_with(tmp, t)
    return Case(expand(bad, tmp), ["model.layers.1.self_attn.k_proj.weight", "missing", "bad.safetensors"], [bad])


@case
def extra_tensor(tmp, mp):
    t = random_tensors(make_config())
    t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)
    bad = saved_with(tmp, t)
    return Case(expand(bad, tmp), ["unexpected tensor model.layers.0.mlp.extra_proj.weight", "bad.safetensors"], [bad])


@case
def integer_weights(tmp, mp):
    t = random_tensors(make_config())
    t["model.norm.weight"] = torch.ones(32, dtype=torch.int32)
    bad = saved_with(tmp, t)
    return Case(expand(bad, tmp), ["model.norm.weight", "floating point", "bad.safetensors"], [bad])


@case
def mixed_dtypes(tmp, mp):
    t = random_tensors(make_config())
    t["model.norm.weight"] = t["model.norm.weight"].half()
    bad = saved_with(tmp, t)
    return Case(expand(bad, tmp), ["mix dtypes", "bad.safetensors"], [bad])


# ---- the config -----------------------------------------------------------------------------


@case
def config_and_tensor_shapes_disagree(tmp, mp):
    bad = edit_config(base(tmp), tmp / "cfg.safetensors", vocab_size=80)
    return Case(expand(bad, tmp), ["config and tensors disagree", "cfg.safetensors"], [bad])


@case
def unknown_family(tmp, mp):
    bad = edit_config(base(tmp), tmp / "bert.safetensors", model_type="bert")
    return Case(expand(bad, tmp), ["unknown family", "bert", "bert.safetensors"], [bad])


@case
def heads_do_not_divide_width(tmp, mp):
    bad = edit_config(base(tmp, family="gpt2"), tmp / "heads.safetensors", n_head=5)
    return Case(expand(bad, tmp), ["heads 5 do not divide width 32", "heads.safetensors"], [bad])


@case
def kv_heads_do_not_divide_heads(tmp, mp):
    bad = edit_config(base(tmp), tmp / "kv.safetensors", num_key_value_heads=3)
    return Case(expand(bad, tmp), ["kv_heads 3 does not divide heads 4", "kv.safetensors"], [bad])


@case
def no_config_anywhere(tmp, mp):
    t = random_tensors(make_config())
    bad = tmp / "nocfg.safetensors"
    save_file(t, str(bad))
    return Case(expand(bad, tmp), ["no model config", "nocfg.safetensors"], [bad])


@case
def vocab_mismatch_in_verify(tmp, mp):
    a = base(tmp)
    b = write_ckpt(tmp / "b.safetensors", make_config(width=48, heads=6, vocab=80))
    return Case(["verify", a, b], ["vocab sizes differ", "a.safetensors", "b.safetensors"], [a, b])


# ---- the growth request ---------------------------------------------------------------------


@case
def target_width_not_larger(tmp, mp):
    a = base(tmp)
    return Case(
        ["expand", a, "--width", 32, "-q", "-o", tmp / "o.safetensors"],
        ["not larger than the source width 32", "a.safetensors"],
        [a],
    )


@case
def target_width_not_multiple_of_head_dim(tmp, mp):
    a = base(tmp, family="gpt2")  # llama-like families pick heads for any width; GPT-2's heads fill it
    return Case(
        ["expand", a, "--width", 44, "-q", "-o", tmp / "o.safetensors"],
        ["not a multiple of head_dim 8", "a.safetensors"],
        [a],
    )


@case
def target_heads_break_kv_groups(tmp, mp):
    a = base(tmp, kv_heads=1)
    return Case(
        ["expand", a, "--width", 48, "--heads", 6, "-q", "-o", tmp / "o.safetensors"],
        ["not a multiple of the 4 query heads per kv head", "a.safetensors"],
        [a],
    )


@case
def lossy_option_refused(tmp, mp):
    a = base(tmp, family="gpt2")
    return Case(
        expand(a, tmp, "--set", "rotation.eps=0.9"),
        ["refused", "layernorm cannot absorb", "--allow-lossy", "a.safetensors"],
        [a],
    )


@case
def source_gates_open(tmp, mp):
    cfg = make_config()
    src = random_tensors(cfg)
    plan = build_plan(cfg, recipes.load("srio"), 48)
    t = {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}
    t[ARCHS["llama"].gate_name(0)].fill_(0.5)
    g = tmp / "g.safetensors"
    checkpoint.save_tensors(str(g), plan.cfg, [], t)
    return Case(
        ["expand", g, "--width", 64, "-q", "-o", tmp / "o.safetensors"],
        ["gates are open", "fold", "g.safetensors"],
        [g],
    )


# ---- the recipe -----------------------------------------------------------------------------


def _recipe(tmp, text, name="r.yaml"):
    p = tmp / name
    p.write_text(text)
    return p


@case
def unknown_recipe_key(tmp, mp):
    a, r = base(tmp), _recipe(tmp, "rotaton:\n  eps: 0.9\n")
    return Case(expand(a, tmp, "--recipe", r), ["unknown recipe key", "rotaton", "r.yaml"], [a, r])


@case
def wrong_value_type_in_recipe(tmp, mp):
    a, r = base(tmp), _recipe(tmp, "convex_k: two\n")
    return Case(expand(a, tmp, "--recipe", r), ["convex_k", "'two'", "r.yaml"], [a, r])


@case
def eps_out_of_range_in_recipe(tmp, mp):
    a, r = base(tmp), _recipe(tmp, "rotation:\n  eps: 1.5\n")
    return Case(expand(a, tmp, "--recipe", r), ["rotation.eps", "1.5", "r.yaml"], [a, r])


@case
def eps_out_of_range_in_set(tmp, mp):
    a = base(tmp)
    return Case(expand(a, tmp, "--set", "rotation.eps=-0.2"), ["rotation.eps", "-0.2", "srio"], [a])


@case
def recipe_not_yaml(tmp, mp):
    a, r = base(tmp), _recipe(tmp, "rotation: [unclosed\n  eps: {\n")
    return Case(expand(a, tmp, "--recipe", r), ["not valid yaml", "r.yaml"], [a, r])


@case
def recipe_not_a_mapping(tmp, mp):
    a, r = base(tmp), _recipe(tmp, "- srio\n- copy\n")
    return Case(expand(a, tmp, "--recipe", r), ["must be a yaml mapping", "r.yaml"], [a, r])


@case
def unknown_recipe_name(tmp, mp):
    a = base(tmp)
    return Case(expand(a, tmp, "--recipe", "srioo"), ["unknown recipe 'srioo'"], [a])


@case
def set_without_equals(tmp, mp):
    a = base(tmp)
    return Case(expand(a, tmp, "--set", "rotation.eps"), ["--set needs key=value", "rotation.eps"], [a])


# ---- options and destinations ---------------------------------------------------------------


@case
def fold_alpha_out_of_range(tmp, mp):
    a = base(tmp)
    return Case(["fold", a, "--alpha", 1.5, "-o", tmp / "f.safetensors"], ["--alpha must be in [0, 1]", "1.5"], [a])


@case
def shard_size_not_a_size(tmp, mp):
    a = base(tmp)
    return Case(expand(a, tmp, "--shard-size", "12 parsecs"), ["--shard-size", "12 parsecs"], [a])


@case
def shards_needed_but_output_is_a_file(tmp, mp):
    a = base(tmp)
    return Case(expand(a, tmp, "--shard-size", "10KB"), ["exceeds --shard-size", "folder", "out.safetensors"], [a])


@case
def output_folder_missing(tmp, mp):
    a = base(tmp)
    return Case(
        ["expand", a, "--width", 48, "-q", "-o", tmp / "nowhere" / "o.safetensors"], ["does not exist", "nowhere"], [a]
    )


@case
def output_parent_is_a_file(tmp, mp):
    a = base(tmp)
    return Case(["expand", a, "--width", 48, "-q", "-o", a / "o.safetensors"], ["does not exist", "a.safetensors"], [a])


@case
def output_is_the_input(tmp, mp):
    a = base(tmp)
    return Case(
        ["expand", a, "--width", 48, "-q", "-o", a, "--force"], ["would overwrite the input", "a.safetensors"], [a]
    )


@case
def output_is_a_file_of_the_input_folder(tmp, mp):
    m = tmp / "m"
    write_ckpt(m, make_config())
    return Case(
        ["expand", m, "--width", 48, "-q", "-o", m / "model.safetensors", "--force"],
        ["would overwrite the input", "model.safetensors"],
        [m],
    )


@case
def output_is_the_folder_holding_the_input(tmp, mp):
    (tmp / "m").mkdir()
    a = base(tmp / "m")
    return Case(
        ["fold", a, "--alpha", 0, "-o", tmp / "m", "--force"], ["would overwrite the input", "a.safetensors"], [a]
    )


@case
def output_exists_without_force(tmp, mp):
    a = base(tmp)
    o = tmp / "out.safetensors"
    o.write_bytes(b"an earlier result")
    return Case(expand(a, tmp), ["output exists", "--force", "out.safetensors"], [a, o])


@case
def standard_input_empty(tmp, mp):
    return Case(
        ["expand", "-", "--width", 48, "-q", "-o", tmp / "o.safetensors"], ["standard input is empty"], input=b""
    )


@case
def standard_input_not_safetensors(tmp, mp):
    return Case(
        ["expand", "-", "--width", 48, "-q", "-o", tmp / "o.safetensors"],
        ["<stdin>", "not a safetensors file"],
        input=b"GIF89a" + b"\x01" * 64,
    )


@case
def disk_full(tmp, mp):
    """ENOSPC in the middle of writing (after the header): the temporary file must go."""
    a = base(tmp)
    real = os.fdopen

    class Full(io.BufferedWriter):
        written = 0

        def write(self, b):
            Full.written += len(b)
            if Full.written > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)

    def fdopen(fd, mode="r", *a, **kw):
        return Full(io.FileIO(fd, "wb")) if "w" in mode else real(fd, mode, *a, **kw)

    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):  # direct writes (checkpoint.DirectSink) go past the file object
        Full.written += len(data)
        if Full.written > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    mp.setattr(os, "fdopen", fdopen)
    mp.setattr(os, "pwrite", pwrite)
    return Case(expand(a, tmp), ["no space left on device", "out.safetensors"], [a])


@case
def unreadable_file(tmp, mp):
    """chmod 000; as root (which reads it anyway) the open() is made to fail with EACCES instead."""
    a = base(tmp)
    a.chmod(0)
    if os.access(a, os.R_OK):
        real = builtins.open

        def deny(f, *args, **kw):
            if str(f) == str(a):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(f))
            return real(f, *args, **kw)

        mp.setattr(builtins, "open", deny)
    return Case(expand(a, tmp), ["permission denied", "a.safetensors"], [a])


@case
def output_folder_not_writable(tmp, mp):
    """A read-only folder; as root (which writes anyway) /sys, where even root cannot create files."""
    a = base(tmp)
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(ro, os.W_OK):
        out = Path("/sys/growtool-test.safetensors")
        assert not out.exists()
        return Case(["expand", a, "--width", 48, "-q", "-o", out], ["cannot write", "permission denied", str(out)], [a])
    return Case(["expand", a, "--width", 48, "-q", "-o", ro / "o.safetensors"], ["not writable", str(ro)], [a])


def fingerprint(p: Path):
    st = p.stat()
    readable = os.access(p, os.R_OK) and st.st_mode & 0o444
    return st.st_size, st.st_mtime_ns, st.st_mode, sha256(p) if readable else None


@pytest.fixture
def work(tmp_path):
    yield tmp_path
    for p in [tmp_path, *tmp_path.rglob("*")]:  # let pytest clean up what the cases locked
        p.chmod(0o700)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, work, monkeypatch):
    c = CASES[name](work, monkeypatch)
    prints = {p: fingerprint(p) for p in c.watch}
    before = listing(work)
    r = cli(*c.args, input=c.input)
    code, out, err = r.exit_code, r.stdout, r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("growtool: error: "), line
    assert "Traceback" not in err
    for frag in c.expect:
        assert frag.lower() in line.lower(), f"{frag!r} not in {line!r}"
    assert out == ""
    assert listing(work) == before  # no output, no temporary file
    assert {p: fingerprint(p) for p in c.watch} == prints  # inputs untouched


def test_the_catalogue_is_large():
    assert len(CASES) >= 25


def test_error_line_in_a_real_process_has_no_traceback(tmp_path):
    """The same contract outside CliRunner: a real process reading an empty standard input."""
    p = run("expand", "-", "--width", 48, "-o", tmp_path / "o.safetensors", input=b"")
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().strip() == "growtool: error: standard input is empty (expected a safetensors checkpoint)"
    assert list(tmp_path.iterdir()) == []
