"""Capture: any OpenAI-API harness plays an episode against the policy, and its calls become token-exact samples.

The server that serves the policy (the inference app over any `InferenceEngine`) gives each episode its own
OpenAI-compatible base URL, `/episodes/{id}/v1`, and an API key that also works on the plain `/v1` routes (for
harnesses whose base URL is fixed). Served there: `chat/completions` (tools, `tool_choice`, `parallel_tool_calls`,
`stop`, `stream` + `stream_options.include_usage`, `max_completion_tokens`), `completions`, `responses` (input items,
`instructions`, flat function tools, `function_call_output`, `previous_response_id`, `stream`), `GET
responses/{response_id}` (a response of the episode) and `models`.

Public interface (stable):

    capture = Capture.over(app)                  # app = inference.server.app.build_app(engine, tokenizer, name, ...)
    async with serve_capture(engine, tokenizer, model_name, max_model_len) as capture:   # or: served on loopback
        handle = capture.open(EpisodeLimits(max_turns=8, max_tokens=2048, sampling={"temperature": 1.0}),
                              group_id=g)
        handle.base_url, handle.api_key, handle.model, handle.id, handle.reward_url   # client_config(), environment()
        ...the harness runs against handle.base_url / handle.api_key...
        traj = capture.close(handle.id)          # Trajectory; traj.samples = [traj, *traj.continuations]

Each turn's prompt is the episode's exact tokens so far plus the rendering of the new messages; a turn that does not
extend the history starts a new step-wise sample (`env_metrics["capture_forks"]`); SDK retries replace their turn
(`capture_retries`); logprobs and weight versions are kept per token. A spent budget answers 400 and ends the
episode (stop reason `max_turns` or `length`); an unknown, finished or closed episode answers 404; a malformed body
a 4xx. `POST /episodes/{id}/reward` `{"reward", "metrics"}` puts a reward on the last sampled token at close.
docs/capture.md.
"""

from thermik.capture.episode import EpisodeFinished, EpisodeLimits
from thermik.capture.registry import Capture, EpisodeHandle, serve_capture

__all__ = ["Capture", "EpisodeFinished", "EpisodeHandle", "EpisodeLimits", "serve_capture"]
