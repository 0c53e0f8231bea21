"""Typed configuration: one frozen pydantic model per component.

Components are built from these models and never mutate them. Every field carries a
description so `thermik <cmd> --help` can list it with its default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from thermik.cpu.isa import check_bf16


def regex_checked(pattern: str) -> str:
    """`pattern` if it compiles as a Python regular expression, else a ValueError naming the problem."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern


def check_engine_precision(precision: str, device: str) -> None:
    """Refuse an `inference.precision` the device cannot run: bfloat16 on a CPU without bfloat16 arithmetic, and the
    packed-weight formats (thermik's C kernels, CPU-only) on any other device."""
    if precision == "bfloat16":
        check_bf16("inference.precision", precision, device)
    if precision in ("bf16-weights", "int8") and not device.startswith("cpu"):
        raise ValueError(
            f"inference.precision = {precision!r} packs the weights for thermik's CPU kernels; model.device is "
            f"{device!r}: set inference.precision = 'auto' (bfloat16 on a GPU that supports it), 'bfloat16' or "
            "'float32'"
        )


class Section(BaseModel):
    """Base for every config section: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


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
        if self.train_precision == "bf16-mixed":
            check_bf16("model.train_precision", self.train_precision, self.device)
        return self


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


class ReasoningGymConfig(Section):
    """`reasoning_gym:<task>` and `reasoning_gym:composite` environments (docs/environments.md)."""

    config: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the task's reasoning-gym config (e.g. max_terms = 3)."
    )
    weights: dict[str, float] = Field(
        default_factory=dict, description="reasoning_gym:composite: task name -> sampling weight (at least one)."
    )
    task_configs: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="reasoning_gym:composite: task name -> keyword arguments of its config."
    )
    system_prompt: str = Field(
        "default", description="System message: a name in reasoning_gym.utils.SYSTEM_PROMPTS, other text as it is, or "
        "empty for none."
    )  # fmt: skip
    extraction: Literal["tag", "full"] = Field(
        "tag", description="How the answer is read from the response: 'tag' (the last <answer_tag> block; none "
        "scores 0) or 'full' (the whole response, stripped)."
    )  # fmt: skip
    answer_tag: str = Field("answer", description="Tag name of extraction 'tag'.")


class OpenEnvConfig(Section):
    """OpenEnv environments: `openenv:pkg.mod:Class` in-process, `openenv+ws[s]://host:port` over its WebSocket."""

    action_class: str = Field(
        "", description="Action class 'pkg.mod:Class' of an environment that does not name its own: used when "
        "neither Environment[A, O, S] nor step()'s annotation names one and no OpenEnv app serves its /schema; one "
        "that contradicts what the environment or its server declares is refused."
    )  # fmt: skip
    ca_file: str = Field(
        "", description="PEM file of the certificate authorities an openenv+wss:// server is checked against; empty: "
        "the system's (SSL_CERT_FILE / SSL_CERT_DIR are honoured)."
    )  # fmt: skip
    action_field: str = Field(
        "", description="Action field the model's reply fills; empty: the action schema's single required field, or, "
        "when it has none or several, the reply is the action as a JSON object."
    )  # fmt: skip
    observation_field: str = Field(
        "", description="Observation field shown to the model as text; empty: all fields (but done, reward, "
        "metadata) as JSON."
    )  # fmt: skip
    observation_role: Literal["user", "tool"] = Field("user", description="Role of the observation messages.")
    reset: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of reset(); a row's extra_info.reset adds to them."
    )
    system_prompt: str = Field(
        "You act in an environment. Each user message is its observation; reply with your action only.",
        description="System message of the rows thermik synthesizes for an OpenEnv environment (one per reset seed).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Connect, reset and step timeout of a remote environment.")


class VerifiersConfig(Section):
    """verifiers v1 environments (`verifiers:<taskset id>`), run in a venv of their own (docs/environments.md)."""

    python: str = Field(
        "", description="Python of the verifiers venv; empty: $VERIFIERS_VENV/bin/python, else "
        "~/.cache/thermik/verifiers-venv/bin/python (where scripts/verifiers_venv.sh builds it)."
    )  # fmt: skip
    env: dict[str, Any] = Field(
        default_factory=dict, description="verifiers EnvConfig fields merged over thermik's defaults (the taskset id "
        "from env.name, agent.harness.id 'null', agent.runtime.type 'subprocess'), e.g. {taskset = {num_tasks = 8}}."
    )  # fmt: skip
    address: str = Field(
        "", description="A running verifiers env server (tcp://host:port) to drive; empty starts one for the run."
    )
    max_tasks: int = Field(100_000, ge=1, description="Most taskset tasks read to make the run's rows.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Wait this long for the env server to start.")


class RepoRepairConfig(Section):
    """`repo_repair`: fix bugs in Python repositories in a sandbox (docs/environments.md, "repo_repair")."""

    records: str = Field(
        "", description="A jsonl of SWE-bench records (with repo_path: the repository on disk) to train on instead of "
        "generated tasks; empty: generated tasks."
    )  # fmt: skip
    eval_records: str = Field("", description="The same for the held-out rows; empty: generated held-out tasks.")
    tasks_dir: str = Field("", description="Where generated tasks are written; empty: the thermik cache directory.")
    modules: int = Field(2, ge=1, le=5, description="Generated tasks: modules per package.")
    distractors: int = Field(0, ge=0, le=20, description="Generated tasks: extra functions from other families.")
    bugs: int = Field(1, ge=1, le=3, description="Generated tasks: injected bugs per task.")
    name_function: bool = Field(True, description="Generated tasks: the problem statement names the failing call.")
    scoring: Literal["all", "fraction"] = Field(
        "all", description="'all': 1 only if the agent finished and every FAIL_TO_PASS and PASS_TO_PASS test passes; "
        "'fraction': the fraction of them passing (after finish)."
    )  # fmt: skip
    mask_truncated: bool = Field(
        False, description="Episodes that end without finish (turn or context limit) train on nothing."
    )
    step_penalty: float = Field(0.0, ge=0, description="Subtracted from the reward per turn taken.")
    tools: Literal["mcp", "in-process"] = Field(
        "mcp", description="'mcp': the tools are served by an MCP server per episode; 'in-process': called directly."
    )
    command_timeout_s: float = Field(30.0, gt=0, description="Wall-clock limit of one sandbox command.")
    cpu_s: int = Field(30, ge=1, description="CPU seconds of one sandbox command (RLIMIT_CPU).")
    memory_mb: int = Field(2048, ge=64, description="Address space of each sandbox process (MiB).")
    processes: int = Field(64, ge=4, description="Most processes of one sandbox command.")
    max_output_chars: int = Field(4000, ge=200, description="Tool outputs longer than this keep their head and tail.")


class EnvConfig(Section):
    name: str = Field("calculator", description="Environment name from the registry or a 'pkg.mod:Class' path.")
    max_turns: int = Field(4, ge=1, description="Most assistant turns per episode.")
    render_tools: bool = Field(
        True, description="Render the environment's tool schemas into the prompt; off keeps tiny-model prompts short."
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Per tool-call timeout in seconds.")
    tool_latency_s: float = Field(0.0, ge=0, description="Artificial latency added by the calculator MCP server.")
    skyrl_gym_config: dict[str, Any] = Field(
        default_factory=dict, description="env_config passed to skyrl-gym environments (env names skyrl_gym:<name>)."
    )
    reasoning_gym: ReasoningGymConfig = Field(
        default_factory=ReasoningGymConfig, description="reasoning-gym tasks (env names reasoning_gym:<task>)."
    )
    openenv: OpenEnvConfig = Field(
        default_factory=OpenEnvConfig, description="OpenEnv environments (openenv:pkg.mod:Class, openenv+ws[s]://...)."
    )
    verifiers: VerifiersConfig = Field(
        default_factory=VerifiersConfig, description="verifiers v1 environments (env names verifiers:<taskset>)."
    )
    repo_repair: RepoRepairConfig = Field(
        default_factory=RepoRepairConfig, description="The repo_repair environment and its generated tasks."
    )
    tool_parser: Literal["hermes", "qwen3_coder", "llama3"] = Field(
        "hermes", description="Tool-call text format the model writes (thermik.tools.parsers.TOOL_PARSERS)."
    )
    tool_max_output_chars: int = Field(10_000, ge=1, description="Tool outputs are cut to this many characters.")
    mcp_servers: list[str] = Field(
        default_factory=list,
        description="MCP servers for the 'mcp' env: 'name=command args...' (stdio) or 'name=http://host:port/mcp'.",
    )
    mcp_max_servers: int = Field(4, ge=1, description="Most MCP servers one 'mcp' episode may use.")
    mcp_max_tools: int = Field(32, ge=1, description="Most tools one 'mcp' episode may expose to the model.")
    tool_groups: list[str] = Field(
        default_factory=list, description="Local tools for the 'mcp' env: 'pkg.mod:attr' of a ToolGroup or @tool."
    )
    tool_error_pattern: str | None = Field(
        None,
        description="A regular expression (Python `re`, searched in the result text): a tool result that matches "
        "counts as a failed call (a `tool_failures` count, an 'error: ' observation, never a successful call for "
        "the reward), for MCP servers that report errors as ordinary text instead of isError. E.g. '^(Error|ERROR):'.",
    )

    @field_validator("tool_error_pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        return v if v is None else regex_checked(v)


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


class RolloutConfig(Section):
    max_input_length: int = Field(
        0, ge=0, description="Longest prompt (tokens) accepted; longer rows are skipped and counted "
        "(docs/reliability.md, 'Every command ends with a verdict'). 0: max_sequence_length - max_generate_length."
    )  # fmt: skip
    max_generate_length: int = Field(64, ge=1, description="Most tokens sampled in one assistant turn.")
    max_sequence_length: int = Field(
        0, ge=0, description="Longest prompt+response; longer is overlong (masked). 0: the model's context window "
        "(config.json max_position_embeddings, tokenizer model_max_length: the smaller)."
    )  # fmt: skip
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling parameters for training.")
    step_wise: Literal["off", "on-break", "always"] = Field(
        "on-break", description="Training samples per episode (docs/algorithms.md, 'Step-wise trajectories'): 'off' "
        "(one sequence; an episode whose next prompt is not an exact extension of its tokens fails loudly), "
        "'on-break' (a new sample starts where the next prompt stops extending the tokens so far) or 'always' "
        "(every turn is its own sample)."
    )  # fmt: skip
    context: Literal["truncate-episode", "drop-oldest-observations", "summarise"] = Field(
        "truncate-episode", description="What happens when an episode outgrows its context: 'truncate-episode' "
        "(the episode stops at max_sequence_length, overlong), 'drop-oldest-observations' (when the next prompt "
        "would exceed max_input_length, the oldest tool results become context_placeholder) or 'summarise' (the "
        "policy writes a summary turn, trained like any sampled turn, that replaces the history). The last two "
        "start a new step-wise sample and need step_wise 'on-break' or 'always' (docs/algorithms.md)."
    )  # fmt: skip
    context_placeholder: str = Field(
        "[earlier output dropped]", min_length=1, description="Text replacing a dropped observation."
    )
    summary_request: str = Field(
        "Your context is full. Summarise the task and what you have found so far in a few lines; the conversation "
        "continues from your summary.",
        min_length=1,
        description="The user message that asks the policy for its summary (context 'summarise').",
    )

    @model_validator(mode="after")
    def _context_needs_step_wise(self) -> RolloutConfig:
        if self.context != "truncate-episode" and self.step_wise == "off":
            raise ValueError(
                f"rollout.context {self.context!r} rewrites the history, which breaks the token prefix: set "
                "rollout.step_wise 'on-break' (or 'always'), or rollout.context 'truncate-episode'"
            )
        return self


class FailuresConfig(Section):
    """Partial failures: a share above its limit warns once per kind, at the step it happens (docs/reliability.md)."""

    max_skipped_share: float = Field(
        0.1, ge=0, le=1, description="Share of a step's (or an evaluation's) problems that may be skipped (prompts "
        "longer than rollout.max_input_length; for `thermik sft`, conversations max_length leaves nothing to train "
        "on) before a warning."
    )  # fmt: skip
    max_failed_share: float = Field(
        0.5, ge=0, le=1, description="Share of a step's episodes that may fail (cut at rollout.max_sequence_length: "
        "overlong, their tokens not trained) before a warning."
    )  # fmt: skip
    stop: bool = Field(
        False, description="Stop the run (exit 1) at the first share above its limit instead of warning."
    )


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


AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opo", "maxrl", "gae"]
LossName = Literal[
    "ppo",
    "dual_clip",
    "gspo",
    "cispo",
    "sapo",
    "clip_cov",
    "kl_cov",
    "dppo",
    "dppo_kl",
    "ipo",
    "aipo",
    "importance_sampling",
    "cross_entropy",
    "custom",
]
ReductionName = Literal["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]


class AlgorithmConfig(Section):
    """The RL algorithm; every name is listed with its formula and paper in docs/algorithms.md."""

    advantage: AdvantageName = Field("grpo", description="Advantage estimator.")
    step_rewards: Literal["episode", "per-step"] = Field(
        "episode", description="Rewards of an episode's step-wise samples: 'episode' gives every sample the episode's "
        "return and groups advantages by episode; 'per-step' scores each sample by the environment rewards from its "
        "first turn to the episode's end (docs/algorithms.md, 'Step-wise trajectories')."
    )  # fmt: skip
    loss: LossName = Field("ppo", description="Policy loss; 'custom' loads algorithm.custom_loss.")
    custom_loss: str = Field("", description="Import path 'pkg.module:function' of the loss when loss = 'custom'.")
    reduction: ReductionName = Field("token_mean", description="Loss reduction over the mini-batch.")
    seq_norm_constant: float = Field(
        1024.0, gt=0, description="Divisor of each sequence's token sum for reduction seq_mean_token_sum_norm."
    )
    std_eps: float = Field(1e-6, gt=0, description="Added to a std (or mean, for maxrl) before dividing.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for reinforce_pp and gae.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    # policy-loss hyper-parameters (names shared with thermik.algorithms.losses.LossParams)
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO lower clip epsilon: ratio >= 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO upper clip epsilon: ratio <= 1 + clip_high.")
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound c: a token with A < 0 costs at most c|A|.")
    gspo_clip_low: float = Field(3e-4, ge=0, lt=1, description="GSPO lower clip on the sequence ratio.")
    gspo_clip_high: float = Field(4e-4, ge=0, description="GSPO upper clip on the sequence ratio.")
    cispo_clip_low: float = Field(1.0, ge=0, le=1, description="CISPO weight >= 1 - this (1 disables the bound).")
    cispo_clip_high: float = Field(4.0, ge=0, description="CISPO weight <= 1 + this.")
    sapo_tau_pos: float = Field(1.0, gt=0, description="SAPO gate temperature for tokens with A > 0.")
    sapo_tau_neg: float = Field(1.05, gt=0, description="SAPO gate temperature for tokens with A <= 0.")
    dppo_delta_low: float = Field(0.2, gt=0, description="DPPO bound on a probability (TV) or KL drop, A < 0.")
    dppo_delta_high: float = Field(0.2, gt=0, description="DPPO bound on a probability (TV) or KL rise, A > 0.")
    ratio_cap: float = Field(2.0, gt=0, description="Importance-ratio cap of the ipo and aipo losses.")
    clip_cov_ratio: float = Field(2e-4, ge=0, le=1, description="Clip-Cov: share of tokens whose gradient is cut.")
    clip_cov_lb: float = Field(1.0, description="Clip-Cov: lower covariance bound of eligible tokens.")
    clip_cov_ub: float = Field(5.0, description="Clip-Cov: upper covariance bound of eligible tokens.")
    kl_cov_ratio: float = Field(2e-4, ge=0, le=1, description="KL-Cov: share of tokens that get the KL penalty.")
    kl_cov_coef: float = Field(1.0, ge=0, description="KL-Cov: weight of |logp - old_logp| on those tokens.")
    # KL to a reference policy
    kl_coef: float = Field(0.0, ge=0, description="KL weight (initial value when adaptive); 0 disables KL.")
    kl_estimator: Literal["k1", "k2", "k3", "abs"] = Field("k3", description="Per-token KL estimator.")
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="KL as a loss term, or subtracted from the token rewards before advantages."
    )
    kl_controller: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed or adaptive (Ziegler) KL weight.")
    kl_target: float = Field(0.1, gt=0, description="Adaptive KL: target KL per token.")
    kl_horizon: int = Field(10000, ge=1, description="Adaptive KL: horizon in samples.")
    ref_update: Literal["frozen", "copy", "ema"] = Field(
        "frozen", description="Reference policy: frozen at the start, or refreshed every ref_update_every steps."
    )
    ref_update_every: int = Field(0, ge=0, description="Refresh the reference every k RL steps (copy or ema).")
    ref_ema_alpha: float = Field(0.1, gt=0, le=1, description="EMA refresh: ref <- (1 - alpha) ref + alpha policy.")
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus.")
    # on-policy distillation (docs/algorithms.md)
    teacher: str = Field(
        "", description="On-policy distillation: a local HF model directory (a frozen copy in the trainer's process) "
        "or the root 'http://host:port' of an OpenAI-compatible server whose /v1/completions returns prompt_logprobs "
        "for token ids (`thermik inference`, vLLM); it must share the student's tokenizer. Empty: off."
    )  # fmt: skip
    teacher_mode: Literal["distill", "combined"] = Field(
        "distill", description="'distill': the advantage of each sampled token is -teacher_coef * (logp - "
        "teacher_logp) (pure distillation, no environment reward); 'combined': that term is added to the "
        "environment reward's advantage."
    )  # fmt: skip
    teacher_coef: float = Field(1.0, gt=0, description="Weight of the per-token reverse KL to the teacher.")
    teacher_model: str = Field("", description="Server teacher: model name to request; empty asks /v1/models.")
    teacher_api_key: str = Field("", description="Server teacher: bearer API key; empty sends none.")
    teacher_timeout_s: float = Field(120.0, gt=0, description="Server teacher: per-request timeout in seconds.")
    teacher_concurrency: int = Field(8, ge=1, description="Server teacher: requests in flight at once.")
    # off-policy correction between rollout and trainer logprobs
    off_policy: Literal["none", "tis", "mis"] = Field(
        "none", description="Rollout/trainer mismatch correction: truncated or masked importance sampling."
    )
    off_policy_level: Literal["token", "sequence"] = Field("token", description="Importance ratio per token/sequence.")
    off_policy_form: Literal["geometric", "product"] = Field(
        "geometric", description="Sequence ratio: geometric mean or product of the token ratios."
    )
    tis_cap: float = Field(2.0, gt=0, description="TIS: weight = min(ratio, tis_cap).")
    mis_low: float = Field(0.5, ge=0, le=1, description="MIS: drop tokens/sequences with ratio below this.")
    mis_high: float = Field(2.0, ge=1, description="MIS: drop tokens/sequences with ratio above this.")
    # batch shaping
    dynamic_sampling: Literal["none", "filter", "replace"] = Field(
        "none", description="DAPO dynamic sampling: drop zero-variance groups, then resample (filter) or duplicate."
    )
    dynamic_sampling_max_rounds: int = Field(3, ge=0, description="Filter: most extra rollout rounds per step.")
    zero_variance_mask: bool = Field(False, description="Zero the loss mask of samples in zero-variance groups.")
    overlong_buffer: int = Field(0, ge=0, description="DAPO soft overlong penalty over the last k tokens; 0 off.")
    overlong_max_length: int = Field(
        0, ge=0, description="Response length where the overlong penalty is full; 0 = rollout.max_generate_length."
    )
    overlong_penalty_factor: float = Field(1.0, ge=0, description="Largest overlong penalty.")
    length_penalty_coef: float = Field(0.0, ge=0, description="Weight of the Kimi k1.5 length reward; 0 off.")
    # health
    halt_on_degenerate: bool = Field(False, description="Stop (not just warn) when the importance ratio is stuck.")
    degenerate_patience: int = Field(10, ge=1, description="Steps of ratio std ~ 0 with lr > 0 before acting.")
    max_nonfinite_steps: int = Field(3, ge=1, description="Fail after this many NaN/inf optimizer steps in a row.")
    on_nonfinite: Literal["skip", "halt"] = Field(
        "skip",
        description="NaN/inf in a reward, a rollout logprob (the step's update), the loss or a gradient (an "
        "optimizer step): 'skip' it (the run fails after max_nonfinite_steps in a row) or 'halt' at once. The "
        "message names the culprit; metrics health/nonfinite_rewards|rollout_logprobs, health/skipped_update.",
    )

    @model_validator(mode="after")
    def _custom_loss_named(self) -> AlgorithmConfig:
        if (self.loss == "custom") != bool(self.custom_loss):
            raise ValueError("algorithm.custom_loss must be set exactly when algorithm.loss = 'custom'")
        return self


class OptimizerConfig(Section):
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps, then constant (or decaying: decay_steps).")
    decay_steps: int = Field(
        0, ge=0, description="After warm-up, decay the rate linearly to final_lr_ratio * lr at this step, then hold it "
        "(e.g. an SFT run's max_steps); 0 keeps it constant."
    )  # fmt: skip
    final_lr_ratio: float = Field(0.1, ge=0, le=1, description="With decay_steps: the rate at its end, relative to lr.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")


class TrainerConfig(Section):
    steps: int = Field(80, ge=1, description="Number of RL steps.")
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per step.")
    group_size: int = Field(8, ge=1, description="Samples per prompt (a group).")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per RL step (the batch is split in this many).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward; does not change gradients.")
    shared_prefix: bool = Field(
        True,
        description="Training forward runs each group's shared prompt once (Qwen2/Qwen3/Llama; same logprobs and "
        "gradients up to float rounding, less compute when prompts are long).",
    )
    packing: bool = Field(
        True,
        description="Where the shared-prompt forward does not apply (shared_prefix off, prompts not shared, another "
        "architecture), pack a micro-batch's rows together, each attending only to itself, when that takes fewer "
        "rows than padding (same logprobs up to float rounding; training/packing.py).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass: far less activation memory "
        "for about a third more compute per step (long sequences, large micro-batches; training/speed.py).",
    )
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (dynamic shapes): fuses the element-wise work; pays on a GPU at "
        "RL sizes, the first steps take the compile time (training/speed.py).",
    )
    max_off_policy_steps: int = Field(
        0,
        ge=0,
        description="Asynchronous training: a sample of weight version v trains the policy of version s only if "
        "s - v <= this; 0 is synchronous, 1 one-step-off.",
    )
    stale_groups: Literal["drop", "cancel"] = Field(
        "drop",
        description="Async: in-flight groups that can no longer meet the bound are finished and dropped, or cancelled.",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer.")


class CriticConfig(Section):
    """The value model of PPO with GAE (algorithm.advantage = 'gae'): a copy of the policy's backbone + a linear
    head, trained with the clipped value loss by its own optimizer (training/critic.py)."""

    value_clip: float = Field(
        0.2, ge=0, description="Clipped value loss: a value moves at most this far from its old estimate; 0 = no clip."
    )
    mini_batches: int = Field(1, ge=1, description="Critic optimizer steps per RL step (the batch is split).")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=1e-3), description="The critic's own AdamW optimizer."
    )


class LoRAConfig(Section):
    """LoRA adapters on the policy (Hu et al. 2021) via PEFT; the engine receives the merged weights."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of all policy weights.")
    rank: int = Field(8, ge=1, description="LoRA rank r.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input during training.")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
        description="Names of the Linear modules that get adapters.",
    )
    modules_to_save: tuple[str, ...] = Field(
        (),
        description="Modules trained in full beside the adapters (PEFT modules_to_save; a name matches every "
        "module whose name ends with it), e.g. ('norm',) for every RMSNorm weight: with frozen norms and a tied "
        "output head a small model cannot sharpen its logits (LongLoRA, Chen et al. 2023, trains norms too).",
    )


