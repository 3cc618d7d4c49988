"""The growth contract end to end through the CLI: expand, verify, fold, inspect, on the shipped fixtures."""

import json
import os

import pytest
import torch

from growtool.grow import engine, recipes
from growtool.io import checkpoint
from growtool.nn.families import expected_shapes
from growtool.nn.model import LM

from helpers import FIXTURES, cli, make_config, sh, verify_json

EXACT = [r for r in recipes.shipped() if not recipes.load(r)["lossy"]]


def test_shipped_recipes_are_the_three_of_the_brief():
    assert set(recipes.shipped()) >= {"srio", "nrio", "copy"}
    assert set(EXACT) >= {"srio", "copy"}


@pytest.mark.parametrize("recipe", EXACT)
def test_expand_then_verify_is_exact_at_gate_zero(fixture_ckpt, recipe, tmp_path):
    out = tmp_path / "grown.safetensors"
    r = cli("expand", fixture_ckpt, "--width", 96, "--recipe", recipe, "-o", out, "-q")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == str(out)
    code, res = verify_json(fixture_ckpt, out, "--data", __file__)
    assert code == 0 and res["pass"]
    for row in res["results"]:
        if row["alpha"] == 0.0:
            assert row["rel"] <= 1e-4 and row["top1"] == 1.0
    grown = checkpoint.load(out)
    assert grown.config.width == 96 and grown.lineage[-1]["recipe"] == recipe


def test_two_stages_through_a_pipe_non_integer_ratios(fixture_ckpt, tmp_path):
    out = tmp_path / "c.safetensors"
    p = sh(f"growtool expand {fixture_ckpt} --width 96 -q -o - | growtool expand - --width 128 -q -o {out}")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == str(out)
    code, res = verify_json(fixture_ckpt, out)
    assert code == 0, res
    ck = checkpoint.load(out)
    assert [s["width_to"] for s in ck.lineage if s["op"] == "expand"] == [96, 128]


def test_expand_default_output_chains_through_command_substitution(tmp_path):
    src = tmp_path / "a.safetensors"
    src.write_bytes(FIXTURES["llama-gqa"].read_bytes())
    p = sh(f'growtool verify {src} "$(growtool expand {src} --width 96 -q)"')
    assert p.returncode == 0, p.stderr.decode()
    assert (tmp_path / "a-d96.safetensors").exists()


def test_three_stages_odd_ratio_stay_exact(tmp_path):
    a, b, c = FIXTURES["gpt2-tied"], tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    assert cli("expand", a, "--width", 80, "-o", b, "-q").exit_code == 0
    assert cli("expand", b, "--width", 112, "-o", c, "-q", "--seed", 5).exit_code == 0
    d = tmp_path / "d.safetensors"
    assert cli("expand", c, "--width", 144, "-o", d, "-q").exit_code == 0
    code, res = verify_json(a, d)
    assert code == 0, res


def _logits(ck_path, x, alpha=None):
    ck = checkpoint.load(ck_path)
    with torch.no_grad():
        return ck.model()(x, alpha=alpha if ck.config.gated else None)


def test_fold_alpha_one_is_the_open_gate_model(fixture_ckpt, tmp_path):
    grown, plain = tmp_path / "g.safetensors", tmp_path / "plain.safetensors"
    assert cli("expand", fixture_ckpt, "--width", 96, "-o", grown, "-q").exit_code == 0
    r = cli("fold", grown, "--alpha", 1, "-o", plain)
    assert r.exit_code == 0, r.stderr
    folded = checkpoint.load(plain)
    assert not folded.config.gated and not any("growth_gate" in n for n in folded.names())
    x = torch.randint(256, (3, 40), generator=torch.Generator().manual_seed(0))
    open_gate, flat = _logits(grown, x, alpha=1.0), _logits(plain, x)
    assert (open_gate - flat).abs().max() <= 1e-5 * open_gate.std()
    # and the open-gate model really differs from the closed one (the gate does something)
    assert (open_gate - _logits(grown, x, alpha=0.0)).abs().max() > 1e-2 * open_gate.std()


