"""Names vulture cannot see used (tests/test_dead_code.py): each is reached by a string, a framework or a library.

Keep this list short: a name belongs here only with the reason it is alive.
"""

# ruff: noqa: F821, B018

# Built by name from a registry string ("thermik.tasks.code.env:CodeEnv", PREFIXED_SOURCES in envs/registry.py).
CodeEnv
GSM8KEnv
MathFeedbackEnv
RepoRepairEnv
SearchEnv
Text2SQLEnv
openenv_env_class
remote_env_class
secure_env_class
reasoning_gym_env_class
skyrl_gym_env_class
verifiers_env_class

# repo_repair's tools, called by name (getattr) from a model's tool call (tasks/repo_repair/tools.py).
bash
read_file
edit_file
run_tests

# OpenAI request fields accepted for compatibility and ignored (inference/server/protocol.py, generate.py).
_.frequency_penalty
_.presence_penalty
_.logit_bias
_.parallel_tool_calls
_.response_format
_.echo
_.skip_special_tokens

# Attributes set on other libraries' objects, read by those libraries.
_.HF_DATASETS_OFFLINE
_.HF_HUB_OFFLINE
_.rootRank
_.is_quantized
_.pre_tokenizer
_.truncation_side
_.__class__

# Holds the loaded C library so its functions stay valid (cpu/kernels.py).
_._lib

# uvicorn reads it to stop the capture server (capture/registry.py).
_.should_exit

# The capture API's hand-off to a harness: base URL, key and model as one dict (docs/capture.md).
_.client_config
