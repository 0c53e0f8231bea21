"""`thermik tinker` configuration (one frozen model, every field described)."""

from __future__ import annotations

from pydantic import Field

from thermik.config.schema import ModelConfig, Section


class TinkerServerConfig(Section):
    host: str = Field("127.0.0.1", description="Interface to listen on; loopback by default.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str = Field(
        "", description="Require this key in the X-API-Key header (the SDK's TINKER_API_KEY) when set."
    )
    base_model_name: str = Field(
        "", description="Name clients pass as base_model; empty: the model directory's absolute path. The path and "
        "the directory's name are always accepted too.",
    )  # fmt: skip
    access_log: bool = Field(False, description="Log every request (uvicorn's access log).")


class TinkerServiceConfig(Section):
    state_dir: str = Field("runs/tinker", description="SQLite database and checkpoints (persist across restarts).")
    poll_s: float = Field(
        20.0,
        gt=0,
        le=40,
        description="Longest retrieve_future long poll before answering try_again (the SDK waits 45 s).",
    )
    max_sampler_engines: int = Field(
        3, ge=1, description="Sampler weight sets kept loaded, least recently used evicted."
    )
    num_threads: int = Field(
        0, ge=0, description="torch threads of the training worker thread; 0 keeps torch's default. On a loaded CPU "
        "fewer threads than cores avoids OpenMP workers spinning against other processes.",
    )  # fmt: skip
    max_lora_rank: int = Field(256, ge=1, description="Largest LoRA rank create_model accepts.")


class TinkerConfig(Section):
    """`thermik tinker`: a Tinker-compatible training and sampling service over one local base model."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The base model served (a local HF dir).")
    server: TinkerServerConfig = Field(default_factory=TinkerServerConfig, description="HTTP server.")
    service: TinkerServiceConfig = Field(default_factory=TinkerServiceConfig, description="Futures and storage.")
