"""Depth growth as a plan: which block of the source each block of the grown model comes from.

``DepthPlan.layout[j] = Layer(src, kind)`` for every block j of the grown model:

  old       the source's block ``src``, unchanged (renumbered)
  copy      a copy of block ``src`` (stack, interleave, middle), behind the block's warm-up gate
  identity  block ``src``'s readers and norms with zero writers (LLaMA Pro), behind the gate too

The identity kept: a new block's residual writes (attention and MLP outputs, after a post-norm
where the architecture has one) are multiplied by its gate (``ModelConfig.new_layers``, read by
``nn/model.py``), so with the gate at 0 it adds nothing to the residual stream, whatever its weights:
the grown model computes the source's function on every input, for every architecture (pre-norm,
post-norm, sandwich and parallel layouts alike). An identity block is exact even with the gate
open: its writers (weights and biases) are zero, so it writes 0 (a post-norm of 0 is 0).

Methods (new blocks ``n = L2 - L``):
  stack       the sequence repeated and cropped: l1..lL l1..  (G_stack)
  interleave  block i followed by c_i copies, c_i = floor((i+1) n / L) - floor(i n / L) (interposition)
  middle      the k = min(n, L) middle blocks [a, a+k), a = (L - k + 1) // 2, followed by their
              copies cycled to n (MIDAS)
  identity    placed as interleave; readers from the block before, writers zero (LLaMA Pro)
``--insert-at P[:S],...`` places new blocks explicitly: P source blocks before it (0..L), copying
block S (default: the block before it, block 0 for P = 0); the method then only says copy or identity.

Per-layer structure follows the source block: ``layer_types`` (sliding / full attention, and with
it the RoPE base per layer type), SmolLM3's RoPE / no-RoPE list (``rope_layers``), an MoE family's
dense / MoE blocks (``moe_layers``, Llama 4's too: a layout its config's spelling cannot say is refused)
and every list in the config with one entry per layer. Everything of a block goes with its copy (an MoE block's router,
experts and shared expert too); what is global (OPT's learned positions) stays as it is.

Width and depth compose in one plan: the width plan grows every source block (tensor names in the
source's numbering), then the depth layout renames them (``grow_tensor``). The AdamW moments follow
the same map (``depth_state``): copies take their source block's (grown) moments, identity blocks
start at zero. This module imports nothing else of ``grow/`` (the fold hook calls it).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from growtool.grow import engine
from growtool.nn.config import PER_BLOCK, ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import arch_of, expected_shapes, tensor_specs
from growtool.nn.moe_layers import to_hf as moe_layers_to_hf

METHODS = ("stack", "interleave", "middle", "identity")
INDEX_RULES = ("sliding_window_pattern", "_sliding_window_pattern")  # per-layer types given only by a rule


@dataclass(frozen=True)
class Layer:
    src: int  # the source block it comes from
    kind: str  # "old" | "copy" | "identity"


@dataclass(frozen=True)
class DepthPlan:
    method: str
    src_layers: int
    layout: tuple[Layer, ...]
    inserts: tuple[tuple[int, int], ...]  # (position P, source S) of every new block, in order

    @property
    def layers(self) -> int:
        return len(self.layout)

    @property
    def new(self) -> list[int]:
        return [j for j, lay in enumerate(self.layout) if lay.kind != "old"]

    def rows(self) -> list[tuple[str, str, str]]:
        """(block, from, what) for every block of the grown model: the printed depth table."""
        what = {
            "old": "source block",
            "copy": "copy, gated (gate 0: adds nothing)",
            "identity": "identity: readers copied, writers 0, gated",
        }
        return [(str(j), str(lay.src), what[lay.kind]) for j, lay in enumerate(self.layout)]

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "layers_from": self.src_layers,
            "layers_to": self.layers,
            "blocks": [{"block": j, "from": lay.src, "kind": lay.kind} for j, lay in enumerate(self.layout)],
        }


def parse_insert_at(text: str | None) -> list[tuple[int, int | None]] | None:
    """``"2,2:0,4"`` -> [(2, None), (2, 0), (4, None)]; one clear line for bad input."""
    if text is None:
        return None
    out = []
    for item in str(text).split(","):
        p, sep, s = item.strip().partition(":")
        try:
            out.append((int(p), int(s) if sep else None))
        except ValueError:
            raise GrowError(f"--insert-at {text!r}: expected P[:S],... (integers), e.g. 1,2:0") from None
    return out


def method_inserts(method: str, L: int, n: int) -> list[tuple[int, int]]:
    """(position, source block) of the ``n`` new blocks a method adds to ``L`` blocks (module docstring)."""
    if method == "stack":
        return [(L, k % L) for k in range(n)]
    if method in ("interleave", "identity"):
        return [(i + 1, i) for i in range(L) for _ in range((i + 1) * n // L - i * n // L)]
    if method == "middle":
        k = min(n, L)
        a = (L - k + 1) // 2
        return [(a + k, a + t % k) for t in range(n)]
    raise GrowError(f"unknown depth method {method!r} (known: {', '.join(METHODS)})")


# Families whose depth growth is proven against transformers (tests/test_depth.py): every one in
# nn/families.py. A family added later is refused with one line until its depth cases are written.
# fmt: off
DEPTH_FAMILIES = frozenset([
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox", "starcoder2", "gemma", "gemma2",
    "gemma3_text", "olmo2", "opt", "olmo", "gpt_bigcode", "granite", "phi", "gptj", "cohere", "falcon",
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "smollm3", "bloom",
    "internlm3", "exaone", "seed_oss", "ministral", "helium", "ernie4_5", "olmo3", "exaone4", "cohere2",
    "vaultgemma", "stablelm", "arcee", "nemotron", "hunyuan_v1_dense", "glm",
    "glm4", "ministral3", "apertus", "phimoe",
    "granitemoe", "granitemoeshared", "dbrx",
    "gpt_oss",
    "llama4_text",
    "glm4_moe", "dots1", "minimax_m2", "ernie4_5_moe", "exaone_moe", "hunyuan_v1_moe",
    "deepseek_v2", "deepseek_v3",
    "nemotron_h", "mamba2", "granitemoehybrid", "mamba", "falcon_h1",
    "lfm2", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
])
# fmt: on


def build_depth_plan(
    src: ModelConfig, layers: int | None, method: str = "stack", insert_at: str | list | None = None
) -> DepthPlan:
    """The depth plan from ``src.layers`` to ``layers`` blocks (or as many as ``insert_at`` places)."""
    L = src.layers
    if method not in METHODS:
        raise GrowError(f"unknown depth method {method!r} (known: {', '.join(METHODS)})")
    if src.family not in DEPTH_FAMILIES:
        raise GrowError(
            f"depth growth of {src.family} is not supported yet (proven for: {', '.join(sorted(DEPTH_FAMILIES))}); "
            "grow its width only"
        )
    explicit = parse_insert_at(insert_at) if isinstance(insert_at, (str, type(None))) else list(insert_at)
    if layers is None:
        if explicit is None:
            raise GrowError("depth growth needs --layers or --insert-at")
        layers = L + len(explicit)
    if not isinstance(layers, int) or layers < L:
        raise GrowError(f"target layers {layers} is below the source's {L}")
    n = layers - L
    if n == 0:
        raise GrowError(f"target layers {layers} is the source's own depth: nothing to grow (drop --layers)")
    if explicit is not None:
        if len(explicit) != n:
            raise GrowError(f"--insert-at places {len(explicit)} blocks, but --layers {layers} adds {n} to {L}")
        inserts = []
        for p, s in explicit:
            if not 0 <= p <= L:
                raise GrowError(f"--insert-at position {p} is out of range (0..{L}: source blocks before it)")
            s = max(p - 1, 0) if s is None else s
            if not 0 <= s < L:
                raise GrowError(f"--insert-at source block {s} is out of range (0..{L - 1})")
            inserts.append((p, s))
    else:
        inserts = method_inserts(method, L, n)
    if n and src.layer_types is None and src.sliding_window and any(k in src.extra for k in INDEX_RULES):
        rule = next(k for k in INDEX_RULES if k in src.extra)
        raise GrowError(
            f"depth method {method!r} cannot keep {src.family}'s per-layer structure: the config gives its "
            f"sliding layers only by the index rule {rule}={src.extra[rule]!r} (no layer_types), which would "
            "give the new blocks types of their own; write layer_types into the config first"
        )
    kind = "identity" if method == "identity" else "copy"
    layout = []
    for p in range(L + 1):
        layout += [Layer(s, kind) for q, s in inserts if q == p]
        if p < L:
            layout.append(Layer(p, "old"))
    if src.moe_layers is not None:  # the config's spelling must say which new blocks are dense (or refuse)
        try:
            moe_layers_to_hf(arch_of(src).features.moe_layers[0], [src.moe_layers[x.src] for x in layout], {})
        except GrowError as e:
            raise GrowError(f"depth method {method!r} on {src.family}: {e}") from None
    return DepthPlan(method, L, tuple(layout), tuple(inserts))


def depth_config(cfg: ModelConfig, dp: DepthPlan) -> ModelConfig:
    """``cfg`` (the source, or its width-grown config) with ``dp``'s blocks: per-layer lists follow
    each block's source, the new blocks are marked gated (``new_layers``), as are blocks whose
    source was itself a gated new block."""
    order = [lay.src for lay in dp.layout]
    L = cfg.layers
    extra = dict(cfg.extra)
    for k, v in cfg.extra.items():  # anything the config lists per layer (layer_types, no-RoPE layers, ...)
        if isinstance(v, list) and len(v) == L and "layer" in k:
            extra[k] = [v[s] for s in order]
    lists = {k: [getattr(cfg, k)[s] for s in order] for k in PER_BLOCK if getattr(cfg, k) is not None}
    types = lists.get("layer_types")
    if types and "max_window_layers" in extra:  # Qwen2: full layers first; layer_types is what loads
        full = next((j for j, t in enumerate(types) if t != "full_attention"), len(types))
        if all(t == "sliding_attention" for t in types[full:]):
            extra["max_window_layers"] = full
    new = [j for j, lay in enumerate(dp.layout) if lay.kind != "old" or cfg.new_block(lay.src)]
    return cfg.replace(layers=dp.layers, **lists, new_layers=new or None, extra=extra)


# ---- tensors ------------------------------------------------------------------------------------


@dataclass
class Grown:
    """Width and depth growth as one plan for ``expand``: the width plan (or None) and the depth
    plan, with what the CLI prints and the function that makes each output tensor."""

    src: ModelConfig
    cfg: ModelConfig
    depth: DepthPlan
    width: object | None  # plan.Plan, or None for depth alone
    dtype: torch.dtype
    recipe: dict
    seed: int
    specs: dict = field(default_factory=dict)  # output name -> (spec, block or None)

    @property
    def eps(self) -> float:
        return self.width.eps if self.width else 1.0

    @property
    def residual_map(self) -> str:
        return self.width.residual_map if self.width else "none (the width is kept)"

    @property
    def lossy(self) -> list[str]:
        return list(self.width.lossy) if self.width else []

    @property
    def warnings(self) -> list[str]:
        return list(self.width.warnings) if self.width else []

    @property
    def exact(self) -> bool:
        return not self.lossy

    def rows(self):
        return self.width.rows() if self.width else []

    @property
    def carried(self) -> list[str]:
        """Settings that pass through growth unchanged, said in the plan (RoPE scaling)."""
        from growtool.nn.rope import describe

        return describe(self.cfg) if arch_of(self.cfg).features.positions == "rope" else []

    def outputs(self) -> list[tuple[str, tuple, torch.dtype]]:
        return [(n, shp, self.dtype) for n, shp in expected_shapes(self.cfg).items()]

    def pieces(self, name: str):
        spec, j = self.specs[name]
        return engine.pieces(self.width, name) if (self.width and j is None) else None

    def producers(self, threads: int, resident: int) -> int:
        return engine.producers(self.width, threads, resident) if self.width else max(1, threads)

    def source_name(self, name: str) -> str | None:
        """The (width-grown) source tensor an output is made from; None for gates and zero writers."""
        spec, j = self.specs[name]
        if j is None:
            return name
        lay = self.depth.layout[j]
        if spec.role == "growth_gate" or (lay.kind == "identity" and spec.role in ("writer", "writer_bias")):
            return None
        return spec.pattern.format(i=lay.src)

    def grow_tensor(self, name: str, get, rows=None) -> torch.Tensor:
        """Output tensor ``name``. ``get(source_name, rows=None)`` gives a width-grown source tensor
        (in ``dtype``). New blocks' gates are 0; identity blocks' writers 0; with the recipe's
        ``noise`` sigma, the readers of new blocks get N(0, (sigma x rms)^2): hidden by the gate (an
        identity block writes 0 whatever its readers compute), so still exact."""
        spec, j = self.specs[name]
        src = self.source_name(name)
        shape = expected_shapes(self.cfg)[name]
        if src is None:
            return torch.zeros(shape, dtype=self.dtype)
        t = get(src) if rows is None else get(src, rows=rows)
        sigma = self.recipe.get("noise") or 0.0
        if j is not None and self.depth.layout[j].kind != "old" and sigma and spec.role == "reader":
            f = t.float()
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
            f = f + torch.randn(f.shape, generator=gen) * (sigma * float(f.pow(2).mean().sqrt()))
            t = f.to(self.dtype)
        return t if t.dtype == self.dtype else t.to(self.dtype)


def build(
    src: ModelConfig,
    width_plan,
    depth: tuple,
    recipe: dict,
    seed: int,
    dtype: torch.dtype,
    gate_values: list[float] | None = None,
) -> Grown:
    """Width (``width_plan``, or None) and depth growth of ``src`` as one ``Grown`` plan; ``depth``:
    (layers, method, insert_at) (``surgery.depth_args``)."""
    layers, method, insert_at = depth
    if recipe.get("add_biases", "none") != "none":
        raise GrowError("recipe add_biases applies to a width growth alone: grow the width, then the depth")
    if src.gated and gate_values and any(v != 0.0 for v in gate_values):
        raise GrowError(
            f"the source's growth gates are open (values up to {max(gate_values):g}): "
            "fold it first (growtool fold --alpha ...)"
        )
    if layers is not None:
        from growtool.grow import limits

        limits.check_depth(src, layers, dtype.itemsize)  # absurd depths: one line, before the plan
    dp = build_depth_plan(src, layers, method, insert_at)
    base = width_plan.cfg if width_plan is not None else src
    cfg = depth_config(base, dp)
    g = Grown(src, cfg, dp, width_plan, dtype, recipe, seed)
    for name, spec in tensor_specs(cfg).items():
        j = None
        if "{i}" in spec.pattern:
            j = int(name[len(spec.pattern.split("{i}")[0]) :].split(".")[0])
        g.specs[name] = (spec, j)
    return g


def lineage_entry(g: Grown, source_sha256: str, width_entry: dict | None = None) -> dict:
    """One lineage entry for the whole growth: the width plan's entry (``width_entry``, made by the
    caller from ``g.width``) or a width-kept one, with the depth layout added."""
    from growtool import __version__

    entry = (
        dict(width_entry)
        if width_entry is not None
        else {
            "op": "expand",
            "source_sha256": source_sha256,
            "width_from": g.src.width,
            "width_to": g.src.width,
            "recipe": g.recipe["name"],
            "seed": g.seed,
            "exact": True,
            "growtool": __version__,
        }
    )
    entry.update(
        layers_from=g.src.layers,
        layers_to=g.cfg.layers,
        depth_method=g.depth.method,
        depth_layout=[[lay.src, lay.kind] for lay in g.depth.layout],
    )
    return entry


# ---- fold ---------------------------------------------------------------------------------------


def fold_new_block_tensor(name: str, cfg: ModelConfig, alpha: float, get, dtype: torch.dtype, fold_width):
    """A tensor of a new block with gate ``alpha`` baked in, or None where nothing changes.

    A new block writes gate * y into the residual; with the gate fixed at alpha that is the block
    with alpha * y. Where y is a linear writer's output (pre-norm, parallel), its weights and bias
    take the factor; where y is a post-norm's output, the norm's gain does (stored w -> alpha
    (offset + w) - offset). At alpha 0 the writers are zero instead (a post-norm of 0 is 0): the
    folded block is an identity block of the stock class. ``fold_width`` folds the width gates."""
    spec = tensor_specs(cfg)[name]
    j = int(name[len(spec.pattern.split("{i}")[0]) :].split(".")[0]) if "{i}" in spec.pattern else None
    if j is None or not cfg.new_block(j) or alpha == 1.0:
        return None
    f = arch_of(cfg).features
    if spec.role in ("writer", "writer_bias"):
        if alpha == 0.0:
            return torch.zeros(expected_shapes(cfg)[name], dtype=dtype)
        if not f.post_norms:
            return (fold_width(name, torch.float32) * alpha).to(dtype)
        return None
    a = arch_of(cfg)
    post = [a.block + a.modules[k] + ".weight" for k in ("post_attn", "post_ffn")] if f.post_norms else []
    if spec.pattern in post and alpha != 0.0:
        w = get(name).float()
        return ((w + f.norm_offset) * alpha - f.norm_offset).to(dtype)
    return None


def describe(dp: DepthPlan) -> str:
    """One line: the method and where the new blocks come from."""
    new = [f"{j}<-{dp.layout[j].src}" for j in dp.new]
    return f"depth {dp.src_layers} -> {dp.layers} by {dp.method}: " + (", ".join(new) if new else "no new blocks")


__all__ = [
    "METHODS",
    "Layer",
    "DepthPlan",
    "Grown",
    "build",
    "build_depth_plan",
    "depth_config",
    "lineage_entry",
    "fold_new_block_tensor",
    "method_inserts",
    "parse_insert_at",
]
