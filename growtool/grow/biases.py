"""Recipe ``add_biases``: zero biases added at a width growth to linear layers that have none.

A zero bias adds nothing (W x + 0 = W x), so the grown model computes the source's function. The
config says so (Llama's ``attention_bias`` for q, k, v and o, its ``mlp_bias``), and a folder written
with it loads in transformers. Where a family's config cannot state a bias (fixed off, or no key for
it) or states attention and MLP biases with one key (Falcon's ``bias``, OPT's ``enable_bias``), the
option is refused. Measured on Llama (bench/results/budget_d64/WRITEUP.md): the attention's
biases lower the final loss of a width growth; the MLP's do not.
"""

from __future__ import annotations

from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.nn.families import arch_of, expected_shapes, tensor_specs

# add_biases -> the config's bias flags it sets (a Llama's q/k/v and o share HF's attention_bias)
FLAGS = {
    "none": (),
    "attention": ("qkv_bias", "o_bias"),
    "mlp": ("mlp_bias",),
    "all": ("qkv_bias", "o_bias", "mlp_bias"),
}
SAID = {"qkv_bias": "q/k/v biases", "o_bias": "output-projection biases", "mlp_bias": "MLP biases"}
ROLES = ("unit_bias", "writer_bias", "latent_bias")  # a latent_bias: MLA's kv_a_proj_with_mqa


def with_biases(src: ModelConfig, cfg: ModelConfig, option: str) -> ModelConfig:
    """``cfg`` with the bias flags of ``option`` set; refused where ``src``'s family cannot say them."""
    flags, a = FLAGS[option], arch_of(src)
    for f in flags:
        if not a.fixed.get(f, f in a.keys):
            raise GrowError(f"recipe add_biases={option}: {src.family}'s config cannot state {SAID[f]}")
        one_key = [g for g in SAID if g not in flags and g in a.keys and a.keys[g] == a.keys.get(f)]
        tied = [g for g in one_key if not getattr(cfg, g)]
        if tied:  # the file could not say one without the other
            raise GrowError(
                f"recipe add_biases={option}: {src.family}'s config states {SAID[f]} and {SAID[tied[0]]} "
                f"as one key ({a.keys[f]}): use add_biases=all"
            )
    try:
        return cfg.replace(**{f: True for f in flags}) if flags else cfg
    except GrowError as e:  # a combination the model does not build (DeepSeek-V2's MLP biases with MoE)
        raise GrowError(f"recipe add_biases={option}: {e}") from None


def added(src: ModelConfig, cfg: ModelConfig, option: str) -> set[str]:
    """The tensors of the grown ``cfg`` that ``option`` adds (``src`` has none of them): zero biases."""
    if option == "none":
        return set()
    specs, old = tensor_specs(cfg), expected_shapes(src)
    new = {n for n, spec in specs.items() if n not in old and spec.role != "growth_gate"}
    odd = sorted(n for n in new if specs[n].role not in ROLES)
    if odd:
        raise GrowError(f"recipe add_biases: {src.family} would add {odd[0]}, which is not a bias (not supported)")
    return new


def turned_on(src: ModelConfig, cfg: ModelConfig) -> list[str]:
    """The bias flags the growth turned on (off in ``src``, on in ``cfg``): the lineage records them, so
    the source's config can be rebuilt from the grown one (``diagnostics.growth_source``)."""
    return [f for f in SAID if getattr(cfg, f) and not getattr(src, f)]
