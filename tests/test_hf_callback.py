"""A grown checkpoint trains in transformers.Trainer with growtool's GateRampCallback: the first update
sees the source model's function (gates at 0), the gates ramp to 1 on schedule and are never trained,
and the folder Trainer.save_model writes is one growtool reads back and folds into a stock model with
the trained model's logits."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from safetensors import safe_open  # noqa: E402

from growtool.grow.plan import gate_values  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.nn.errors import GrowError  # noqa: E402
from growtool.training.hf_callback import GateRampCallback  # noqa: E402

from helpers import cli, perturbed  # noqa: E402

SEQ, BATCH, STEPS, RAMP_STEPS = 32, 4, 20, 10
TEXT = b"the cat sees a hat; the dog sees the sea; the fox sees one tree. " * 60


class Windows(torch.utils.data.Dataset):
    """Byte windows of a repeated text (vocabulary 256), labels = inputs (the model shifts them)."""

    def __init__(self):
        ids = torch.tensor(list(TEXT))
        self.x = torch.stack([ids[i : i + SEQ] for i in range(0, len(ids) - SEQ, 7)])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Recorder(transformers.TrainerCallback):
    """The gates each update runs with (listed after the ramp, so it sees what the ramp set)."""

    def __init__(self):
        self.gates = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.gates.append(sorted({float(g) for g in model.growth_gates()}))


def grown_folder(tmp_path, tie):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    src = perturbed(transformers.LlamaForCausalLM(cfg)).eval()
    src.save_pretrained(tmp_path / "src")
    r = cli("expand", tmp_path / "src", "--width", 48, "-q", "-o", tmp_path / "grown")
    assert r.exit_code == 0, r.stderr
    return src, tmp_path / "grown"


def load_remote(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


@pytest.mark.parametrize("tie, count_tokens", [(True, False), (False, True)], ids=["tied-by-step", "untied-counted"])
def test_trainer_ramps_gates_and_the_saved_folder_folds(tmp_path, tie, count_tokens):
    src, grown = grown_folder(tmp_path, tie)
    model = load_remote(grown)
    gates = model.growth_gates()
    assert len(gates) == 2 and all(not g.requires_grad and float(g) == 0.0 for g in gates)
    first = []
    model.register_forward_pre_hook(
        lambda m, args, kw: first.append(kw["input_ids"].clone()) if m.training and not first else None,
        with_kwargs=True,
    )
    per_step = BATCH * SEQ
    ramp = GateRampCallback(RAMP_STEPS * per_step, tokens_per_step=None if count_tokens else per_step)
    seen = Recorder()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        include_num_input_tokens_seen=count_tokens,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[ramp, seen])
    optimized = {id(p) for group in trainer.create_optimizer().param_groups for p in group["params"]}
    assert not optimized & {id(g) for g in gates}  # the optimizer never holds the gates
    trainer.train()

    # update 0 ran the source model's function: same loss on the same batch
    with torch.no_grad():
        src_loss = float(src(first[0], labels=first[0]).loss)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS and abs(losses[0] - src_loss) < 1e-5, (losses[0], src_loss)
    assert min(losses[-3:]) < losses[0] - 0.5  # it trained
    # the schedule: update s ran with gate min(1, s / RAMP_STEPS); after training every gate is 1
    assert seen.gates == [[pytest.approx(min(1.0, s / RAMP_STEPS), abs=1e-7)] for s in range(STEPS)]
    assert [float(g) for g in model.growth_gates()] == [1.0, 1.0]

    out = tmp_path / "trained"
    trainer.save_model(str(out))
    hf = json.loads((out / "config.json").read_text())
    assert hf["model_type"] == "growtool" and hf["growtool"]["model_type"] == "llama"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert [float(f.get_tensor(f"model.layers.{i}.growth_gate")) for i in (0, 1)] == [1.0, 1.0]
    assert ("lm_head.weight" in names) == (not tie)
    ck = checkpoint.load(out)  # growtool reads the Trainer's folder
    assert ck.config.gated and ck.config.tie == tie and gate_values(ck) == [1.0, 1.0]

    r = cli("fold", out, "--alpha", 1, "-o", tmp_path / "plain")
    assert r.exit_code == 0, r.stderr
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()  # a stock class
    assert type(plain).__name__ == "LlamaForCausalLM"
    x = torch.randint(256, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.eval()(x).logits
        got = plain(x).logits
    assert float((got - want).abs().max()) <= 1e-5 * float(want.std())


def test_loss_over_accumulated_tokens(tmp_path):
    """With num_items_in_batch (Trainer's gradient accumulation) the loss is the token sum over it."""
    _, grown = grown_folder(tmp_path, tie=True)
    model = load_remote(grown).eval()
    x = torch.randint(256, (2, SEQ), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        mean = model(x, labels=x).loss
        summed = model(x, labels=x, num_items_in_batch=torch.tensor(3 * 2 * (SEQ - 1))).loss
    assert torch.allclose(summed, mean / 3, rtol=1e-6)


def test_bad_ramps_are_refused_in_one_line(tmp_path):
    for bad in (dict(tokens=-1), dict(tokens=1.5), dict(tokens=10, tokens_per_step=0)):
        with pytest.raises(GrowError, match="GateRampCallback: tokens"):
            GateRampCallback(**bad)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), report_to="none", use_cpu=True)
    state = transformers.TrainerState()
    plain = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
    )
    with pytest.raises(GrowError, match="no growth gates"):
        GateRampCallback(10, tokens_per_step=5).on_train_begin(args, state, None, model=plain)
    _, grown = grown_folder(tmp_path, tie=True)
    with pytest.raises(GrowError, match="include_num_input_tokens_seen"):
        GateRampCallback(10).on_train_begin(args, state, None, model=load_remote(grown))


class StopAt(transformers.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resumed_trainer_continues_the_ramp(tmp_path):
    _, grown = grown_folder(tmp_path, tie=True)
    per_step = BATCH * SEQ

    def trainer(callbacks):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "ckpts"),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            save_strategy="steps",
            save_steps=6,
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
        )
        ramp = GateRampCallback(RAMP_STEPS * per_step, tokens_per_step=per_step)
        return transformers.Trainer(
            model=load_remote(grown), args=args, train_dataset=Windows(), callbacks=[ramp, *callbacks]
        )

    trainer([StopAt(6)]).train()
    with safe_open(str(tmp_path / "ckpts" / "checkpoint-6" / "model.safetensors"), "pt") as f:
        assert float(f.get_tensor("model.layers.0.growth_gate")) == pytest.approx(0.6)
    seen = Recorder()
    t = trainer([seen])
    t.train(resume_from_checkpoint=str(tmp_path / "ckpts" / "checkpoint-6"))
    assert seen.gates == [[pytest.approx(min(1.0, s / RAMP_STEPS), abs=1e-7)] for s in range(6, STEPS)]
    assert [float(g) for g in t.model.growth_gates()] == [1.0, 1.0]
