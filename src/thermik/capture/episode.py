"""One captured episode: the prompt of each turn built from the tokens already sampled, and its step-wise samples.

A turn's prompt is the current sample's exact tokens (first prompt, sampled turns, inserted messages) plus the
rendering of the messages the request adds after them (tool results, user turns): the chat template's delta after
an eos-closed assistant turn (`ChatTokenizer.observation_text`), with an eos first when the sampled turn did not end
with one (a stop string, a length cut). Nothing sampled is re-tokenized. A request whose conversation does not
extend what the current sample holds (history edited or summarized, another sub-agent, other tools) is rendered
whole and starts a new sample (`rollout.step_wise`, 'on-break'); `capture_forks` counts them.

A turn that fails before its reply is recorded is undone. An SDK retry (`x-stainless-retry-count` > 0) of the same
request as the previous turn replaces that turn instead of forking. Budgets (turns, sampled tokens, the context
length) end the episode with a 400 naming the budget; later requests get a 404.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

from thermik.capture.messages import Message, message_key, tools_key
from thermik.inference.base import Generation
from thermik.inference.server.errors import ApiError
from thermik.inference.server.outputs import Choice
from thermik.models.chat import ChatTokenizer
from thermik.rollout.step_wise import EpisodeSamples, StepWise
from thermik.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class EpisodeLimits:
    """An episode's budgets (None: unlimited) and how a broken prefix is trained."""

    max_turns: int | None = None
    """Model calls; the call after the last one is answered 400 and ends the episode (stop reason max_turns)."""
    max_tokens: int | None = None
    """Sampled tokens over the whole episode; each turn may sample at most what is left (stop reason length)."""
    step_wise: StepWise = "on-break"
    sampling: dict[str, Any] = field(default_factory=dict)
    """Request fields the episode fixes whatever the harness sends (temperature, top_p, top_k, min_p, seed): a
    training run samples with its own settings."""
    render_tools: bool = True
    """Off: the request's tool schemas stay out of the prompt (`env.render_tools = false`, for a model trained without
    them); its tool calls are still parsed."""