DEFAULT_RUBRIC = (
    "You grade an assistant's answer. Conversation: [{prompt}] Answer: [{response}] Reference answer: "
    "[{ground_truth}] Give a score from 0 (wrong) to 10 (fully correct). Reply with one line: Score: <number>"
)


class JudgeConfig(Section):
    """An LLM judge behind an OpenAI-compatible chat endpoint (rollout/judge.py; docs/algorithms.md)."""

    base_url: str = Field("", description="Server root 'http://host:port' (thermik inference, vLLM, any OpenAI-"
                          "compatible API; /v1/chat/completions is appended); empty: no judge.")  # fmt: skip
    model: str = Field("", description="Model name sent with each request; empty: the first one /v1/models lists.")
    api_key: str = Field("", description="Bearer API key; empty sends none.")
    weight: float = Field(1.0, description="Weight of the judge's score in the episode's return.")
    template: str = Field(
        DEFAULT_RUBRIC, description="Rubric prompt (a Python format string) with {prompt} and {response} (the "
        "episode's messages as 'role: content' lines) and {ground_truth} (the row's reward_spec.ground_truth)."
    )  # fmt: skip
    score_pattern: str = Field(
        "(?i)score *[:=] *(-?[0-9]+(?:[.][0-9]+)?)", description="Regular expression whose group 1 (else whole "
        "match) is the score in the judge's reply; the first match counts."
    )  # fmt: skip
    max_score: float = Field(10.0, gt=0, description="The score is divided by this; a score outside [0, max] fails.")
    max_tokens: int = Field(64, ge=1, description="Most tokens of the judge's reply.")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature.")
    timeout_s: float = Field(30.0, gt=0, description="Per-request timeout in seconds.")
    retries: int = Field(2, ge=0, description="Retries after a timeout, a connection error, 408, 429 or 5xx.")
    retry_backoff_s: float = Field(0.5, ge=0, description="Wait before the first retry, doubled for each next one.")
    concurrency: int = Field(8, ge=1, description="Requests in flight at once.")
    failure_value: float = Field(
        0.0, description="Score of an episode whose judging failed (timeout, server down, error, no score in the "
        "reply); each failure is counted in judge/failures and judge/<cause>, the first is printed. A group whose "
        "every episode failed is not trained (rewards/unscored_groups)."
    )  # fmt: skip

    @field_validator("score_pattern")
    @classmethod
    def _pattern_compiles(cls, v: str) -> str:
        return regex_checked(v)

    @field_validator("template")
    @classmethod
    def _template_fields(cls, v: str) -> str:
        try:
            v.format(prompt="", response="", ground_truth="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                "the template may use only {prompt}, {response} and {ground_truth} (double other braces): "
                f"{exc!r}"
            ) from None
        return v


