"""Write a thermik preset model (llama or qwen2) as a GGUF file with the `gguf` package, as llama.cpp's converter does.

Only what the import tests need: f32/f16 tensors, the llama/qwen2 hyperparameters transformers reads back, and the
byte-level tokenizer (``tokenizer.ggml.model = gpt2``) with its special tokens and chat template.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

_CONTROL, _USER_DEFINED, _NORMAL = 3, 4, 1  # llama.cpp token types


def _llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row permutation for llama (rotary halves interleaved); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_hparams(writer: gguf.GGUFWriter, cfg, arch: str) -> None:
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch == "llama":
        writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_vocab_size(cfg.vocab_size)


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerBase) -> None:
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tokenizer.all_special_tokens)
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    types = [_CONTROL if t in special else _USER_DEFINED if t in added else _NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([])  # an empty array reads back as absent: merges then come from the scores
    writer.add_token_scores([0.0] * len(tokens))
    if tokenizer.eos_token_id is not None:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)


def write_gguf(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path, dtype: torch.dtype = torch.float32
) -> Path:
    """`model` (a LlamaForCausalLM or Qwen2ForCausalLM) and `tokenizer` as one GGUF file at `path`."""
    cfg = model.config
    arch = cfg.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    _add_hparams(writer, cfg, arch)
    _add_tokenizer(writer, tokenizer)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # no output.weight: transformers reads that as tied embeddings
        t = tensor.detach().float()
        if arch == "llama" and name.endswith("q_proj.weight"):
            t = _llama_permute(t, cfg.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            t = _llama_permute(t, cfg.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for {name}")
        # llama.cpp keeps 1-D tensors (norms, biases) in f32 whatever the file type.
        out_dtype = np.float32 if t.ndim == 1 or dtype == torch.float32 else np.float16
        writer.add_tensor(gguf_name, t.numpy().astype(out_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