class EpisodeFinished(ApiError):
    """A budget ran out: the request is refused (400) and the episode is over."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(400, message, None, "episode_budget_exhausted")
        self.reason = reason


@dataclass
class _Mark:
    """The episode before a turn, to undo it."""

    samples: tuple[int, int, int, int, tuple[int, int, int] | None] | None
    history: list[Message]
    tools: str
    turns: int
    sampled_tokens: int


class Episode:
    """The state of one episode (see the module docstring); requests are served one at a time (`lock`)."""

    def __init__(self, chat: ChatTokenizer, limits: EpisodeLimits, group_id: int = 0) -> None:
        self.id = secrets.token_hex(12)
        self.api_key = f"sk-episode-{secrets.token_hex(16)}"
        self.chat, self.limits, self.group_id = chat, limits, group_id
        self.lock = asyncio.Lock()
        self.samples: EpisodeSamples | None = None
        self.history: list[Message] = []  # the conversation the current sample's tokens hold
        self._history_keys: list[tuple[Any, ...]] = []  # its message keys, kept so a request compares only its own
        self.tools = tools_key(None)
        self.turns = self.sampled_tokens = self.retries = 0
        self.finished: str | None = None  # the stop reason once a budget ended the episode
        self.closed = False
        self.reward: float | None = None  # posted to the episode's reward URL: on the last sampled token at close
        self.reward_metrics: dict[str, float] = {}
        self.responses: dict[str, list[Message]] = {}  # Responses API: id -> its conversation (previous_response_id)
        self.response_objects: dict[str, dict[str, Any]] = {}  # id -> the Response (GET /responses/{id})
        self._last: tuple[str, _Mark] | None = None  # the previous turn's request fingerprint and the state before it
        self._mark: _Mark | None = None  # the running turn's start, until its reply is recorded
        self._pending: list[Message] = []

    # ------------------------------------------------------------------ a turn

    def begin(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        fingerprint: str,
        retry: bool,
        raw: list[int] | None = None,
    ) -> None:
        """Start a turn for a request whose conversation is `messages` (or whose prompt is the token ids `raw`, a
        text completion's): the budgets, then the prompt (`prompt_ids`)."""
        if self.closed:
            raise ApiError(404, f"episode {self.id} is closed", None, "episode_not_found")
        if retry and self._last is not None and self._last[0] == fingerprint:
            self._restore(self._last[1])
            self.retries += 1
        self._check_budgets()
        self._mark = _Mark(self.samples.mark() if self.samples else None, list(self.history), self.tools, self.turns,
                           self.sampled_tokens)  # fmt: skip
        self._last = (fingerprint, self._mark)
        key = tools_key(tools) if raw is None else "raw"
        tail = self._extension(messages) if key == self.tools and raw is None else None
        if tail is not None:
            assert self.samples is not None
            last = self.samples.current_ids()[-1]
            close = [] if last in self.chat.stop_ids else [self.chat.eos_id]
            self.samples.advance(close + self.chat.encode(self.chat.observation_text(tail)), True)
        else:
            ids = self._render(messages, tools) if raw is None else list(raw)
            if self.samples is None:
                self.samples = EpisodeSamples(Trajectory(ids, group_id=self.group_id), self.limits.step_wise)
            else:
                self.samples.advance(ids, False)
        self.tools, self._pending = key, list(messages)

    def prompt_ids(self) -> list[int]:
        assert self.samples is not None
        return self.samples.current_ids()

    def max_new_tokens(self, requested: int | None) -> int | None:
        """`requested` within what the token budget leaves."""
        if self.limits.max_tokens is None:
            return requested
        left = self.limits.max_tokens - self.sampled_tokens
        return left if requested is None else min(requested, left)

    def record(self, choice: Choice, reply: Message) -> None:
        """The turn's sampled tokens (cut as the reply was) and the reply as the harness will send it back."""
        if self.closed or self.samples is None:  # closed while the turn ran: its samples are handed out already
            return
        versions = choice.weight_versions or [choice.weight_version] * len(choice.token_ids)
        reason = "stop" if choice.finish_reason in ("stop", "tool_calls") else "length"
        self.samples.add_generation(Generation(choice.token_ids, choice.logprobs, reason, choice.weight_version,
                                               versions))  # fmt: skip
        self.samples.head.messages = [*self._pending, reply]
        self._set_history([*self._pending, reply])
        self.turns += 1
        self.sampled_tokens += len(choice.token_ids)
        self._mark = None

    def end(self) -> None:
        """After a turn: one whose reply was never recorded (an error, a client gone mid-stream) is undone."""
        if self._mark is not None:
            self._restore(self._mark)
            self._mark = None

    def fail(self, exc: EpisodeFinished) -> None:
        """A budget ran out while the turn was prepared: the episode ends with `exc.reason`."""
        self.end()
        self.finished = exc.reason

    # ------------------------------------------------------------------ the episode's samples

    def trajectory(self) -> Trajectory:
        """The episode's samples: the first, its continuations, and the capture's counts in env_metrics. The episode
        is closed: a turn still running is dropped."""
        self.end()
        self.closed = True
        if self.samples is None:  # the harness never called the model
            traj = Trajectory(prompt_ids=[], stop_reason="abort")
            traj.env_metrics["capture_no_turns"] = 1.0
            return traj
        head = self.samples.finish(overlong=False)
        head.num_turns = self.turns
        head.stop_reason = self.finished or "stop"
        head.env_metrics["capture_forks"] = float(len(head.continuations))
        head.env_metrics["capture_retries"] = float(self.retries)
        head.env_metrics.update(self.reward_metrics)
        if self.reward is not None:
            head.add_final_reward(self.reward)
        return head

    # ------------------------------------------------------------------ internals

    def _check_budgets(self) -> None:
        if self.limits.max_turns is not None and self.turns >= self.limits.max_turns:
            raise EpisodeFinished(f"the episode's turn budget ({self.limits.max_turns} model calls) is spent",
                                  "max_turns")  # fmt: skip
        if self.limits.max_tokens is not None and self.sampled_tokens >= self.limits.max_tokens:
            raise EpisodeFinished(f"the episode's token budget ({self.limits.max_tokens} sampled tokens) is spent",
                                  "length")  # fmt: skip

    def _extension(self, messages: list[Message]) -> list[Message] | None:
        """The messages after the current sample's conversation when `messages` extends it with no assistant
        message of its own, else None."""
        n = len(self.history)
        if self.samples is None or len(messages) < n:
            return None
        if [message_key(m) for m in messages[:n]] != self._history_keys:
            return None
        tail = messages[n:]
        return None if any(m["role"] == "assistant" for m in tail) else tail

    def _render(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
        try:
            return self.chat.encode(self.chat.render(messages, tools if self.limits.render_tools else None))
        except Exception as exc:  # a template refusing these messages (raise_exception, bad roles) is a 400
            raise ApiError(400, f"the chat template cannot render these messages: {exc}", "messages") from exc

    def _restore(self, mark: _Mark) -> None:
        if mark.samples is None:
            self.samples = None
        elif self.samples is not None:
            self.samples.rewind(mark.samples)
        self._set_history(list(mark.history))
        self.tools, self.turns, self.sampled_tokens = mark.tools, mark.turns, mark.sampled_tokens

    def _set_history(self, messages: list[Message]) -> None:
        self.history, self._history_keys = messages, [message_key(m) for m in messages]