class RewardModelConfig(Section):
    """A reward model: an HF sequence-classification model with one label (rollout/reward_model.py)."""

    path: str = Field("", description="Local HF model directory (AutoModelForSequenceClassification); empty: none.")
    weight: float = Field(1.0, description="Weight of its score in the episode's return.")
    normalize: Literal["none", "sigmoid"] = Field("none", description="Score = the logit, or its sigmoid.")
    max_length: int = Field(1024, ge=8, description="Inputs are cut to this many tokens from the left.")
    batch_size: int = Field(8, ge=1, description="Episodes per forward.")


class RewardsConfig(Section):
    """Model-based rewards composed with the environment's: R = env_weight * R_env + sum weight_j * score_j."""

    env_weight: float = Field(1.0, description="Weight of the environment's (rule) reward.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="LLM judge with a rubric.")
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig, description="Reward model.")
    max_unscored_steps: int = Field(
        0, ge=0, description="Stop the run after this many steps in a row in which the judge or reward model scored "
        "no group (groups a source answered none of are never trained); 0: never stop early (a run in which a source "
        "never answered still fails at its end)."
    )  # fmt: skip


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save a checkpoint every k steps; 0 saves only at the end.")
    keep: int = Field(2, ge=1, description="Most complete checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from checkpoints/latest when the run directory has one.")
    on_write_error: Literal["stop", "continue"] = Field(
        "stop",
        description="A checkpoint that cannot be written (disk full, I/O error): 'stop' the run with a message, or "
        "'continue' training without it (a warning). Either way the previous checkpoint stays and `latest` names it.",
    )


