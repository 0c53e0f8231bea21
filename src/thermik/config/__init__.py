"""thermik.config: typed, frozen config models and their loader (no torch import here)."""

from thermik.config.help import format_help, help_topic
from thermik.config.loader import ENV_PREFIX, ConfigError, dump_toml, load_config
from thermik.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    InferenceConfig,
    ModelConfig,
    MonitorConfig,
    OptimizerConfig,
    RolloutConfig,
    RunConfig,
    SamplingConfig,
    Section,
    SFTConfig,
    TrainerConfig,
)

__all__ = [
    "ENV_PREFIX",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "InferenceConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SamplingConfig",
    "Section",
    "TrainerConfig",
    "dump_toml",
    "format_help",
    "help_topic",
    "load_config",
]
