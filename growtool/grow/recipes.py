"""Growth recipes: YAML files with a fixed, checked schema, and ``--set key=value`` overrides.

    name: srio
    description: ...
    lossy: false            # a baseline may declare that it does not keep the function
    rotation:
      eps: auto             # auto | number in [0, 1]; cos of the SRIO angle (1 = no rotation)
    attention:
      new_heads: convex     # how new heads are filled: convex | tile | copy | zero
      new_columns: convex   # how readers' new input columns are filled: convex | tile | mean | zero
    ffn:
      new_units: tile       # convex | tile | copy | zero  (tile: the old matrix tiled into the new-new block)
      new_columns: zero     # convex | tile | mean | zero
    convex_k: 2             # old units mixed into each convex new unit
    gate: true              # new units write through the block's warm-up gate
    noise: 0.0              # symmetry breaking that keeps the function: noise (x the tensor's rms) on
                            # gated new units' inputs, +/- pairs on split copies' outputs; 0 = off
    pair_noise: 0.0         # writer-side cancelling pairs on split copies (ungated copy recipes): copy
                            # v/2 + delta, source v/2 - delta, delta ~ pair_noise x rms(v); 0 = off
    split_alpha: 0.5        # the source's share of a split unit's write (LEMON's unequal split when
                            # != 0.5: alpha v and (1 - alpha) v for one copy); in (0, 1)
    add_biases: none        # zero biases added to linear layers that have none: none | attention (q, k,
                            # v and o: HF's attention_bias) | mlp (mlp_bias) | all; where the config can say so

``eps: auto`` is the exact angle: sqrt(d/D) (LayerNorm absorbs exactly that one; RMSNorm any),
except with a tied RMSNorm head, where only the identity (eps = 1) is exact.
"""

from __future__ import annotations

import copy
import os
import reprlib
import stat
from importlib import resources
from pathlib import Path

import yaml

from growtool.grow import biases
from growtool.grow.ops import KINDS
from growtool.nn.errors import GrowError

UNIT_MODES = tuple(k for k, v in KINDS.items() if v.units)
COLUMN_MODES = tuple(k for k, v in KINDS.items() if v.columns)

DEFAULTS = {
    "name": "custom",
    "description": "",
    "lossy": False,
    "rotation": {"eps": "auto"},
    "attention": {"new_heads": "convex", "new_columns": "convex"},
    "ffn": {"new_units": "tile", "new_columns": "zero"},
    "convex_k": 2,
    "gate": True,
    "noise": 0.0,
    "pair_noise": 0.0,
    "split_alpha": 0.5,
    "add_biases": "none",
}


MAX_RECIPE = 1 << 20

# keys added after grown checkpoints were first written: recorded in a lineage only when set, so a
# growth that does not use them writes the same bytes as before they existed (bench/byte_identity.py)
LATER_KEYS = ("pair_noise", "split_alpha", "add_biases")


def stored(r: dict) -> dict:
    """The recipe as a lineage records it: ``LATER_KEYS`` left out where they hold their default."""
    return {k: v for k, v in r.items() if not (k in LATER_KEYS and v == DEFAULTS[k])}


class _Loader(yaml.SafeLoader):
    """safe_load without aliases: a recipe needs none, and a 1 KB file of nested aliases expands to
    billions of values once anything walks it (a YAML alias bomb)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed here", self.peek_event().start_mark
            )
        return super().compose_node(parent, index)


def _load_yaml(text: str):
    return yaml.load(text, Loader=_Loader)


def _read_recipe(p: Path) -> str:
    """A recipe file's text: a regular file (a FIFO would block) of at most MAX_RECIPE bytes, UTF-8."""
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise GrowError(f"{p}: not a regular file (a recipe is a YAML file)")
        if st.st_size > MAX_RECIPE:
            raise GrowError(f"{p}: {st.st_size:,} bytes, too large for a recipe")
        return p.read_bytes()[: MAX_RECIPE + 1].decode()
    except OSError as e:
        raise GrowError(f"{p}: cannot read recipe ({e.strerror})") from None
    except UnicodeDecodeError:
        raise GrowError(f"{p}: not valid YAML (not UTF-8 text)") from None