class GuardsConfig(Section):
    """Consistency guards between engines and trainer in every run mode (assembly/guards.py; the parity probe needs
    the trainer beside the engine: not in a split run); each stops the run naming itself."""

    weight_checksum: bool = Field(
        True,
        description="After every weight sync, compare an exact checksum of each engine tensor with the tensor the "
        "trainer sent (one pass over the weights); a mismatch stops the run naming the tensors.",
    )
    parity_every: int = Field(
        0,
        ge=0,
        description="Every k steps (0: off), sample parity_tokens tokens after a fixed probe prompt with the engine, "
        "score them with the trainer, and stop the run when the logprobs differ by more than parity_max_abs_diff.",
    )
    parity_tokens: int = Field(16, ge=1, description="Tokens the parity probe samples and compares.")
    parity_max_abs_diff: float = Field(
        0.1, gt=0, description="Largest engine-vs-trainer logprob difference the parity probe accepts."
    )


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate on the held-out set every k steps; 0 only before and after.")
    size: int = Field(200, ge=1, description="Held-out problems evaluated.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature for evaluation; 0 is greedy.")
    k: int = Field(1, ge=1, description="Samples per problem: pass@1, pass@k and avg@k (docs/evaluation.md).")
    before: bool = Field(True, description="Evaluate before training for the before/after table.")


