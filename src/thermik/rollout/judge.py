"""An LLM judge: a rubric reward from an OpenAI-compatible chat model (docs/algorithms.md, "Judges and reward
models").

Each episode is rendered into the rubric template (`{prompt}`, `{response}`, `{ground_truth}`), sent to
`/v1/chat/completions`, and the score is read from the reply with `score_pattern` and divided by `max_score`.
Identical requests are answered from a cache; at most `concurrency` are in flight; each has a timeout and is
retried on transport errors, 429 and 5xx. A request that still fails, or whose reply holds no score in
[0, max_score], scores `failure_value` and is counted (`judge/failures` and its cause), so a judge never stops a
step.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from thermik.config.schema import JudgeConfig

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


class JudgeFailure(Exception):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause  # "timeout" | "unreachable" | "http_<status>" | "unparsable"


class Judge:
    """Scores episodes with the configured judge model; keeps its cache across steps."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        self.template = cfg.template
        self.cache: dict[str, float] = {}
        self.headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}

    async def score(self, episodes: list[Episode]) -> tuple[list[float], dict[str, float]]:
        """(one score per episode, judge/* metrics)."""
        counts: Counter[str] = Counter()
        gate = asyncio.Semaphore(self.cfg.concurrency)
        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, headers=self.headers) as client:
            scores = await asyncio.gather(*(self._one(client, gate, e, counts) for e in episodes))
        parsed = [s for s, ok in scores if ok]
        metrics = {f"judge/{k}": float(v) for k, v in counts.items()}
        metrics["judge/requests"] = float(counts["requests"])
        metrics["judge/failures"] = float(len(scores) - len(parsed))
        if parsed:
            metrics["judge/score_mean"] = sum(parsed) / len(parsed)
        return [s for s, _ in scores], metrics

    async def _one(
        self, client: httpx.AsyncClient, gate: asyncio.Semaphore, episode: Episode, counts: Counter[str]
    ) -> tuple[float, bool]:
        content = render_rubric(self.template, episode)
        key = hashlib.sha256(f"{self.cfg.base_url}\0{self.cfg.model}\0{content}".encode()).hexdigest()
        if key in self.cache:
            counts["cache_hits"] += 1
            return self.cache[key], True
        try:
            async with gate:
                reply = await self._request(client, content, counts)
        except JudgeFailure as failure:
            counts[failure.cause] += 1
            return self.cfg.failure_value, False
        score = parse_score(reply, self.cfg.score_pattern, self.cfg.max_score)
        if score is None:
            counts["unparsable"] += 1
            return self.cfg.failure_value, False
        self.cache[key] = score
        return score, True

    async def _request(self, client: httpx.AsyncClient, content: str, counts: Counter[str]) -> str:
        """The judge's reply text, after up to `retries` retries; raises JudgeFailure naming the last cause."""
        body = {
            "model": self.cfg.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
        cause = "unreachable"
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                counts["retries"] += 1
                await asyncio.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            counts["requests"] += 1
            try:
                reply = await client.post(f"{self.cfg.base_url.rstrip('/')}/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                cause = "timeout"
                continue
            except httpx.TransportError:
                cause = "unreachable"
                continue
            if reply.status_code == 200:
                try:
                    return str(reply.json()["choices"][0]["message"]["content"] or "")
                except (ValueError, KeyError, IndexError, TypeError):
                    raise JudgeFailure("unparsable") from None
            cause = f"http_{reply.status_code}"
            if reply.status_code not in RETRY_STATUS:
                break
        raise JudgeFailure(cause)
