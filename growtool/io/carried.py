"""The tokenizer and generation files a model folder carries (``growtool.tokenizer`` copies them;
``growtool.io.confine`` counts them among what an input is read from). Imports nothing."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)
CARRIED = TOKENIZER_FILES + ("generation_config.json",)
