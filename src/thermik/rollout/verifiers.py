"""verifiers episodes as thermik trajectories: serve the engine token-in, let verifiers play, convert the trace.

For a `verifiers:<taskset>` row (thermik.envs.verifiers) the agent loop hands the episode to `play`: this process
serves its engine on loopback with thermik's inference app (`/inference/v1/generate`, verifiers' training-client
wire format), verifiers plays the episode in its own venv and calls that endpoint for every model turn, and the
trace it returns (token ids, sampled mask, logprobs, reward) becomes a Trajectory. Exact-prefix check: every
sampled span of the trace, with every token before it, must be exactly a prompt the endpoint received plus the
completion it returned; the engine's own logprobs and weight versions are then kept per token. A trace that fails
the check keeps its tokens with the loss mask zeroed (`env_metrics["prefix_mismatch"]`); an episode without a
trace is an aborted, empty one. docs/environments.md, "verifiers v1".
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from thermik.config.schema import SamplingConfig
from thermik.data.chat_tokenizer import ChatTokenizer
from thermik.envs.verifiers import BridgeError, VerifiersEnv
from thermik.inference.base import Generation, InferenceEngine
from thermik.rollout.invariants import check_trajectory
from thermik.rollout.trajectory import Trajectory

MODEL_NAME = "thermik-policy"
STOP_REASONS = {"agent_completed": "stop", "max_turns": "max_turns", "max_output_tokens": "length",
                "max_input_tokens": "length", "max_total_tokens": "length"}  # fmt: skip
"""verifiers' stop conditions -> thermik's stop reasons; an unlisted condition is "stop", or "abort" with errors."""


@dataclass
class Endpoint:
    """The engine served on loopback; `sampled` maps prompt + completion ids to the engine's (logprobs, versions)."""

    base_url: str
    server: Any
    sampled: dict[tuple[int, ...], tuple[list[float], list[int]]] = field(default_factory=dict)

    def record(self, prompt_ids: list[int], gen: Generation) -> None:
        versions = list(gen.weight_versions) or [gen.weight_version] * len(gen.token_ids)
        self.sampled[(*prompt_ids, *gen.token_ids)] = (list(gen.logprobs), versions)


_ENDPOINTS: dict[tuple[int, int], Endpoint] = {}


async def endpoint_for(engine: InferenceEngine, chat: ChatTokenizer, max_model_len: int) -> Endpoint:
    """This engine's endpoint in this event loop, started on first use (the loop's end stops it)."""
    key = (id(engine), id(asyncio.get_running_loop()))
    if key not in _ENDPOINTS:
        try:
            import uvicorn

            from thermik.inference.server.app import build_app
        except ImportError as exc:
            raise ValueError(
                f"verifiers environments call the engine over HTTP ({exc}); install `pip install 'thermik[serve]'`"
            ) from exc
        endpoint = Endpoint("", None)
        app = build_app(engine, chat.tokenizer, MODEL_NAME, max_model_len=max_model_len, on_generate=endpoint.record)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
        task = asyncio.get_running_loop().create_task(server.serve())
        while not server.started:
            if task.done():
                task.result()  # raises why the server could not start
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        endpoint.base_url, endpoint.server = f"http://127.0.0.1:{port}", (server, task)
        _ENDPOINTS[key] = endpoint
    return _ENDPOINTS[key]


async def play(
    engine: InferenceEngine,
    env: VerifiersEnv,
    chat: ChatTokenizer,
    prompt: list[dict[str, Any]],
    limits: Any,
    sampling: SamplingConfig,
    group_id: int,
    seed: int | None,
) -> Trajectory:
    """One verifiers episode of the row whose env is `env`, as a Trajectory (see the module docstring)."""
    endpoint = await endpoint_for(engine, chat, limits.max_sequence_length)
    client = {"base_url": f"{endpoint.base_url}/v1", "model": MODEL_NAME,
              "renderer_model_name": str(chat.tokenizer.name_or_path)}  # fmt: skip
    params = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
              "min_p": sampling.min_p, "max_tokens": limits.max_generate_length,
              **({} if seed is None else {"seed": seed})}  # fmt: skip
    start = time.perf_counter()
    try:
        episode = await env.arun(client, params)
    except BridgeError as exc:  # the verifiers side failed this episode (or is gone): it fails, the run goes on
        episode = {"traces": [], "errors": [str(exc)]}
    elapsed = time.perf_counter() - start
    traces = [t for t in episode["traces"] if t["branches"]]
    if not traces:  # nothing was sampled: an aborted episode that trains on nothing
        error = {"role": "user", "content": f"error: {'; '.join(episode['errors']) or 'no trace'}"}
        traj = Trajectory(chat.encode_prompt(prompt), group_id=group_id, stop_reason="abort", messages=[*prompt, error])
        traj.env_metrics["env_error"] = 1.0
    else:
        traj = trajectory(traces[0], endpoint, engine.weight_version, group_id)
    traj.timings["llm"] = elapsed  # model turns and the harness together: verifiers times them, not thermik
    return traj


def trajectory(trace: dict[str, Any], endpoint: Endpoint, version: int, group_id: int) -> Trajectory:
    """A verifiers trace (its first trainable branch) as a Trajectory, exact-prefix checked against the endpoint."""
    branch = trace["branches"][0]
    ids, mask, trace_logprobs = branch["token_ids"], branch["sampled_mask"], branch["logprobs"]
    first = mask.index(True) if True in mask else len(ids)
    response = ids[first:]
    spans = _sampled_spans(mask[first:])
    traj = Trajectory(prompt_ids=ids[:first], response_ids=response, group_id=group_id, messages=trace["messages"])
    traj.loss_mask = [int(m) for m in mask[first:]]
    traj.rollout_logprobs = [float(x) for x in trace_logprobs[first:]]
    traj.weight_versions = [-1] * len(response)
    traj.rewards = [0.0] * len(response)
    matched = True
    for i, (s, e) in enumerate(spans):
        traj.turn_spans.append((s, e, spans[i + 1][0] if i + 1 < len(spans) else len(response)))
        engine_side = endpoint.sampled.pop(tuple(ids[: first + e]), None)
        if engine_side is None or len(engine_side[0]) != e - s:
            matched = False
            continue
        traj.rollout_logprobs[s:e], traj.weight_versions[s:e] = engine_side
    if spans:
        traj.rewards[spans[-1][1] - 1] = float(trace["reward"])
    traj.num_turns = len(spans)
    traj.stop_reason = STOP_REASONS.get(trace["stop_condition"] or "", "abort" if trace["errors"] else "stop")
    if trace["errors"]:
        traj.env_metrics["env_error"] = 1.0
    if not matched:  # the renderer's tokens are not what the engine saw: keep nothing to train on
        traj.env_metrics["prefix_mismatch"] = 1.0
        traj.loss_mask = [0] * len(response)
        traj.weight_versions = [version if m else -1 for m in mask[first:]]
        return traj
    check_trajectory(traj, [response[s:e] for s, e in spans])
    return traj


def _sampled_spans(mask: list[bool]) -> list[tuple[int, int]]:
    """(start, end) of each run of sampled tokens."""
    spans, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans
