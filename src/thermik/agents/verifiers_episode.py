"""verifiers episodes as thermik trajectories, through the same capture endpoint an agent harness uses.

For a `verifiers:<taskset>` row (thermik.envs.verifiers_env) verifiers plays the episode in its own venv. It gets
a capture episode's base URL (`/episodes/<id>/v1`) as its client's; its training client renders each prompt itself
and posts token ids to `/episodes/<id>/inference/v1/generate`, which the capture records as token-exact samples
with the engine's own logprobs and weight versions (thermik.capture). A prompt that does not extend the episode's
tokens (a conversation rewritten by compaction or a sub-agent) starts a step-wise sample of its own. From the trace
verifiers returns, thermik keeps the reward (on the last sampled token), the stop condition, the messages, and the
branch count (`env_metrics["verifiers_branches"]`); an episode without a trace is an aborted, empty one.
docs/environments.md, "verifiers v1".
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from thermik.config.schema import SamplingConfig
from thermik.envs.base import Env, StepOutput
from thermik.envs.verifiers_env import BridgeError
from thermik.inference.base import InferenceEngine
from thermik.models.chat import ChatTokenizer
from thermik.rollout.step_wise import PrefixBreakError
from thermik.rollout.trajectory import Trajectory

MODEL_NAME = "thermik-policy"
STOP_REASONS = {"agent_completed": "stop", "max_turns": "max_turns", "max_output_tokens": "length",
                "max_input_tokens": "length", "max_total_tokens": "length"}  # fmt: skip
"""verifiers' stop conditions -> thermik's stop reasons; an unlisted condition is "stop", or "abort" with errors."""


class VerifiersEpisodeEnv(Env):
    """A verifiers row's env with `play` for the agent loop (rollout/agent_loop.py calls it instead of its own
    turns), as thermik.agents.harness_env does for a harness."""

    plays_episode: ClassVar[bool] = True

    def __init__(self, inner: Any) -> None:
        self.inner, self.tools = inner, inner.tools

    def step(self, action: str) -> StepOutput:
        return self.inner.step(action)

    async def play(self, engine: InferenceEngine, chat: ChatTokenizer, row: dict[str, Any], *args: Any) -> Trajectory:
        return await play(engine, self.inner, chat, row["prompt"], *args)

    async def aclose(self) -> None:
        await self.inner.aclose()


def playable(env: Env) -> Env:
    """`env` ready for the agent loop: a verifiers row's env gets its `play`; any other is returned as it is."""
    return VerifiersEpisodeEnv(env) if env.plays_episode else env


async def play(
    engine: InferenceEngine,
    env: Any,
    chat: ChatTokenizer,
    prompt: list[dict[str, Any]],
    limits: Any,
    sampling: SamplingConfig,
    group_id: int,
    seed: int | None,
) -> Trajectory:
    """One verifiers episode of the row whose env is `env` (a VerifiersEnv), as a Trajectory (see the module
    docstring)."""
    from thermik.agents.episode import capture_for, run_sampling  # capture serves over fastapi: extra `serve`
    from thermik.capture import EpisodeLimits

    capture = await capture_for(engine, chat, MODEL_NAME, limits.max_sequence_length)
    handle = capture.open(EpisodeLimits(sampling=run_sampling(sampling, seed)), group_id=group_id)
    client = {"base_url": handle.base_url, "model": handle.model,
              "renderer_model_name": str(chat.tokenizer.name_or_path)}  # fmt: skip
    params = {**run_sampling(sampling, seed), "max_tokens": limits.max_generate_length}
    start = time.perf_counter()
    try:
        episode = await env.arun(client, params)
    except BridgeError as exc:  # the verifiers side failed this episode (or is gone): it fails, the run goes on
        episode = {"traces": [], "errors": [str(exc)]}
    finally:
        captured = capture.close(handle.id)
    traces = [t for t in episode["traces"] if t["branches"]]
    if not traces or not captured.prompt_ids:  # nothing was sampled: an aborted episode that trains on nothing
        errors = episode["errors"] or ["no trace"]
        error = {"role": "user", "content": f"error: {'; '.join(errors)}"}
        traj = Trajectory(chat.encode_prompt(prompt), group_id=group_id, stop_reason="abort", messages=[*prompt, error])
        traj.env_metrics["env_error"] = 1.0
    else:
        traj = _from_trace(traces[0], captured)
        if limits.step_wise == "off" and traj.continuations:
            raise PrefixBreakError(
                f"a verifiers trace has {len(traj.samples)} trainable branches (its conversation was rewritten, e.g. "
                "by compaction); set rollout.step_wise = 'on-break' to train each as a sample (docs/algorithms.md)"
            )
    traj.timings["llm"] = time.perf_counter() - start  # model turns and the harness together
    return traj


def _from_trace(trace: dict[str, Any], traj: Trajectory) -> Trajectory:
    """The captured samples with what only the trace knows: the reward, the stop condition, the messages."""
    traj.messages = trace["messages"]
    traj.env_metrics["verifiers_branches"] = float(len(trace["branches"]))
    traj.add_final_reward(float(trace["reward"]))
    traj.stop_reason = STOP_REASONS.get(trace["stop_condition"] or "", "abort" if trace["errors"] else "stop")
    if trace["errors"]:
        traj.env_metrics["env_error"] = 1.0
    return traj