def test_fold_alpha_zero_is_lossless_and_plain(tmp_path):
    grown, plain = tmp_path / "g.safetensors", tmp_path / "p.safetensors"
    src = FIXTURES["llama-gated"]
    assert cli("expand", src, "--width", 96, "-o", grown, "-q").exit_code == 0
    assert cli("fold", grown, "--alpha", 0, "-o", plain).exit_code == 0
    code, res = verify_json(src, plain)
    assert code == 0 and not checkpoint.load(plain).config.gated


def test_lossy_option_is_refused_with_its_reason(tmp_path):
    out = tmp_path / "x.safetensors"
    r = cli("expand", FIXTURES["gpt2-tied"], "--width", 96, "--set", "rotation.eps=0.9", "-o", out)
    assert r.exit_code == 2
    assert "LayerNorm" in r.stderr and "--allow-lossy" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    r = cli("expand", FIXTURES["llama-gated"], "--width", 96, "--set", "rotation.eps=0.9", "-o", out)
    assert r.exit_code == 2 and "tied head" in r.stderr and not out.exists()


def test_allow_lossy_grows_and_reports_the_measured_loss(tmp_path):
    out = tmp_path / "x.safetensors"
    r = cli(
        "expand", FIXTURES["gpt2-tied"], "--width", 96, "--set", "rotation.eps=0.9", "--allow-lossy", "-o", out, "-q"
    )
    assert r.exit_code == 0, r.stderr
    assert "measured loss of function" in r.stderr and "KL" in r.stderr
    code, res = verify_json(FIXTURES["gpt2-tied"], out)
    assert code == 1 and not res["pass"] and res["results"][0]["rel"] > 1e-3


def test_lossy_baseline_recipe_reports_its_loss(tmp_path):
    """nrio declares itself lossy: on LayerNorm (gpt2) it grows, reports the loss, and verify fails."""
    out = tmp_path / "n.safetensors"
    r = cli("expand", FIXTURES["gpt2-tied"], "--width", 96, "--recipe", "nrio", "-o", out, "-q")
    assert r.exit_code == 0 and "measured loss of function" in r.stderr
    assert verify_json(FIXTURES["gpt2-tied"], out)[0] == 1
    # on RMSNorm zero padding is exact, and verify says so
    out2 = tmp_path / "n2.safetensors"
    assert cli("expand", FIXTURES["llama-gqa"], "--width", 96, "--recipe", "nrio", "-o", out2, "-q").exit_code == 0
    assert verify_json(FIXTURES["llama-gqa"], out2)[0] == 0


def test_recipe_file_and_set_overrides(tmp_path):
    rf = tmp_path / "mine.yaml"
    rf.write_text("name: mine\nattention: {new_heads: zero}\nffn: {new_units: convex}\n")
    out = tmp_path / "m.safetensors"
    r = cli("expand", FIXTURES["llama-gqa"], "--width", 96, "--recipe", rf, "--set", "convex_k=3", "-o", out, "-q")
    assert r.exit_code == 0, r.stderr
    st = checkpoint.load(out).lineage[-1]
    assert st["recipe"] == "mine" and st["recipe_full"]["convex_k"] == 3
    assert st["recipe_full"]["attention"]["new_heads"] == "zero"
    assert verify_json(FIXTURES["llama-gqa"], out)[0] == 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--width", 48], "not larger"),
        (["--width", 96, "--heads", 5], "--heads 4 or 6"),  # 5 query heads would split a KV group
        (["--width", 96, "--recipe", "nope"], "unknown recipe"),
        (["--width", 96, "--set", "rotation.angle=1"], "unknown recipe key"),
        (["--width", 96, "--set", "ffn.new_units=magic"], "ffn.new_units"),
    ],
)
def test_bad_expand_arguments_exit_2_without_output(args, words, tmp_path):
    out = tmp_path / "o.safetensors"
    r = cli("expand", FIXTURES["llama-gqa"], *args, "-o", out)
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_input_files_exit_2(tmp_path):
    r = cli("expand", tmp_path / "missing.safetensors", "--width", 96)
    assert r.exit_code == 2 and "no such file" in r.stderr
    bad = tmp_path / "bad.safetensors"
    bad.write_text("hello, this is not a checkpoint at all")
    r = cli("inspect", bad)
    assert r.exit_code == 2 and "not a safetensors file" in r.stderr
    cfgless = tmp_path / "x.safetensors"
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, str(cfgless))
    r = cli("inspect", cfgless)
    assert r.exit_code == 2 and "no model config" in r.stderr


