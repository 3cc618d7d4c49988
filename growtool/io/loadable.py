"""Will transformers load what we write? Checked before a folder's weights are written.

A grown folder is meant to load in transformers as its stock class. growtool's own forward pass
cannot see a config.json that transformers rejects (a Gemma 3 ``rope_parameters`` that is flat where
Gemma 3 needs one entry per layer type fails in ``from_pretrained`` with a bare KeyError), so
``check`` builds the stock config from the dict config.json gets (``ModelConfig.to_hf``, the keys
of the growth state left out) and the model class from it on the meta device (no memory, no
initialisation), and refuses with one line when either fails.

Skipped, not refused: without transformers; when the installed transformers does not know the
model type (a newer family, an older transformers: this machine cannot judge).
"""

from __future__ import annotations

import contextlib
import io

import torch

from growtool.nn.errors import GrowError


def _transformers():
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def check(cfg) -> None:
    """Raise GrowError when transformers cannot build ``cfg``'s stock config or model class."""
    tf = _transformers()
    if tf is None:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    hf = {k: v for k, v in cfg.to_hf().items() if k != "growtool"}
    mt = hf["model_type"]
    if mt not in CONFIG_MAPPING:
        return
    verbosity = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()  # its warnings are not ours to print
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cls = CONFIG_MAPPING[mt]
            if hasattr(cls, "_decode_special_floats"):  # {"__float__": "Infinity"}, as from_pretrained reads it
                hf = cls._decode_special_floats(hf)
            conf = cls.from_dict(hf)
            with torch.device("meta"):
                getattr(tf, hf["architectures"][0])._from_config(conf)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises is the answer
        why = " ".join(f"{type(e).__name__}: {e}".split())[:160]
        raise GrowError(
            f"transformers {tf.__version__} cannot load the {mt} config this would write ({why}); nothing written"
        ) from None
    finally:
        tf.logging.set_verbosity(verbosity)
