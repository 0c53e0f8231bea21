"""Config sections of the datasets: files, column mappings and synthesis."""

from __future__ import annotations

from pydantic import Field

from thermik.config.base import Section


class LLMGeneratorConfig(Section):
    """`thermik synthesize --llm-base-url ...`: rows written by a model behind an OpenAI-compatible endpoint."""

    base_url: str = Field("", description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field("", description="Model name sent with each request.")
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key ('EMPTY' if unset)."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the generator model.")
    max_tokens: int = Field(512, ge=1, description="Most tokens per reply.")
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout in seconds.")
    concurrency: int = Field(4, ge=1, description="Requests in flight at once.")
    examples: int = Field(3, ge=0, description="Rule-generated rows shown to the model as examples.")
    max_requests_per_row: int = Field(4, ge=1, description="Give up after this many requests per wanted row.")


class DataColumnsConfig(Section):
    """Maps a dataset of another schema onto thermik rows (docs/environments.md, "Datasets on disk")."""

    prompt: str = Field(
        "", description="Column holding the prompt: a string (the user message) or a list of chat messages. Empty: the "
        "files already hold thermik rows (data_source, env_class, prompt, reward_spec, extra_info)."
    )  # fmt: skip
    answer: str = Field("", description="Column whose value becomes reward_spec.ground_truth; empty: none.")
    system_prompt: str = Field("", description="A system message put before every mapped prompt; empty: none.")
    data_source: str = Field("", description="The rows' data_source; empty: the file or directory name.")


class DataConfig(Section):
    train_path: str = Field(
        "", description="Training dataset: .jsonl, .parquet, .arrow or a `datasets` save_to_disk directory; empty "
        "means synthesize."
    )  # fmt: skip
    eval_path: str = Field("", description="Held-out dataset (same formats as train_path); empty means synthesize.")
    train_split: str = Field("train", description="Split read from a save_to_disk DatasetDict for train_path.")
    eval_split: str = Field("test", description="Split read from a save_to_disk DatasetDict for eval_path.")
    columns: DataColumnsConfig = Field(
        default_factory=DataColumnsConfig, description="Column mapping for datasets in another schema."
    )
    synthetic_train_size: int = Field(2000, ge=0, description="Rows synthesized when train_path is empty.")
    synthetic_eval_size: int = Field(200, ge=0, description="Rows synthesized when eval_path is empty.")
    seed: int = Field(0, description="Seed for synthesis and shuffling.")