def test_unknown_family_is_refused(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2)}, str(d / "model.safetensors"))
    r = cli("expand", d, "--width", 96)
    assert r.exit_code == 2 and "unknown family" in r.stderr


def test_inspect_reports_family_shapes_gates_and_lineage(tmp_path):
    out = tmp_path / "g.safetensors"
    cli("expand", FIXTURES["llama-gated"], "--width", 96, "-o", out, "-q")
    r = cli("inspect", out, "--json", "--metrics")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["family"] == "llama" and info["width"] == 96 and info["gated"]
    assert info["gates"] == [0.0, 0.0] and info["base_heads"] == 4 and info["heads"] == 6
    assert info["lineage"][-1]["op"] == "expand" and len(info["lineage"][-1]["source_sha256"]) == 64
    assert info["parameters"] == sum(torch.Size(s).numel() for s in info["tensors"].values())
    m = info["metrics"]["model.layers.0.mlp.up_proj.weight"]
    assert 1.0 <= m["stable_rank"] <= 96 and 0.0 <= m["row_cosine"] <= 1.0
    assert cli("inspect", out).exit_code == 0


def test_grown_model_is_a_bigger_trainable_model():
    """Gate open, the grown model is an ordinary width-D model: parameters scale as planned."""
    from growtool.grow.engine import grow_tensor
    from growtool.grow.plan import build_plan

    ck = checkpoint.load(FIXTURES["llama-gqa"])
    plan = build_plan(ck.config, recipes.load("srio"), 96)
    tensors = {n: grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()}
    m = LM.from_tensors(plan.cfg, tensors)
    assert (m.cfg.heads, m.cfg.kv_heads, m.cfg.ffn) == (6, 3, 288)
    x = torch.randint(256, (2, 16))
    _, loss = m(x, targets=x)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())


def test_zero_filled_new_units_are_exact_but_warned_as_dead(tmp_path):
    out = tmp_path / "z.safetensors"
    r = cli("expand", FIXTURES["llama-gqa"], "--width", 96, "--set", "ffn.new_units=zero", "-o", out, "-q")
    assert r.exit_code == 0 and "zero-gradient saddle" in r.stderr and "FFN neurons" in r.stderr
    assert verify_json(FIXTURES["llama-gqa"], out)[0] == 0
    r = cli("expand", FIXTURES["llama-gqa"], "--width", 96, "-o", tmp_path / "s.safetensors", "-q")
    assert "warning" not in r.stderr


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
@pytest.mark.parametrize("recipe", ["srio", "copy"])
def test_low_precision_growth_is_float32_growth_rounded_once(family, recipe):
    """bfloat16 / float16 sources grow in float32 and are rounded once at the end: the result equals
    the float32 growth of the (exactly) upcast source, rounded; with or without a reused workspace."""
    from growtool.grow import recipes
    from growtool.grow.engine import Workspace, grow_tensor
    from growtool.grow.plan import build_plan
    from growtool.nn.families import ARCHS

    from helpers import make_config, random_tensors

    if family not in ARCHS:
        pytest.skip(f"no {family}")
    cfg = make_config(family, width=32, heads=4, kv_heads=2 if ARCHS[family].features.gqa else None, ffn=72)
    src = random_tensors(cfg, seed=3)
    for dt in (torch.bfloat16, torch.float16):
        low = {n: v.to(dt) for n, v in src.items()}
        up = {n: v.float() for n, v in low.items()}
        p32 = build_plan(cfg, recipes.load(recipe), 48, seed=1, dtype=torch.float32)
        plow = build_plan(cfg, recipes.load(recipe), 48, seed=1, dtype=dt)
        work = Workspace()
        work.POOL_MIN = 0  # every output from reused blocks, as in a streamed write
        for n, _, _ in plow.outputs():
            want = grow_tensor(n, p32, up.__getitem__).to(dt)
            for w in (None, work):
                got = grow_tensor(n, plow, low.__getitem__, w)
                assert got.dtype == dt and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), n
            work.recycle(got)  # written: its block is reused for the next tensors
        assert all(torch.equal(low[n], src[n].to(dt)) for n in src)  # sources untouched
    work, held = Workspace(), []
    work.POOL_MIN = 0
    for n, _, _ in p32.outputs():  # float32 outputs are the built tensors themselves, from reused blocks
        got = grow_tensor(n, p32, up.__getitem__, work)
        assert torch.equal(got, grow_tensor(n, p32, up.__getitem__)), n
        held.append(got)
        if len(held) == 2:  # two outputs alive at a time, as write_stream holds them
            work.recycle(held.pop(0))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma", "qwen3", "olmo2"])
