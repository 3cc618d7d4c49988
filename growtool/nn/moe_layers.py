"""Which blocks of an MoE family are MoE and which dense, in each spelling configs use (``Features.moe_layers``:
the config key that says it). Per block 1 (MoE) or 0 (a dense GLU MLP of ``dense_ffn`` neurons):

* ``first_k_dense_replace`` k: the first k blocks dense, every later one MoE (DeepSeek-V2/V3, GLM-4-MoE, dots1);
* ``mlp_layer_types``: one entry per block, "dense" or "sparse" (EXAONE-MoE);
* ``moe_layers``: the MoE blocks' indices; without it every ``interleave_moe_layer_step``-th block (Llama 4);
* ``moe_layer_start_index`` s, ``moe_layer_end_index`` e (-1: the last block), ``moe_layer_interval`` n: block i
  is MoE when s <= i <= e and (i + 1) % n == 0 (Ernie 4.5-MoE).

``to_hf`` puts a list back in the family's spelling; a list the spelling cannot say (a dense block after an MoE
block under ``first_k_dense_replace``) is refused with one line. Imports nothing else from growtool but
``errors``: copied into remote-code folders with ``config.py``.
"""

from __future__ import annotations

from .errors import GrowError


def from_hf(rule: tuple, hf: dict, layers: int) -> list[int] | None:
    """The per-block MoE list a config gives by the rule's key (its default where the config lacks it);
    None for a family whose blocks are all MoE (rule ())."""
    if not rule:
        return None
    key, default = rule
    val = hf.get(key, default)
    if key == "first_k_dense_replace":
        k = int(val or 0)
        return [int(i >= k) for i in range(layers)]
    if key == "mlp_layer_types":
        if val is None:  # transformers derives it from first_k_dense_replace
            return from_hf(("first_k_dense_replace", 1), hf, layers)
        bad = [t for t in val if t not in ("dense", "sparse")]
        if bad:
            raise GrowError(f"mlp_layer_types entry {bad[0]!r} is neither 'dense' nor 'sparse'")
        return [int(t == "sparse") for t in val]
    if key == "moe_layers":
        if val is None:
            step = hf.get("interleave_moe_layer_step") or 1
            if not isinstance(step, int) or step < 1:
                raise GrowError(f"interleave_moe_layer_step must be a positive integer, got {step!r}")
            val = list(range(step - 1, layers, step))
        if not isinstance(val, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in val):
            raise GrowError(f"moe_layers {val!r}: block indices below {layers}")
        return [int(i in val) for i in range(layers)]
    if key == "moe_layer_start_index":
        s, e, n = _ints(hf, default)
        e = layers - 1 if e == -1 else e
        return [int(s <= i <= e and (i + 1) % n == 0) for i in range(layers)]
    raise GrowError(f"unknown MoE-layer rule {key!r}")  # pragma: no cover - the family tables name known keys


def _ints(hf: dict, default) -> tuple[int, int, int]:
    vals = (hf.get("moe_layer_start_index", default), hf.get("moe_layer_end_index", -1))
    vals += (hf.get("moe_layer_interval", 1),)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals) or vals[2] < 1:
        raise GrowError(f"moe_layer_start_index / end_index / interval must be integers (interval >= 1), got {vals}")
    return vals


def to_hf(key: str, kinds: list[int], hf: dict) -> None:
    """Write ``kinds`` into ``hf`` in the spelling of ``key``; GrowError where it cannot say them."""
    L = len(kinds)
    if key == "mlp_layer_types":
        hf["mlp_layer_types"] = ["sparse" if k else "dense" for k in kinds]  # read before first_k_dense_replace
        return
    if key == "moe_layers":
        hf["moe_layers"] = [i for i, v in enumerate(kinds) if v]
        return
    if key == "first_k_dense_replace":
        k = next((i for i, v in enumerate(kinds) if v), L)
        if any(not v for v in kinds[k:]):
            raise GrowError(
                "this family says which blocks are dense only by first_k_dense_replace (dense blocks first): "
                f"the layout {''.join('M' if v else 'D' for v in kinds)} (D dense, M MoE) puts a dense block after "
                "an MoE block; use --depth-method interleave, or --insert-at"
            )
        hf[key] = k
        return
    for n in range(1, L + 1):  # moe_layer_start_index / end_index / interval
        ends = [i for i, v in enumerate(kinds) if v]
        s, e = (ends[0], ends[-1]) if ends else (L, L - 1)
        if [int(s <= i <= e and (i + 1) % n == 0) for i in range(L)] == kinds:
            hf.update(moe_layer_start_index=s, moe_layer_end_index=e, moe_layer_interval=n)
            return
    raise GrowError(
        "Ernie 4.5-MoE says which blocks are MoE by a start, an end and an interval: the layout "
        f"{''.join('M' if v else 'D' for v in kinds)} (D dense, M MoE) has no such rule; use another --depth-method"
    )
