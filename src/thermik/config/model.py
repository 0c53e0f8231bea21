"""Config sections of the policy model, its inference engine and the HTTP server."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from thermik.config.base import Section


class ModelConfig(Section):
    path: str = Field("runs/models/qwen2-1m", description="Local HF model directory (weights + tokenizer).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    train_precision: Literal["float32", "bf16-mixed", "auto"] = Field(
        "auto", description="Trainer arithmetic: 'float32', 'bf16-mixed' (forward and backward under bfloat16 "
        "autocast; float32 weights, AdamW state and logprobs) or 'auto' (bf16-mixed where the CPU reports AMX-BF16 or "
        "AVX512-BF16, or the GPU supports bfloat16; else float32; a model.dtype other than float32 trains in that "
        "dtype). bf16-mixed needs dtype 'float32' (docs/algorithms.md)."
    )  # fmt: skip
    lm_head_precision: Literal["auto", "float32", "bf16"] = Field(
        "auto", description="Under bf16-mixed: the output projection (the logits) in 'float32' (from the float32 "
        "master weight, outside autocast), in 'bf16' like every other product, or 'auto': float32 where the lm head "
        "holds at most 10% of the parameters (its float32 cost stays small), else bf16 (docs/algorithms.md)."
    )  # fmt: skip
    device: str = Field("cpu", description="torch device for trainer and embedded engine ('cpu', 'cuda', 'cuda:0').")
    seed: int = Field(0, description="Seed for weights initialisation of new heads and for torch RNGs.")
    chat_template: str = Field(
        "", description="A jinja chat template file replacing the model's own (e.g. one that renders tools); empty "
        "keeps the model's. A template that ignores tools gets them in the system message (docs/models.md)."
    )  # fmt: skip
    enable_thinking: bool | None = Field(
        None, description="Passed to the chat template as `enable_thinking` (Qwen3-style templates: false closes an "
        "empty <think> block in the generation prompt); None passes nothing (docs/models.md, 'Thinking models')."
    )  # fmt: skip

    @model_validator(mode="after")
    def _mixed_needs_float32(self) -> ModelConfig:
        if self.train_precision == "bf16-mixed" and self.dtype != "float32":
            raise ValueError(
                f"model.train_precision {self.train_precision!r} keeps float32 master weights: set model.dtype "
                f"'float32' (got {self.dtype!r}), or train_precision 'float32' to train in {self.dtype} directly"
            )
        return self  # whether this machine runs bf16-mixed is asked at run assembly (thermik.assembly.hardware)


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep only the k most likely tokens; 0 disables.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Drop tokens whose probability is below min_p * max prob.")


class InferenceConfig(Section):
    backend: Literal["embedded", "remote", "vllm"] = Field(
        "embedded",
        description="Inference engine: 'embedded' (in-process torch), 'remote' (an OpenAI-compatible server) or "
        "'vllm' (in-process vLLM; needs a CUDA GPU and the 'vllm' extra).",
    )
    max_batch_size: int = Field(
        256, ge=1, description="Most sequences decoded together in one batch (embedded; vllm's max_num_seqs)."
    )
    seed: int = Field(0, description="Base seed of the engine's sampler.")
    precision: Literal["model", "float32", "bfloat16", "bf16-weights", "int8", "auto"] = Field(
        "auto", description="Embedded: dtype of the engine's copy of the weights and KV cache: 'model' (model.dtype), "
        "'float32', 'bfloat16', 'bf16-weights' / 'int8' (float32 activations, projection weights stored as bfloat16 "
        "or weight-only int8: turn on TIS/MIS, docs/inference.md), or 'auto' (bfloat16 where the CPU reports "
        "AMX-BF16 or AVX512-BF16, else float32 with the fastest of float32 and bfloat16-stored weights, timed)."
    )  # fmt: skip
    num_threads: int = Field(
        0, ge=0, description="Embedded: torch threads of the engine's decode thread; 0 inherits the process setting."
    )
    kv_cache_gb: float | None = Field(
        None, gt=0, description="Embedded: KV cache budget in GiB (requests wait for room rather than grow past it); "
        "unset takes a quarter of the available RAM (of the free GPU memory on CUDA), inf sets none."
    )  # fmt: skip
    decode_graphs: Literal["auto", "off"] = Field(
        "auto", description="Embedded: 'auto' replays each decode step as a CUDA graph on a GPU (docs/gpu.md; the CPU "
        "keeps its own decode); 'off' runs the eager forward everywhere."
    )  # fmt: skip
    inflight_kv: Literal["keep", "recompute"] = Field(
        "keep", description="Embedded: a weight update lands between two decode steps and running requests go on "
        "under the new weights; their KV cache is kept ('keep': keys/values of earlier tokens stay those of the old "
        "weights, as PipelineRL; free) or recomputed ('recompute': one prefill of every running sequence, so every "
        "later token is exactly the new policy's). docs/async.md."
    )  # fmt: skip
    base_url: str = Field(
        "http://127.0.0.1:8000", description="Remote backend: server root (thermik inference, vLLM), without /v1."
    )
    api_key: str = Field("", description="Remote backend: bearer API key; empty sends none.")
    served_model_name: str = Field("", description="Remote backend: model name to request; empty asks /v1/models.")
    weights_dir: str = Field(
        "", description="Remote backend: directory shared with the server where weight updates are written as "
        "safetensors; empty uses a temporary directory (server on the same machine)."
    )  # fmt: skip
    timeout_s: float = Field(600.0, gt=0, description="Remote backend: per-request timeout in seconds.")
    send_session_ids: Literal["auto", "always", "never"] = Field(
        "auto", description="Remote backend: send each episode's session id as the body field 'session_id'; 'auto' "
        "sends it only to thermik's own server (other servers may refuse unknown fields)."
    )  # fmt: skip
    vllm_gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="vllm backend: fraction of GPU memory vLLM may take (the trainer needs the rest)."
    )
    vllm_max_model_len: int = Field(0, ge=0, description="vllm backend: context length; 0 uses the model's.")


class ServerConfig(Section):
    host: str = Field("127.0.0.1", description="Interface to listen on ('0.0.0.0' for every interface).")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str = Field("", description="Require 'Authorization: Bearer <key>' on /v1 and /update_weights when set.")
    served_model_name: str = Field("", description="Model name in the API; empty uses the model directory's name.")
    max_model_len: int = Field(0, ge=0, description="Longest prompt + completion; 0 uses the model's context length.")
    access_log: bool = Field(False, description="Log every request (uvicorn's access log); RL sends thousands.")