def test_row_blocks_and_reused_memory_give_the_whole_tensor_bytes(family, tmp_path, monkeypatch):
    """Large tensors with the residual axis last (embedding, head, readers after their unit growth)
    are grown by blocks of rows (engine._row_blocks), split among threads, with each tensor's
    source read into reused memory (Workspace.source): the bytes equal the whole-tensor path's,
    for each recipe and output dtype. ROW_BLOCK and BLOCKED_FROM are made tiny so that these small tensors take
    that path (1-row blocks, and blocks of several rows with a remainder). The same for pieces
    (engine.pieces: the embedding and the head grown a few rows at a time from those rows of the
    source, one block of rows first); other tensors have no pieces."""
    import functools

    from growtool.grow.engine import Workspace, grow_tensor
    from growtool.grow.plan import build_plan
    from growtool.grow.steps import ExpandUnits
    from growtool.nn.families import ARCHS

    from helpers import make_config, write_ckpt

    if family not in ARCHS:
        pytest.skip(f"no {family}")
    kv = 2 if ARCHS[family].features.gqa else None
    cfg = make_config(family, width=32, heads=4, kv_heads=kv, ffn=72, vocab=80)
    ck = checkpoint.load(write_ckpt(tmp_path / "a.safetensors", cfg))
    blocked = pieced = gathered = 0
    for recipe, sets in (("srio", {}), ("copy", {}), ("srio", {"noise": 0.1})):
        for dt in (torch.float32, torch.bfloat16):
            plan = build_plan(cfg, recipes.load(recipe, sets), 48, seed=1, dtype=dt, allow_lossy=True)
            monkeypatch.setattr(engine, "BLOCKED_FROM", 1 << 40)  # every tensor whole
            want = {n: grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()}
            for row_block in (40, 150):  # 48 grown columns: blocks of 1 row, then of 3 rows
                monkeypatch.setattr(engine, "ROW_BLOCK", row_block)
                monkeypatch.setattr(engine, "BLOCKED_FROM", 4 * row_block)
                work = Workspace(threads=3)
                work.POOL_MIN = 0  # every output and source read from reused blocks
                read = functools.partial(ck.get, into=work.source)
                for n, shape, _ in plan.outputs():
                    got = grow_tensor(n, plan, ck.get, work, read)
                    assert got.dtype == dt and got.shape == want[n].shape, n
                    assert torch.equal(got.reshape(-1).view(torch.uint8), want[n].reshape(-1).view(torch.uint8)), n
                    work.recycle(got)
                    whole = engine._whole_steps(plan, n, shape)
                    blocked += whole < len(plan.steps[n])
                    gathered += whole == 0 and any(isinstance(s, ExpandUnits) for s in plan.steps[n])
                monkeypatch.setattr(engine, "PIECE", 3 * row_block)  # pieces of a few rows (engine.pieces)
                for n, shape, _ in plan.outputs():
                    parts = [grow_tensor(n, plan, ck.get, work, read, rows) for rows in engine.pieces(plan, n) or []]
                    if parts:  # one block first (the disk starts sooner), then PIECE rows
                        assert [k for _, k in engine.pieces(plan, n)[:2]] == [
                            max(1, row_block // 48),
                            3 * row_block // 48,
                        ], n
                        got = torch.cat(parts)
                        assert torch.equal(got.view(torch.uint8), want[n].view(torch.uint8)), n
                        pieced += 1
                    elif len(shape) == 2:
                        with pytest.raises(ValueError, match="pieces"):
                            grow_tensor(n, plan, ck.get, rows=(0, 1))
    assert blocked >= 2 * 6  # at least the embedding and the head, in every case
    # readers [out, in] grown from copied rows (FFN "tile" in srio, every reader in copy), gathered
    # block by block: 2+ readers x 2 layers x 2 dtypes x 2 row blocks x 2 recipes; GPT-2's are [in, out]
    assert gathered >= 32 if family != "gpt2" else gathered == 0, gathered
    assert pieced >= 2 * 6 * 2  # the embedding and the head (or the tied embedding) come in pieces


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3", "gpt_neox"])
def test_pad_rotate_gives_the_bytes_of_its_parts(family, monkeypatch):
    """growth.PadRotate (padding the new dims with zeros, [ZeroOldWrites,] and the rotation in one
    step that never touches the zeros, rounded straight into the output) gives the bytes of its
    parts run one after another and rounded: every output tensor, in float32, bfloat16 and
    float16, whole and by blocks of rows, with and without a workspace, at 1.5x width and at 2.5x
    (more new dims than old: tiled units repeat the old ones). Fused qkv / gate_up tensors (phi3,
    gpt_neox) hold several unit kinds; GPT-2 rotates only its writers ([in, out] layout)."""
    import copy

    from growtool.grow.engine import Workspace, grow_tensor
    from growtool.grow.plan import build_plan
    from growtool.grow.steps import PadRotate
    from growtool.nn.families import ARCHS

    from helpers import make_config, random_tensors

    if family not in ARCHS:
        pytest.skip(f"no {family}")
    kv = 2 if ARCHS[family].features.gqa else None
    cfg = make_config(family, width=32, heads=4, kv_heads=kv, ffn=72, vocab=80)
    src = random_tensors(cfg, seed=5)
    for width in (48, 80):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            low = {n: v.to(dt) for n, v in src.items()}
            plan = build_plan(cfg, recipes.load("srio"), width, seed=1, dtype=dt)
            parts = copy.copy(plan)
            parts.steps = {
                n: [p for s in steps for p in (s.parts if isinstance(s, PadRotate) else [s])]
                for n, steps in plan.steps.items()
            }
            fused = [n for n, steps in plan.steps.items() if isinstance(steps[-1], PadRotate)]
            assert len(fused) >= 2 * cfg.layers, fused  # at least the FFN's reader(s) and writer in each block
            for row_block in (None, 250):
                # blocks of 5 rows at width 48, 3 at 80 (the last block short; 16+ blocks, shared by
                # the threads) for the tensors of 1,000 grown elements or more
                if row_block:
                    monkeypatch.setattr(engine, "ROW_BLOCK", row_block)
                    monkeypatch.setattr(engine, "BLOCKED_FROM", 4 * row_block)
                work = Workspace(threads=2)
                work.POOL_MIN = 0
                for n, _, _ in plan.outputs():
                    want = grow_tensor(n, parts, low.__getitem__)
                    for w in (None, work):
                        got = grow_tensor(n, plan, low.__getitem__, w)
                        assert got.dtype == dt and got.shape == want.shape, n
                        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), n
                    work.recycle(got)
            assert all(torch.equal(low[n], src[n].to(dt)) for n in src)  # sources untouched


