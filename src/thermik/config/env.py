"""Config sections of the environment and of each environment source."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from thermik.config.base import Section, regex_checked


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
        True, description="Render the environment's tool schemas (or an agent harness's) into the prompt; off keeps "
        "tiny-model prompts short."
    )  # fmt: skip
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
