"""An LLM judge: a rubric reward from an OpenAI-compatible chat model (docs/algorithms.md, "Judges and reward
models").

Each episode is rendered into the rubric template (`{prompt}`, `{response}`, `{ground_truth}`), sent to
`/v1/chat/completions`, and the score is read from the reply with `score_pattern` and divided by `max_score`. An
empty `rewards.judge.model` sends the first model the server's `/v1/models` lists (as the teacher does).
Identical requests are answered from a cache; at most `concurrency` are in flight; each has a timeout and is
retried on transport errors, 429 and 5xx. A request that still fails, or whose reply holds no score in
[0, max_score], scores `failure_value`, is counted (`judge/failures` and its cause) and marked unanswered, so a
judge never stops a step; the first such failure is printed once with its status and body
(model_rewards.py decides what an unanswered group means for training).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from thermik.config.schema import JudgeConfig
from thermik.models.served import BODY_CHARS, NoServedModelError, first_served_model

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Episode:
    """What a model reward sees of one episode: its prompt, what followed, and the row's ground truth."""

    prompt: list[dict[str, Any]]
    response: list[dict[str, Any]]
    ground_truth: Any


def as_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in messages)


def render_rubric(template: str, episode: Episode) -> str:
    truth = episode.ground_truth
    return template.format(
        prompt=as_text(episode.prompt),
        response=as_text(episode.response),
        ground_truth=truth if isinstance(truth, str) else json.dumps(truth, sort_keys=True),
    )


def parse_score(text: str, pattern: str, max_score: float) -> float | None:
    """The first match's group 1 (or whole match) divided by max_score; None when absent or outside [0, max]."""
    match = re.search(pattern, text)
    if match is None:
        return None
    try:
        value = float(match.group(1) if match.groups() else match.group(0))
    except ValueError:
        return None
    return value / max_score if 0 <= value <= max_score else None


@dataclass
class Scores:
    """What a model reward source gave a list of episodes."""

    values: list[float]  # one per episode; an unanswered one holds the source's failure value
    answered: list[bool]  # whether the source scored that episode
    metrics: dict[str, float]


class JudgeFailure(Exception):
    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause  # "timeout" | "unreachable" | "http_<status>" | "unparsable" | "no_model"
        self.detail = detail  # what happened, for the console: the status and body, or the transport error


class Judge:
    """Scores episodes with the configured judge model; keeps its cache across steps."""

    setting = "rewards.judge"

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        self.template = cfg.template
        self.url = f"{cfg.base_url.rstrip('/')}/v1/chat/completions"
        self.model: str | None = cfg.model or None  # None: asked of /v1/models before the first request
        self.cache: dict[str, float] = {}
        self.headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self.first_failure: str | None = None  # printed once, quoted again if the judge never answers

    def hint(self) -> str:
        return f"check that {self.cfg.base_url} serves a chat model (rewards.judge.base_url, rewards.judge.model)"

    async def score(self, episodes: list[Episode]) -> Scores:
        """One score per episode, whether each was answered, and the judge/* metrics."""
        counts: Counter[str] = Counter()
        gate = asyncio.Semaphore(self.cfg.concurrency)
        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=self.headers) as client:
            failure = await self._resolve_model(client)
            if failure is None:
                scores = await asyncio.gather(*(self._one(client, gate, e, counts) for e in episodes))
            else:  # no model to ask: every episode fails for that reason
                counts[failure.cause] += len(episodes)
                scores = [(self.cfg.failure_value, False)] * len(episodes)
        parsed = [s for s, ok in scores if ok]
        metrics = {f"judge/{k}": float(v) for k, v in counts.items()}
        metrics["judge/requests"] = float(counts["requests"])
        metrics["judge/failures"] = float(len(scores) - len(parsed))
        if parsed:
            metrics["judge/score_mean"] = sum(parsed) / len(parsed)
        return Scores([s for s, _ in scores], [ok for _, ok in scores], metrics)

    async def _resolve_model(self, client: httpx.AsyncClient) -> JudgeFailure | None:
        """Name the model from /v1/models when rewards.judge.model is empty; the failure when that fails."""
        if self.model is not None:
            return None
        try:
            self.model = await first_served_model(client, self.cfg.base_url, "rewards.judge.model")
        except NoServedModelError as exc:
            return self._failed(JudgeFailure("no_model", exc.message))
        except httpx.TransportError as exc:
            return self._failed(JudgeFailure("unreachable", f"GET /v1/models did not answer ({type(exc).__name__})"))
        return None

    def _failed(self, failure: JudgeFailure) -> JudgeFailure:
        """Print the run's first failure once, on the console; later ones are only counted."""
        if self.first_failure is None:
            self.first_failure = failure.detail
            print(
                f"thermik: rewards.judge failed for the first time: {failure.detail} (later failures are counted in "
                "judge/failures and judge/<cause>)",
                file=sys.stderr,
                flush=True,
            )
        return failure

    async def _one(
        self, client: httpx.AsyncClient, gate: asyncio.Semaphore, episode: Episode, counts: Counter[str]
    ) -> tuple[float, bool]:
        content = render_rubric(self.template, episode)
        key = hashlib.sha256(f"{self.cfg.base_url}\0{self.model}\0{content}".encode()).hexdigest()
        if key in self.cache:
            counts["cache_hits"] += 1
            return self.cache[key], True
        try:
            async with gate:
                reply = await self._request(client, content, counts)
            score = parse_score(reply, self.cfg.score_pattern, self.cfg.max_score)
            if score is None:
                raise JudgeFailure(
                    "unparsable",
                    f"the reply holds no score in [0, {self.cfg.max_score:g}] matching rewards.judge.score_pattern: "
                    f"{reply[:BODY_CHARS]!r}",
                )
        except JudgeFailure as failure:
            counts[self._failed(failure).cause] += 1
            return self.cfg.failure_value, False
        self.cache[key] = score
        return score, True

    async def _request(self, client: httpx.AsyncClient, content: str, counts: Counter[str]) -> str:
        """The judge's reply text, after up to `retries` retries; raises JudgeFailure naming the last cause."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
        failure = JudgeFailure("unreachable", f"POST {self.url} was not sent")
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                counts["retries"] += 1
                await asyncio.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            counts["requests"] += 1
            try:
                reply = await client.post(self.url, json=body)
            except httpx.TimeoutException:
                failure = JudgeFailure("timeout", f"POST {self.url} timed out after {self.cfg.timeout_s:g} s")
                continue
            except httpx.TransportError as exc:
                failure = JudgeFailure("unreachable", f"POST {self.url} did not answer ({type(exc).__name__}: {exc})")
                continue
            if reply.status_code == 200:
                try:
                    return str(reply.json()["choices"][0]["message"]["content"] or "")
                except (ValueError, KeyError, IndexError, TypeError):
                    raise JudgeFailure("unparsable", f"POST {self.url} answered 200 without a chat completion: "
                                       f"{reply.text[:BODY_CHARS]}") from None  # fmt: skip
            failure = JudgeFailure(
                f"http_{reply.status_code}", f"POST {self.url} answered {reply.status_code}: {reply.text[:BODY_CHARS]}"
            )
            if reply.status_code not in RETRY_STATUS:
                break
        raise failure
