"""verifiers episodes as thermik trajectories: serve the engine token-in, let verifiers play, convert the trace.

For a `verifiers:<taskset>` row (thermik.envs.verifiers_env) the agent loop hands the episode to `play`: this process
serves its engine on loopback with thermik's inference app (`/inference/v1/generate`, verifiers' training-client
wire format), verifiers plays the episode in its own venv and calls that endpoint for every model turn, and the
trace it returns (token ids, sampled mask, logprobs, reward) becomes a Trajectory. Exact-prefix check: every
sampled span of the trace, with every token before it, must be exactly a prompt the endpoint received plus the
completion it returned; the engine's own logprobs and weight versions are then kept per token. A trace that fails
the check keeps its tokens with the loss mask zeroed (`env_metrics["prefix_mismatch"]`); an episode without a
trace is an aborted, empty one. Every trainable branch of the trace (a conversation rewritten by compaction or a
sub-agent has several) becomes a step-wise sample of the episode; `env_metrics["verifiers_branches"]` counts them.
docs/environments.md, "verifiers v1".
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from thermik.config.schema import SamplingConfig
from thermik.envs.verifiers_env import BridgeError, VerifiersEnv
from thermik.inference.base import Generation, InferenceEngine
from thermik.models.chat import ChatTokenizer
from thermik.rollout.invariants import check_trajectory
from thermik.rollout.step_wise import PrefixBreakError
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
        if limits.step_wise == "off" and traj.continuations:
            raise PrefixBreakError(
                f"a verifiers trace has {len(traj.samples)} trainable branches (its conversation was rewritten, e.g. "
                "by compaction); set rollout.step_wise = 'on-break' to train each as a sample (docs/algorithms.md)"
            )
    traj.timings["llm"] = elapsed  # model turns and the harness together: verifiers times them, not thermik
    return traj


def trajectory(trace: dict[str, Any], endpoint: Endpoint, version: int, group_id: int) -> Trajectory:
    """A verifiers trace as step-wise samples: one per trainable branch (docs/algorithms.md, 'Step-wise
    trajectories'), the first carrying the episode and the others as its continuations.

    Branches share the messages before the point where the conversation was rewritten (compaction, a sub-agent, a
    restarted history): in a later branch the tokens it shares with an earlier one are prompt, so every sampled
    token trains once. Each sample is exact-prefix checked against the endpoint; the trace's reward lands on the
    last sampled token of the last sample that has one."""
    branches, seen, used = trace["branches"], [], set()
    samples: list[Trajectory] = []
    for branch in branches:
        ids, mask = branch["token_ids"], branch["sampled_mask"]
        start = _first_new_sampled(ids, mask, seen)
        seen.append(ids)
        if start < len(ids):
            samples.append(_branch_sample(branch, start, endpoint, version, group_id, used))
    for key in used:
        endpoint.sampled.pop(key, None)
    head = samples[0] if samples else Trajectory(branches[0]["token_ids"], group_id=group_id)
    head.continuations, head.messages = samples[1:], trace["messages"]
    head.env_metrics["verifiers_branches"] = float(len(branches))
    if [s.env_metrics.pop("prefix_mismatch") for s in samples if "prefix_mismatch" in s.env_metrics]:
        head.env_metrics["prefix_mismatch"] = 1.0
    last = next((s for s in reversed(samples) if s.turn_spans), None)
    if last is not None:
        last.rewards[last.turn_spans[-1][1] - 1] = float(trace["reward"])
    head.num_turns = sum(len(s.turn_spans) for s in samples)
    head.stop_reason = STOP_REASONS.get(trace["stop_condition"] or "", "abort" if trace["errors"] else "stop")
    if trace["errors"]:
        head.env_metrics["env_error"] = 1.0
    return head


def _first_new_sampled(ids: list[int], mask: list[bool], earlier: list[list[int]]) -> int:
    """Where this branch's own sampled tokens start: the first sampled token after the longest token prefix it
    shares with an earlier branch (backed up to the start of a sampled run the prefix ends inside: two replies to
    the same prompt are two samples); len(ids) when it samples nothing of its own."""
    shared = max((_common_prefix(ids, other) for other in earlier), default=0)
    while 0 < shared < len(ids) and mask[shared] and mask[shared - 1]:
        shared -= 1
    return next((i for i in range(shared, len(ids)) if mask[i]), len(ids))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _branch_sample(
    branch: dict[str, Any], first: int, endpoint: Endpoint, version: int, group_id: int, used: set[tuple[int, ...]]
) -> Trajectory:
    """The sample of one branch from its token `first` on (the tokens before are its prompt); `used` collects the
    endpoint's records it matched. A branch whose tokens the engine never saw trains on nothing."""
    ids, mask, trace_logprobs = branch["token_ids"], branch["sampled_mask"], branch["logprobs"]
    response = ids[first:]
    spans = _sampled_spans(mask[first:])
    traj = Trajectory(prompt_ids=ids[:first], response_ids=response, group_id=group_id)
    traj.loss_mask = [int(m) for m in mask[first:]]
    traj.rollout_logprobs = [float(x) for x in trace_logprobs[first:]]
    traj.weight_versions = [-1] * len(response)
    traj.rewards = [0.0] * len(response)
    matched = True
    for i, (s, e) in enumerate(spans):
        traj.turn_spans.append((s, e, spans[i + 1][0] if i + 1 < len(spans) else len(response)))
        key = tuple(ids[: first + e])
        engine_side = endpoint.sampled.get(key)
        if engine_side is None or len(engine_side[0]) != e - s:
            matched = False
            continue
        used.add(key)
        traj.rollout_logprobs[s:e], traj.weight_versions[s:e] = engine_side
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
