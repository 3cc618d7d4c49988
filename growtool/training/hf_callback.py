"""The growth-gate ramp inside a Hugging Face ``transformers.Trainer`` (or any trainer that runs
``TrainerCallback``s: TRL's trainers subclass it).

    from transformers import AutoModelForCausalLM, Trainer
    from growtool.training.hf_callback import GateRampCallback

    model = AutoModelForCausalLM.from_pretrained("grown", trust_remote_code=True)  # growtool expand's folder
    ramp = GateRampCallback(tokens=40_000_000, tokens_per_step=256 * 1024)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ramp])
    trainer.train()
    trainer.save_model("trained")   # then: growtool fold trained --alpha 1 -o plain

What holds:

* Before update ``s`` (0-based, the Trainer's ``global_step``) every growth gate is set to
  min(1, s * tokens_per_step / tokens): the ramp of ``growtool train --gate-warmup-tokens``. After
  update ``s`` the gates hold the value of step s + 1, so evaluations and saves after a step see the
  gate the next update will use, and the model left after training holds the gate of its last step
  (1 once ``tokens`` are through).
* Without ``tokens_per_step`` the ramp follows the Trainer's own token count instead
  (``num_input_tokens_seen``: needs ``TrainingArguments(include_num_input_tokens_seen=True)``),
  counted before each update in the same way.
* The gates are never trained: the remote-code class loads them frozen (so the Trainer's optimizer
  never holds them), and the callback freezes them again when training begins, for models loaded
  otherwise: a parameter without a gradient is skipped by torch's optimizers, weight decay included.
  A model without growth gates is refused with one line.
* Resuming from a Trainer checkpoint continues the ramp from the checkpoint's step.
"""

from __future__ import annotations

import torch

from growtool.nn.errors import GrowError

try:
    from transformers import TrainerCallback
except ImportError:  # transformers is optional for growtool; the callback needs it
    TrainerCallback = object


def growth_gates(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The growth-gate parameters of ``model`` (any wrapper that keeps parameter names ending in growth_gate)."""
    return [p for n, p in model.named_parameters() if n.endswith("growth_gate")]


def freeze_gates(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Take the growth gates out of training (requires_grad False, no gradient); returns them."""
    gates = growth_gates(model)
    for g in gates:
        g.requires_grad_(False)
        g.grad = None
    return gates


class GateRampCallback(TrainerCallback):
    """Ramp a grown model's growth gates 0 -> 1 linearly over ``tokens`` training tokens."""

    def __init__(self, tokens: int, tokens_per_step: int | None = None):
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise GrowError(f"GateRampCallback: tokens must be an integer >= 0, got {tokens!r}")
        if tokens_per_step is not None and (
            isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int) or tokens_per_step < 1
        ):
            raise GrowError(f"GateRampCallback: tokens_per_step must be an integer >= 1, got {tokens_per_step!r}")
        if TrainerCallback is object:
            raise GrowError("GateRampCallback needs transformers (pip install transformers)")
        self.tokens, self.tokens_per_step = tokens, tokens_per_step
        self.gates: list[torch.nn.Parameter] = []

    def gate(self, tokens_seen: int) -> float:
        """The gate after ``tokens_seen`` training tokens."""
        return 1.0 if self.tokens <= 0 else min(1.0, tokens_seen / self.tokens)

    def tokens_seen(self, state) -> int:
        """Training tokens before the next update (by step count, or the Trainer's own count)."""
        if self.tokens_per_step is not None:
            return state.global_step * self.tokens_per_step
        return int(state.num_input_tokens_seen)

    def _set(self, state) -> None:
        value = self.gate(self.tokens_seen(state))
        with torch.no_grad():
            for g in self.gates:
                g.fill_(value)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise GrowError("GateRampCallback: the trainer passed no model to its callbacks")
        self.gates = freeze_gates(model)
        if not self.gates:
            raise GrowError(
                "GateRampCallback: the model has no growth gates (a plain or folded model; "
                "load growtool expand's folder with trust_remote_code=True)"
            )
        if self.tokens_per_step is None and getattr(args, "include_num_input_tokens_seen", "no") in ("no", False):
            raise GrowError(
                "GateRampCallback: give tokens_per_step, or set "
                "TrainingArguments(include_num_input_tokens_seen=True) so the ramp can count tokens"
            )
        self._set(state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._set(state)

    def on_step_end(self, args, state, control, **kwargs):
        self._set(state)


__all__ = ["GateRampCallback", "freeze_gates", "growth_gates"]
