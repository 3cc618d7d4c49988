"""Text generation from a checkpoint (``growtool sample``) and the greedy-continuation check of
``growtool verify --generate``.

The model is run on the whole (context-cropped) sequence at every step: no key/value cache, so
the continuation is exactly what repeated forward passes of the checkpoint give.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from growtool.nn.errors import GrowError


@torch.no_grad()
def generate(
    model,
    prompts: torch.Tensor,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    alpha: float | None = None,
    eos: int | None = None,
) -> torch.Tensor:
    """Continue every row of ``prompts`` ([B, T] token ids) by ``max_tokens`` tokens; returns [B, n].

    ``temperature`` 0 is greedy (argmax, deterministic); above 0, sampling from softmax(logits / t)
    restricted to the ``top_k`` most likely ids (all when None), drawn from a generator seeded with
    ``seed`` (the same seed gives the same text). ``alpha`` is the growth-gate value for a gated
    model (None: the gates stored in it). Stops early once every row has produced ``eos``.
    """
    gated = model.cfg.gated
    gen = torch.Generator().manual_seed(seed)
    x, done = prompts, torch.zeros(len(prompts), dtype=torch.bool)
    ctx = model.cfg.context
    dev = next(model.parameters()).device
    for _ in range(max_tokens):
        logits = model(x[:, -ctx:].to(dev), alpha=alpha if gated else None)[:, -1].float().cpu()
        if temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
        x = torch.cat([x, nxt[:, None]], dim=1)
        if eos is not None:
            done |= nxt == eos
            if bool(done.all()):
                break
    return x[:, prompts.shape[1] :]


def eos_id(cfg) -> int | None:
    """The config's eos_token_id (the first, when it is a list), if any."""
    e = getattr(cfg, "extra", {}).get("eos_token_id")
    e = e[0] if isinstance(e, list) and e else e
    return e if isinstance(e, int) else None


@dataclass
class GenerationCheck:
    """Greedy continuations of the same prompts by two models, compared token for token."""

    prompts: int
    tokens: int  # continuation length
    identical: int  # prompts whose continuations are identical
    first_divergence: list | None  # [prompt index, token index] of the first difference

    @property
    def ok(self) -> bool:
        return self.identical == self.prompts

    def as_dict(self) -> dict:
        return {**asdict(self), "pass": self.ok}


def compare_generations(src, grown, prompts: list[torch.Tensor], n: int, alpha: float) -> GenerationCheck:
    """Greedy ``n``-token continuations of each prompt batch ([B, T] each) by ``src`` (at gate 0
    if it is gated) and ``grown`` at gate ``alpha``; equal only if every token is equal."""
    same, total, first = 0, 0, None
    for batch in prompts:
        a = generate(src, batch, n, alpha=0.0)
        b = generate(grown, batch, n, alpha=alpha)
        for r in range(len(batch)):
            diff = (a[r] != b[r]).nonzero()
            if len(diff) == 0:
                same += 1
            elif first is None:
                first = [total + r, int(diff[0])]
        total += len(batch)
    return GenerationCheck(total, n, same, first)


def verify_prompts(ck, texts, data_path: str | None, samples: int, seed: int, length: int = 16) -> list[torch.Tensor]:
    """Prompt batches for ``verify --generate``: each given text encoded with ``ck``'s tokenizer (one
    batch each); else ``samples`` windows of ``length`` tokens spread over the first MB of
    ``data_path`` (tokenised with ``ck``'s tokenizer, or bytes modulo the vocabulary when it has
    none: any ids serve to compare two models); else ``samples`` random id sequences."""
    from growtool.tokenizer import native, tokenizer_for

    vocab = ck.config.vocab_size
    if texts:
        tok = tokenizer_for(ck)
        out = [torch.tensor([tok.encode_prompt(t)]) for t in texts]
        if any(p.shape[1] == 0 for p in out):
            raise GrowError("--prompt: a prompt encodes to no tokens")
        return out
    if data_path:
        with open(data_path, "rb") as fh:
            raw = fh.read(1 << 20)
        try:
            tok = tokenizer_for(ck)
        except GrowError:
            tok = None
        if tok is None or tok.hf is None:
            ids = torch.tensor(list(raw), dtype=torch.long) % vocab
        else:
            text = raw.decode("utf-8", errors="ignore")
            ids = torch.tensor(native(lambda: tok.hf.encode(text, add_special_tokens=False), data_path).ids)
        if len(ids) == 0:
            raise GrowError(f"{data_path}: no tokens to take prompts from")
        length = min(length, len(ids))
        starts = torch.linspace(0, len(ids) - length, samples).long()
        return [torch.stack([ids[s : s + length] for s in starts])]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab, (samples, min(length, ck.config.context)), generator=g)]


__all__ = ["generate", "compare_generations", "verify_prompts", "GenerationCheck", "eos_id"]