class MonitorConfig(Section):
    progress: bool = Field(True, description="Show a rich progress bar.")
    save_trajectories_every: int = Field(10, ge=0, description="Dump sampled trajectories every k steps; 0 never.")
    tensorboard: bool = Field(False, description="Also write tensorboard events.")
    wandb_project: str = Field("", description="Also log to this wandb project when set.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="wandb mode: offline writes run_dir/wandb/ only (upload later with `wandb sync`)."
    )


class DistributedConfig(Section):
    """Scale-out on Ray (optional extra `distributed`): data-parallel trainer workers and engine actors."""

    enabled: bool = Field(False, description="Train on Ray with the workers and engines below (thermik.distributed).")
    num_trainers: int = Field(1, ge=1, description="Data-parallel trainer workers (Ray actors in one torch group).")
    num_engines: int = Field(
        1, ge=0, description="Inference engine actors (each an embedded engine); 0 when generation runs elsewhere."
    )
    placement: Literal["colocated", "disaggregated"] = Field(
        "disaggregated",
        description="colocated: engine i shares trainer i's placement bundle (devices); "
        "disaggregated: every actor gets its own bundle.",
    )
    strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="Data-parallel wrapper of the policy: DistributedDataParallel or FSDP2 (fully_shard)."
    )
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend: gloo (CPU) or nccl (GPU).")
    weight_sync: Literal["collective", "files"] = Field(
        "collective",
        description="Trainer -> engine weights: a broadcast in a process group with the engines, "
        "or safetensors files in weights_dir plus update_weights(path).",
    )
    weights_dir: str = Field(
        "", description="Where weight_sync=files writes safetensors (shared by all nodes); empty: <run_dir>/weights."
    )
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved per trainer worker and per engine actor.")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPUs reserved per trainer worker and per engine actor.")
    engine_max_restarts: int = Field(3, ge=0, description="Times Ray restarts a dead engine actor before giving up.")
    timeout_s: float = Field(300.0, gt=0, description="torch.distributed collective timeout in seconds.")
    ray_address: str = Field(
        "", description="Ray cluster to join ('auto' after `ray start`); empty starts a local one in this process."
    )

    @model_validator(mode="after")
    def _collective_fits_devices(self) -> DistributedConfig:
        if self.backend == "nccl" and self.placement == "colocated" and self.weight_sync == "collective":
            raise ValueError(
                "distributed: NCCL cannot broadcast between two processes on one GPU; with placement='colocated' "
                "and backend='nccl' set weight_sync='files'"
            )
        if self.backend == "nccl" and self.gpus_per_actor <= 0:
            raise ValueError("distributed.backend='nccl' needs GPUs: set distributed.gpus_per_actor > 0")
        return self