def test_fold_in_reused_memory_gives_the_same_bytes(tmp_path, monkeypatch):
    """fold makes each output in the workspace's pooled blocks (growth.fold_tensor with a Workspace):
    a source of the output's element size is read straight into its output block (as it is, or
    scaled / converted there), any other into the source block. The bytes equal fold_tensor's
    without a workspace, for float32 and bfloat16 grown models folded at alpha 0.5 (gated writers
    scaled) into float32, bfloat16 and float16, also from a checkpoint held in memory (whose
    tensors are left unchanged); and the command reads every tensor into workspace memory."""
    from growtool.grow.engine import Workspace
    from growtool.grow.fold import fold_config, fold_tensor

    from helpers import make_config, write_ckpt

    src = write_ckpt(tmp_path / "a.safetensors", make_config(width=32, heads=4, ffn=72, vocab=80))
    grown = {}
    for dt in ("float32", "bfloat16"):
        grown[dt] = tmp_path / f"g-{dt}.safetensors"
        assert cli("expand", src, "--width", 48, "--dtype", dt, "-q", "-o", grown[dt]).exit_code == 0
    scaled = 0
    for path in grown.values():
        ck = checkpoint.load(path)
        names = list(expected_shapes(fold_config(ck.config)))
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            work = Workspace()
            work.POOL_MIN = 0  # every source and output in reused blocks
            for n in names:
                want = fold_tensor(n, ck.config, 0.5, ck.get, dt)
                got = fold_tensor(n, ck.config, 0.5, ck.get, dt, work)
                assert got.dtype == dt and torch.equal(
                    got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
                )
                scaled += not torch.equal(want.float(), ck.get(n).to(dt).float())
                work.recycle(got)
    assert scaled >= 2 * 3 * 2 * 2  # o_proj and down_proj of both layers, for each source and dtype
    # a checkpoint held in memory (standard input, nanoGPT) hands out its own tensors: never changed
    held = ck.tensors()  # the bfloat16 model
    before = {n: t.clone() for n, t in held.items()}
    mem = checkpoint.Checkpoint(ck.config, [], "held", ck.entries, held.__getitem__)
    for n in names:
        got = fold_tensor(n, ck.config, 0.5, mem.get, torch.float16, Workspace())
        assert torch.equal(got, fold_tensor(n, ck.config, 0.5, ck.get, torch.float16)), n
    assert all(torch.equal(held[n], before[n]) for n in held)

    reads = []
    real_read = checkpoint.read_tensor

    def read(*a, **kw):
        reads.append(kw.get("into", a[4] if len(a) > 4 else None))
        return real_read(*a, **kw)

    monkeypatch.setattr(checkpoint, "read_tensor", read)
    out = tmp_path / "f.safetensors"
    assert cli("fold", grown["float32"], "--alpha", 0.5, "--dtype", "bfloat16", "-q", "-o", out).exit_code == 0
    assert len(reads) >= len(names) and all(into is not None for into in reads)
    ck, folded = checkpoint.load(grown["float32"]), checkpoint.load(out)
    for n in names:
        assert torch.equal(folded.get(n), fold_tensor(n, ck.config, 0.5, ck.get, torch.bfloat16)), n