def _short(val) -> str:
    """A bounded repr for error lines (a value from a file may be huge)."""
    return reprlib.repr(val)


def _recipe_dir() -> Path:
    """recipes/ of the source tree, or the copy an installed wheel carries (growtool_recipes)."""
    here = Path(__file__).resolve().parents[2] / "recipes"
    if here.is_dir():
        return here
    try:
        return Path(str(resources.files("growtool_recipes")))
    except (ModuleNotFoundError, TypeError):
        return here


def shipped() -> list[str]:
    return sorted(p.stem for p in _recipe_dir().glob("*.yaml"))


def _check_keys(d: dict, ref: dict, where: str, src: str) -> None:
    for k, v in d.items():
        if k not in ref:
            raise GrowError(f"{src}: unknown recipe key {where}{_short(k)} (known: {', '.join(ref)})")
        if isinstance(ref[k], dict):
            if not isinstance(v, dict):
                raise GrowError(f"{src}: recipe key {where}{k} must be a mapping, got {_short(v)}")
            _check_keys(v, ref[k], f"{where}{k}.", src)


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validate(r: dict, src: str = "recipe") -> dict:
    """Check every value; the error names the key and the allowed values."""

    def bad(key, val, allowed):
        raise GrowError(f"{src}: recipe key {key} has bad value {_short(val)} (allowed: {allowed})")

    if not isinstance(r["name"], str):
        bad("name", r["name"], "a string")
    if not isinstance(r["description"], str):
        bad("description", r["description"], "a string")
    for key in ("lossy", "gate"):
        if not isinstance(r[key], bool):
            bad(key, r[key], "true or false")
    eps = r["rotation"]["eps"]
    if eps != "auto":
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= eps <= 1.0):
            bad("rotation.eps", eps, "auto or a number in [0, 1]")
        r["rotation"]["eps"] = float(eps)
    for sec, unit_key in (("attention", "new_heads"), ("ffn", "new_units")):
        if r[sec][unit_key] not in UNIT_MODES:
            bad(f"{sec}.{unit_key}", r[sec][unit_key], " | ".join(UNIT_MODES))
        if r[sec]["new_columns"] not in COLUMN_MODES:
            bad(f"{sec}.new_columns", r[sec]["new_columns"], " | ".join(COLUMN_MODES))
    noise = r["noise"]
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0.0 <= noise <= 10.0:
        bad("noise", noise, "a number in [0, 10]")
    r["noise"] = float(noise)
    pair = r["pair_noise"]
    if isinstance(pair, bool) or not isinstance(pair, (int, float)) or not 0.0 <= pair <= 10.0:
        bad("pair_noise", pair, "a number in [0, 10]")
    r["pair_noise"] = float(pair)
    alpha = r["split_alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        bad("split_alpha", alpha, "a number in (0, 1)")
    r["split_alpha"] = float(alpha)
    if r["add_biases"] not in biases.FLAGS:
        bad("add_biases", r["add_biases"], " | ".join(biases.FLAGS))
    k = r["convex_k"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        bad("convex_k", k, "an integer >= 1")
    return r


def parse_set(items: list[str] | tuple[str, ...]) -> dict:
    """``["rotation.eps=0.9", "gate=false"]`` -> nested dict (values parsed as YAML scalars)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise GrowError(f"--set needs key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            val = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            val = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = val
    return out


def load(name_or_path: str = "srio", overrides: dict | None = None) -> dict:
    """A recipe by shipped name (``srio``) or YAML path, with overrides applied and checked."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        src = str(p)
        text = _read_recipe(p)
    else:
        f = _recipe_dir() / f"{name_or_path}.yaml"
        if not f.exists():
            raise GrowError(f"unknown recipe {name_or_path!r} (shipped: {', '.join(shipped())}; or give a .yaml path)")
        src, text = str(f), f.read_text()
    try:
        data = _load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise GrowError(f"{src}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise GrowError(f"{src}: a recipe must be a YAML mapping")
    _check_keys(data, DEFAULTS, "", src)
    r = _merge(DEFAULTS, data)
    if overrides:
        _check_keys(overrides, DEFAULTS, "", "--set")
        r = _merge(r, overrides)
    return validate(r, src)
