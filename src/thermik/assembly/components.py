"""Build the pieces a run needs from their configs: model, tokenizer, engine, environments, datasets."""

from __future__ import annotations

import copy
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thermik.agents.verifiers_episode import playable
from thermik.config.schema import DataConfig, EnvConfig, InferenceConfig, LoRAConfig, ModelConfig
from thermik.data.disk import load_rows_from
from thermik.envs.base import Env
from thermik.inference.base import InferenceEngine
from thermik.inference.embedded import embedded_engine
from thermik.inference.remote import RemoteEngine
from thermik.models.chat import ChatTokenizer
from thermik.models.loading import load_model, load_tokenizer
from thermik.rollout.agent_loop import EnvFactory
from thermik.tasks.registry import generate_rows, make_env
from thermik.tools.mcp_pool import MCPPool


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_policy(
    cfg: ModelConfig, lora: LoRAConfig | None = None, tool_format: str = "hermes"
) -> tuple[torch.nn.Module, ChatTokenizer]:
    """The policy (wrapped with LoRA adapters when lora.enabled) and its chat tokenizer."""
    model = load_model(cfg.path, dtype=cfg.dtype, device=cfg.device)
    if lora is not None and lora.enabled:
        model = _lora().apply_lora(model, lora)
    return model, ChatTokenizer(load_tokenizer(cfg.path, cfg.chat_template), tool_format, cfg.enable_thinking)


def _lora() -> Any:
    try:
        from thermik.training import lora
    except ImportError as e:
        raise ImportError(f'lora.enabled needs peft: pip install -e ".[lora]" ({e})') from e
    return lora


def is_lora(policy: torch.nn.Module) -> bool:
    return hasattr(policy, "peft_config")  # a PeftModel, recognised without importing peft


def engine_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a weight sync sends the engine: the state dict, or with LoRA the merged adapted weights only."""
    return _lora().merged_lora_weights(policy) if is_lora(policy) else policy.state_dict()


def plain_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A copy of the policy as a plain causal LM (LoRA adapters merged in)."""
    return _lora().merged_model(policy) if is_lora(policy) else copy.deepcopy(policy)


def export_policy(policy: torch.nn.Module, chat: ChatTokenizer, out: Path) -> None:
    """The policy as a HF model directory (merged, with LoRA) + tokenizer; with LoRA also `out/adapter/` in PEFT
    format."""
    if is_lora(policy):
        _lora().merged_model(policy).save_pretrained(out, safe_serialization=True)
        _lora().save_adapter(policy, out / "adapter")
    else:
        policy.save_pretrained(out, safe_serialization=True)
    chat.tokenizer.save_pretrained(out)


def _embedded_engine(
    policy: torch.nn.Module, chat: ChatTokenizer, cfg: InferenceConfig, precision_asked_by: str | None = None
) -> InferenceEngine:
    """The engine owns its own copy of the weights (LoRA merged in); the trainer pushes updates into it."""
    engine_model = plain_copy(policy).eval()
    for p in engine_model.parameters():
        p.requires_grad_(False)
    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else chat.eos_id
    return embedded_engine(
        engine_model,
        eos_token_ids=chat.stop_ids,
        pad_token_id=pad,
        max_batch_size=cfg.max_batch_size,
        seed=cfg.seed,
        detokenize=chat.tokenizer.decode,
        num_threads=cfg.num_threads,
        kv_cache_gb=cfg.kv_cache_gb,
        precision=cfg.precision,
        precision_asked_by=precision_asked_by,
        decode_graphs=cfg.decode_graphs,
        inflight_kv=cfg.inflight_kv,
    )


def _remote_engine(policy: torch.nn.Module, chat: ChatTokenizer, cfg: InferenceConfig) -> InferenceEngine:
    """A server that must already serve the same weights as `policy` (start it on the same model path)."""
    return RemoteEngine(
        cfg.base_url,
        api_key=cfg.api_key or None,
        model=cfg.served_model_name or None,
        weights_dir=cfg.weights_dir or None,
        stop_token_ids=chat.stop_ids,
        timeout_s=cfg.timeout_s,
        send_session_ids={"auto": None, "always": True, "never": False}[cfg.send_session_ids],
    )


def _vllm_engine(policy: torch.nn.Module, chat: ChatTokenizer, cfg: InferenceConfig) -> InferenceEngine:
    """vLLM in this process, started from the policy's current weights (exported to a temporary directory that the
    engine removes on close)."""
    from thermik.inference.vllm_engine import VLLMEngine, require_vllm

    require_vllm()  # fail before exporting the model
    model_dir = Path(tempfile.mkdtemp(prefix="thermik-vllm-model-"))
    export_policy(policy, chat, model_dir)
    return VLLMEngine(
        model_dir,
        stop_token_ids=chat.stop_ids,
        seed=cfg.seed,
        max_num_seqs=cfg.max_batch_size,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_len=cfg.vllm_max_model_len,
        dtype=str(next(policy.parameters()).dtype).removeprefix("torch."),  # vLLM's "auto" is bfloat16 on CPU
        remove_model_dir=True,
    )


ENGINES: dict[str, Callable[[torch.nn.Module, ChatTokenizer, InferenceConfig], InferenceEngine]] = {
    "embedded": _embedded_engine,
    "remote": _remote_engine,
    "vllm": _vllm_engine,
}


def build_engine(
    policy: torch.nn.Module, chat: ChatTokenizer, cfg: InferenceConfig, precision_asked_by: str | None = None
) -> InferenceEngine:
    """The engine named by `cfg.backend`, from the ENGINES table. `precision_asked_by`: the embedded engine's
    cfg.precision follows another setting than inference.precision (SFT's held-out check: the trainer's)."""
    if cfg.backend not in ENGINES:
        raise ValueError(f"unknown inference.backend {cfg.backend!r}; valid backends: {', '.join(ENGINES)}")
    if precision_asked_by is not None and cfg.backend == "embedded":
        return _embedded_engine(policy, chat, cfg, precision_asked_by)
    return ENGINES[cfg.backend](policy, chat, cfg)


def env_factory(cfg: EnvConfig, pool: MCPPool) -> EnvFactory:
    """Builds the env of each row; the envs that call MCP servers do it through `pool` (the run owns and closes it)."""

    def build(row: dict[str, Any]) -> Env:
        name = cfg.name or row.get("env_class", "")
        reward_spec, extra_info = row.get("reward_spec", {}), row.get("extra_info", {})
        env = make_env(name, reward_spec=reward_spec, extra_info=extra_info, options=cfg, pool=pool)
        if not cfg.render_tools:
            env.tools = None  # the system prompt names the tool; its schema stays out of the context
        return playable(env)  # verifiers plays its own episodes against a capture endpoint

    return build


def load_datasets(
    cfg: DataConfig, env: EnvConfig, train: bool = True
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """(train rows, held-out rows): from files (thermik.data.disk), or synthesized from disjoint splits of the
    environment's generator. train=False: held-out rows only (an evaluation needs no training set, nor a generator)."""
    rows = None
    if train:
        rows = (
            load_rows_from(cfg.train_path, cfg.columns, env.name, cfg.train_split)
            if cfg.train_path
            else generate_rows(env.name, cfg.synthetic_train_size, cfg.seed, "train", options=env)
        )
    held_out = (
        load_rows_from(cfg.eval_path, cfg.columns, env.name, cfg.eval_split)
        if cfg.eval_path
        else generate_rows(env.name, cfg.synthetic_eval_size, cfg.seed, "eval", options=env)
    )
    return rows, held_out
