"""A character/byte-level tokenizer for tiny models built from scratch (no hub).

Byte-level BPE with no merges: every UTF-8 byte is one token, plus chat/tool tags as single tokens.
Tiny models learn copy-heavy tasks (reversal, arithmetic) much faster with per-character tokens than
with a learned BPE (see shared/FIELD-NOTES.md).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from thermik.models.chat import CHAT_TEMPLATES

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    "<|im_start|>",
    EOS_TOKEN,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Skipped by ``decode(skip_special_tokens=True)``."""

TAG_TOKENS: tuple[str, ...] = ("<answer>", "</answer>", "<reversed>", "</reversed>")
"""Single tokens that stay in decoded text even with ``skip_special_tokens=True``: task output markers."""

VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(TAG_TOKENS)  # 269


def _byte_level_backend() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: with no merges the word split only costs time.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def build_tokenizer(template: str = "chatml-tools", context: int = 2048) -> PreTrainedTokenizerFast:
    """The tiny-model tokenizer: 269 tokens, left padding, eos ``<|im_end|>``, pad ``<|endoftext|>``, no BOS; its chat
    template is `CHAT_TEMPLATES[template]`, its `model_max_length` `context`."""
    if template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {template!r}; valid: {', '.join(CHAT_TEMPLATES)}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_backend(),
        padding_side="left",
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=context,
    )
    tokenizer.chat_template = CHAT_TEMPLATES[template]
    if len(tokenizer) != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    return tokenizer
