"""Folders that no stock transformers class can run: gated attention, open growth gates.

transformers drops tensors a stock class does not know (with only an "unexpected keys" warning)
and would compute another function. Such a model is written with ``model_type: "growtool"`` (no
stock class has it, so loading without ``trust_remote_code`` fails loudly) and an ``auto_map`` to
a modeling file in the folder. That file runs growtool's own forward pass: ``model.py``,
``attention.py``, ``moe.py``, ``moe_layers.py``, ``config.py``, ``families.py``, ``errors.py`` and ``rope.py`` are
copied beside it unchanged.

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
"""

from __future__ import annotations

from pathlib import Path

from growtool.nn.config import ModelConfig

CORE = (
    "model.py",
    "attention.py",
    "mla.py",
    "moe.py",
    "moe_layers.py",
    "hybrid_keys.py",
    "experts.py",
    "mamba.py",
    "config.py",
    "families.py",
    "errors.py",
    "rope.py",
    "shortconv.py",
    "deltanet.py",
)

CONFIGURATION = '''"""growtool's config class for transformers (written by growtool; see modeling_growtool.py)."""
from transformers import PretrainedConfig


class GrowtoolConfig(PretrainedConfig):
    model_type = "growtool"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
'''

MODELING = '''"""growtool's forward pass as a transformers model (written by growtool).

The architecture, gated attention and growth gates follow the config's ``growtool`` section;
model.py, attention.py, moe.py, moe_layers.py, config.py, families.py, errors.py and rope.py beside this file
are growtool's own, unchanged.
``forward(input_ids, labels=None, alpha=None)``: ``alpha`` overrides the growth gates. The growth
gates load frozen (requires_grad False): a schedule sets them (growtool.training.hf_callback.GateRampCallback),
never an optimizer. With ``num_items_in_batch`` (the Trainer's gradient accumulation) the loss is
the sum over tokens divided by it, as transformers' own causal-LM loss.
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .config import ModelConfig
from .configuration_growtool import GrowtoolConfig
from .families import arch_of
from .model import build, run


class GrowtoolForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GrowtoolConfig
    base_model_prefix = "growtool"
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        cfg = ModelConfig.from_hf(config.to_dict())
        build(self, cfg)
        a = arch_of(cfg)
        self._tied_weights_keys = {a.modules["head"] + ".weight": a.embed} if cfg.tie else {}
        self.post_init()
        for gate in self.growth_gates():
            gate.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        for gate in model.growth_gates():  # loading makes fresh parameters, trainable: freeze the gates again
            gate.requires_grad_(False)
        return loaded

    def _init_weights(self, module):
        pass  # every weight comes from the checkpoint

    def get_input_embeddings(self):
        return self.get_submodule(arch_of(self.cfg).modules["embed"])

    def get_output_embeddings(self):
        return self.get_submodule(arch_of(self.cfg).modules["head"])

    def growth_gates(self):
        """The blocks' growth-gate parameters (empty for a model without gated units)."""
        if not self.cfg.gated:
            return []
        return [b.growth_gate for b in self.get_submodule(arch_of(self.cfg).blocks_path)]

    def forward(self, input_ids=None, attention_mask=None, labels=None, alpha=None, num_items_in_batch=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("growtool models take unpadded batches (attention_mask must be all ones)")
        logits = run(self, input_ids, alpha)
        loss = None
        if labels is not None:
            pred, target = logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten()
            if num_items_in_batch is None:
                loss = F.cross_entropy(pred, target, ignore_index=-100)
            else:
                loss = F.cross_entropy(pred, target, ignore_index=-100, reduction="sum")
                loss = loss / torch.as_tensor(num_items_in_batch, device=loss.device)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}  # no KV cache: the whole sequence every step
'''


def needs_remote(cfg: ModelConfig) -> bool:
    """True when no stock transformers class computes this model's function."""
    return cfg.attn_gate or cfg.gated


def folder_config(cfg: ModelConfig) -> dict:
    """config.json of a folder: the stock architecture's, or the remote-code one."""
    hf = cfg.to_hf()
    if not needs_remote(cfg):
        return hf
    hf["growtool"]["model_type"] = hf["model_type"]
    hf["model_type"], hf["architectures"] = "growtool", ["GrowtoolForCausalLM"]
    hf["auto_map"] = {
        "AutoConfig": "configuration_growtool.GrowtoolConfig",
        "AutoModelForCausalLM": "modeling_growtool.GrowtoolForCausalLM",
    }
    return hf


def folder_files(cfg: ModelConfig) -> dict[str, bytes]:
    """The modeling files a remote-code folder needs (none for a stock architecture)."""
    if not needs_remote(cfg):
        return {}
    here = Path(__file__).resolve().parent.parent / "nn"
    files = {name: (here / name).read_bytes() for name in CORE}
    files["configuration_growtool.py"] = CONFIGURATION.encode()
    files["modeling_growtool.py"] = MODELING.encode()
    return files