class SplitConfig(Section):
    """`thermik trainer` + `thermik orchestrator`: the file protocol between them (docs/process_split.md)."""

    wait_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Most seconds the trainer waits for a rollout batch, or the orchestrator for weights, before "
        "stopping with an error that names the other process; cover one step of the other side.",
    )
    poll_interval_s: float = Field(0.2, gt=0, description="Seconds between two looks for a new file.")


def check_lengths(r: RolloutConfig) -> None:
    """The explicit rollout lengths leave room for a prompt and one reply (0s are resolved from the model later)."""
    if r.max_sequence_length and r.max_input_length + r.max_generate_length > r.max_sequence_length:
        raise ValueError(
            "rollout.max_sequence_length must be >= rollout.max_input_length + rollout.max_generate_length "
            f"({r.max_sequence_length} < {r.max_input_length} + {r.max_generate_length})"
        )
    if r.max_sequence_length and r.max_sequence_length <= r.max_generate_length:
        raise ValueError(
            f"rollout.max_sequence_length ({r.max_sequence_length}) leaves no room for a prompt beside "
            f"rollout.max_generate_length ({r.max_generate_length})"
        )


class RunConfig(Section):
    """`thermik rl`: GRPO on an environment."""

    name: str = Field("calculator", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed.")
    record: bool = Field(
        False,
        description="Local mode: write each step's training batch, RNG state and weight checksums to records/ "
        "(`thermik rl --record`); `thermik replay RUN --from-step S` re-runs those updates (runs/record.py). Ray "
        "and split runs refuse it.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference engine.")
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Agent loop limits and sampling.")
    data: DataConfig = Field(default_factory=DataConfig, description="Datasets.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (used by advantage 'gae').")
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters on the policy.")
    rewards: RewardsConfig = Field(
        default_factory=RewardsConfig, description="LLM judge and reward model, weighted with the env's reward."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    guards: GuardsConfig = Field(default_factory=GuardsConfig, description="Engine/trainer consistency guards.")
    failures: FailuresConfig = Field(default_factory=FailuresConfig, description="Partial failures: warn or stop.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Metrics and progress.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="Ray scale-out (thermik.distributed.launch)."
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="`thermik inference @ this.toml`: the server the orchestrator uses."
    )
    split: SplitConfig = Field(default_factory=SplitConfig, description="`thermik trainer` / `thermik orchestrator`.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _lengths_fit(self) -> RunConfig:
        check_lengths(self.rollout)
        if self.trainer.max_off_policy_steps and self.algorithm.dynamic_sampling != "none":
            raise ValueError(
                "algorithm.dynamic_sampling works with synchronous training only; set it to 'none' or "
                "trainer.max_off_policy_steps to 0"
            )
        if self.distributed.enabled:
            self._check_ray_loop()
        check_engine_precision(self.inference.precision, self.model.device)
        return self

    def _check_ray_loop(self) -> None:
        """What `thermik rl` on Ray (thermik.runs.ray) cannot run, named with the way out."""
        if self.lora.enabled and self.distributed.strategy == "fsdp2":
            raise ValueError(
                "lora.enabled with distributed.strategy='fsdp2': the engines get the adapters merged into full "
                "weights, which FSDP2's sharded parameters do not give; use distributed.strategy='ddp' with LoRA "
                "(its adapters are small) or turn lora.enabled off"
            )


class PolicyConfig(Section):
    """`thermik eval --policy.base_url URL`: an OpenAI-compatible chat endpoint as the policy under evaluation."""

    base_url: str = Field(
        "", description="Chat-completions endpoint (.../v1) evaluated on the same envs; empty: model.path in-process."
    )
    model: str = Field("", description="Model name sent to the endpoint; empty: the first one /v1/models lists.")
    api_key: str = Field("EMPTY", description="API key sent as 'Authorization: Bearer'.")
    max_concurrency: int = Field(16, ge=1, description="Most requests in flight at once.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout in seconds.")


class EvalRunConfig(RunConfig):
    """`thermik eval`: model.path, a run's checkpoints (`steps`) or a chat endpoint (`policy`); `--k N` = `--eval.k N`.

    Results go to the run directory <output_dir>/<name> (docs/evaluation.md)."""

    steps: str = Field(
        "",
        description="Evaluate checkpoints of the run in `checkpoints_of`: 'all' or step numbers '10,20'; writes "
        "eval_steps.md/.csv and plots/eval_vs_step.png.",
    )
    checkpoints_of: str = Field("", description="Run directory whose checkpoints/step_<n> `steps` evaluates.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="An API model as the policy.")

    @model_validator(mode="after")
    def _steps_need_a_run(self) -> EvalRunConfig:
        if self.steps and self.steps != "all" and not re.fullmatch(r"\d+(,\d+)*", self.steps):
            raise ValueError(f"steps: 'all' or step numbers like '10,20', got {self.steps!r}")
        if self.steps and not self.checkpoints_of:
            raise ValueError("steps: set checkpoints_of to the run directory whose checkpoints to evaluate")
        if self.steps and self.policy.base_url:
            raise ValueError("steps and policy.base_url exclude each other: checkpoints are evaluated in-process")
        return self


Role = Literal["system", "user", "assistant", "tool"]


class SFTConfig(Section):
    """`thermik sft`: supervised fine-tuning on chat conversations (docs/sft.md)."""

    name: str = Field("sft", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent of run directories.")
    seed: int = Field(0, description="Global seed (weights of new adapters, the order of the training rows).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to fine-tune.")
    train_path: str = Field(
        "", description="Conversations: .jsonl, .parquet, .arrow or a `datasets` save_to_disk directory of "
        "{'messages': [...]} rows (from `thermik synthesize`) and/or {'prompt', 'completion'} rows (strings or message "
        "lists); with columns.prompt set, that column and columns.answer (the completion) of any schema (docs/sft.md)."
    )  # fmt: skip
    train_split: str = Field("train", description="Split read from a save_to_disk DatasetDict for train_path.")
    eval_split: str = Field("test", description="Split read from a save_to_disk DatasetDict for eval_path.")
    columns: DataColumnsConfig = Field(
        default_factory=DataColumnsConfig, description="Column mapping for datasets in another schema (as in "
        "`thermik rl`; for train_path, columns.answer is the completion)."
    )  # fmt: skip
    train_roles: tuple[Role, ...] = Field(
        ("assistant",), min_length=1,
        description="Roles whose messages carry loss: 'assistant' trains every assistant turn (content and end of "
        "turn); 'system', 'user', 'tool' add the content of those messages (their template tokens never train).",
    )  # fmt: skip
    env: EnvConfig = Field(default_factory=EnvConfig, description="Environment used for the held-out check.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Limits for the held-out check.")
    max_steps: int = Field(600, ge=1, description="Most optimizer steps.")
    batch_size: int = Field(32, ge=1, description="Conversations per optimizer step.")
    micro_batch_tokens: int = Field(
        0, ge=0, description="Forward and backward in micro-batches of at most this many padded tokens (count x "
        "longest; gradients accumulate: the step is the same). 0 picks it from the model's shape so that a "
        "micro-batch's activations take about 1 GiB (docs/sft.md)."
    )  # fmt: skip
    max_length: int = Field(
        0, ge=0, description="Conversations are truncated to this many tokens; 0: the longest conversation's length, "
        "at most the model's context window (docs/sft.md)."
    )  # fmt: skip
    packing: bool = Field(
        True, description="Pack the conversations of a batch into shared rows, each attending only to itself (same "
        "per-token loss as padding, less compute on mixed lengths; docs/sft.md)."
    )  # fmt: skip
    pack_length: int = Field(0, ge=0, description="Tokens per packed row; 0 uses max_length.")
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=3e-3, warmup_steps=20), description="Optimizer."
    )
    lora: LoRAConfig = Field(default_factory=LoRAConfig, description="LoRA adapters (the options of `thermik rl`).")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints every k steps; a restarted run resumes from the "
        "newest one (weights, optimizer, RNG, schedule and data position: the same run bit for bit)."
    )  # fmt: skip
    eval_every: int = Field(50, ge=0, description="Check held-out success every k steps; 0 disables the check.")
    eval_size: int = Field(64, ge=1, description="Held-out problems per check.")
    eval_path: str = Field(
        "", description="Held-out rows, read as `thermik rl` reads data.eval_path (.jsonl, .parquet, .arrow or a "
        "save_to_disk directory; columns); empty synthesizes env.name's eval split."
    )  # fmt: skip
    eval_temperature: float = Field(1.0, ge=0, description="Sampling temperature of the held-out check.")
    stop_at: float = Field(1.1, description="Stop once the held-out stop_metric reaches this; > 1 never stops.")
    stop_metric: Literal["success", "reward"] = Field("success", description="Held-out metric compared with stop_at.")
    min_steps: int = Field(0, ge=0, description="Held-out checks (and so early stops) start at this step.")
    eval_every_step_from: float = Field(
        1.1, description="Once a held-out check reaches this (stop_metric), check after every step: a metric that "
        "climbs fast is then stopped close to stop_at (docs/sft.md); > 1 keeps eval_every."
    )  # fmt: skip
    stop_window: int = Field(
        1, ge=1, description="Stop once the mean of the last k held-out checks (all of them while fewer have run) "
        "reaches stop_at: k > 1 keeps one lucky sample from stopping the run (docs/sft.md)."
    )  # fmt: skip
    progress: bool = Field(True, description="Show a rich progress bar.")
    failures: FailuresConfig = Field(default_factory=FailuresConfig, description="Partial failures: warn or stop.")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


class ServeConfig(Section):
    """`thermik inference`: an OpenAI-compatible server over the embedded engine."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Model to serve.")
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="Engine (backend must be embedded)."
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP server.")

    @model_validator(mode="after")
    def _embedded_only(self) -> ServeConfig:
        if self.inference.backend != "embedded":
            raise ValueError("inference.backend must be 'embedded' for `thermik inference` (it serves a local model)")
        check_engine_precision(self.inference.precision, self.model.device)
        return self