def _vm_flags(address: int) -> list[str] | None:
    """The VmFlags of this process's mapping holding ``address`` (/proc/self/smaps)."""
    mapping = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
                lo, hi = (int(x, 16) for x in head.split("-"))
                mapping = lo <= address < hi
            elif mapping and head == "VmFlags:":
                return line.split()[1:]
    return None


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"), reason="no transparent huge pages"
)
def test_workspace_memory_is_advised_as_huge_pages():
    """Every block the workspace makes (float32 blocks, source blocks, pooled outputs) is asked for
    2 MB pages (growth.fresh: madvise MADV_HUGEPAGE, the "hg" flag of its mapping), since a fresh 4 KB
    page costs a fault on first touch. The advice changes no byte (the tests above grow from these
    blocks); here the flag itself is checked, and that a block handed back is reused."""
    from growtool.grow.engine import HUGE, Workspace

    work = Workspace()
    made = [
        work.tensor((1024, 2048)),  # 8 MB float32
        work.source(6 << 20),
        work.output((2048, 2048), torch.bfloat16),
    ]
    for t in made:
        inner = -(-t.data_ptr() // HUGE) * HUGE  # the first 2 MB boundary inside it
        assert inner + HUGE <= t.data_ptr() + t.untyped_storage().nbytes()
        flags = _vm_flags(inner)
        assert flags is not None and "hg" in flags, flags
    work.recycle(made[2])  # written: the next output of that size is made in the same block
    again = work.output((2048, 2048), torch.bfloat16)
    assert again.untyped_storage().data_ptr() == made[2].untyped_storage().data_ptr()


def test_the_tensor_tables_are_kept_per_config_and_never_go_stale():
    """``tensor_specs`` and ``expected_shapes`` are memoised (a surgery asks once per tensor): a config
    changed in place gets its own table, a table a caller changes does not change the next one, and the
    memo gives what a fresh computation gives."""
    from growtool.nn import families

    cfg = make_config(width=32, layers=2)
    first = families.expected_shapes(cfg)
    first["model.embed_tokens.weight"] = (0, 0)  # a caller's change stays in its copy
    assert families.expected_shapes(cfg)["model.embed_tokens.weight"] == (cfg.vocab_size, 32)
    cfg.layers, cfg.width = 3, 48  # changed in place: a new key
    shapes, specs = families.expected_shapes(cfg), families.tensor_specs(cfg)
    assert shapes == families.expected_shapes.__wrapped__(cfg)
    assert specs == families.tensor_specs.__wrapped__(cfg)
    assert "model.layers.2.mlp.down_proj.weight" in specs and shapes["model.embed_tokens.weight"][1] == 48
