"""The one evaluation path (`thermik eval` and the in-training held-out check): k samples per problem, pass@k and
avg@k overall, per env and per data source, failure categories, and one trajectory record per sample
(docs/evaluation.md). A row whose prompt exceeds rollout.max_input_length is skipped and counted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from thermik.config.schema import SamplingConfig
from thermik.inference.base import InferenceEngine
from thermik.models.chat import ChatTokenizer
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, PromptTooLongError, rollout_row
from thermik.rollout.failures import FAILURE_CATEGORIES, SUCCESS_THRESHOLD
from thermik.rollout.records import trajectory_record
from thermik.rollout.trajectory import Trajectory

__all__ = ["SUCCESS_THRESHOLD", "EvalResult", "evaluate", "pass_at_k", "summarize", "write_eval", "write_records"]

Player = Callable[[dict[str, Any], int, int | None], Awaitable[Trajectory]]
"""(row, problem index, seed) -> one played episode: the policy under evaluation (an engine or a chat API)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples (Chen et al. 2021, 'Evaluating Large Language
    Models Trained on Code', eq. 1): 1 - C(n-c, k) / C(n, k), computed as a stable product."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class EvalResult:
    """success = mean solved fraction over all samples (pass@1), reward = mean reward (avg@k), turns = mean turns,
    n = samples; `breakdown` holds pass@1, pass@k, avg@k per env (`env/<name>/...`) and data source
    (`source/<name>/...`) and the failure counts (`failures/<category>`)."""

    success: float
    reward: float
    turns: float
    n: int
    k: int = 1
    problems: int = 0
    skipped: int = 0
    breakdown: dict[str, float] = field(default_factory=dict)
    longest_skipped: int = 0  # tokens of the longest skipped prompt (0: none skipped, or a server refused it)

    @property
    def success_se(self) -> float:
        """Standard error of `success` over the problems: sqrt(p(1-p)/problems), the binomial one at k=1 (with k
        samples per problem, pass@1 averages k draws per problem, so treating problems as the unit is conservative)."""
        units = self.problems or self.n
        return math.sqrt(self.success * (1 - self.success) / units) if units else 0.0

    def as_metrics(self, prefix: str = "eval") -> dict[str, float]:
        keys = ("success", "reward", "turns", "n", "skipped")
        return {f"{prefix}/{k}": float(getattr(self, k)) for k in keys} | {
            f"{prefix}/{k}": float(v) for k, v in self.breakdown.items()
        }


def _scores(records: list[dict[str, Any]], k: int) -> dict[str, float]:
    """pass@1, pass@k and avg@k of records grouped by problem (each problem has k samples)."""
    by_problem: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_problem[r["problem"]].append(r)
    solved = [(len(rs), sum(r["score"] >= SUCCESS_THRESHOLD for r in rs)) for rs in by_problem.values()]
    out = {"pass@1": fmean(pass_at_k(n, c, 1) for n, c in solved)}
    if k > 1:
        out[f"pass@{k}"] = fmean(pass_at_k(n, c, k) for n, c in solved)
    out[f"avg@{k}"] = fmean(r["score"] for r in records)
    return out


def summarize(records: list[dict[str, Any]], k: int, skipped: int = 0) -> EvalResult:
    """The scores of trajectory records (`trajectory_record` with `problem` and `sample`)."""
    if not records:
        return EvalResult(success=0.0, reward=0.0, turns=0.0, n=0, k=k, skipped=skipped)
    breakdown = _scores(records, k)
    for field_name, label in (("env_class", "env"), ("data_source", "source")):
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            groups[r[field_name] or "unknown"].append(r)
        for name, rs in sorted(groups.items()):
            breakdown |= {f"{label}/{name}/{key}": v for key, v in _scores(rs, k).items()}
    failures = Counter(r["failure"] for r in records if r["failure"] is not None)
    breakdown |= {f"failures/{c}": float(failures.get(c, 0)) for c in FAILURE_CATEGORIES}
    return EvalResult(
        success=fmean(r["score"] >= SUCCESS_THRESHOLD for r in records),
        reward=fmean(r["score"] for r in records),
        turns=fmean(r["num_turns"] for r in records),
        n=len(records),
        k=k,
        problems=len({r["problem"] for r in records}),
        skipped=skipped,
        breakdown=breakdown,
    )


def engine_player(
    engine: InferenceEngine, make_env: EnvFactory, chat: ChatTokenizer, limits: LoopLimits, sampling: SamplingConfig
) -> Player:
    """The policy as a token-in/token-out engine: the agent loop of training."""

    async def play(row: dict[str, Any], problem: int, seed: int | None) -> Trajectory:
        return await rollout_row(engine, make_env, chat, row, limits, sampling, problem, seed)

    return play


async def evaluate(
    play: Player,
    rows: list[dict[str, Any]],
    *,
    k: int = 1,
    seed: int = 0,
    chat: ChatTokenizer | None = None,
    tool_parser: str = "hermes",
    env_name: str = "",
    concurrency: int = 256,
) -> tuple[EvalResult, list[dict[str, Any]]]:
    """k episodes of every row, at most `concurrency` at once (each holds an env, perhaps MCP sessions); returns the
    scores and one record per episode (problem-major). `env_name`: the env every row is built with (empty: each
    row's env_class); `chat` decodes per-token text."""
    slots = asyncio.Semaphore(concurrency)

    too_long: list[int] = []

    async def one(p: int, s: int) -> dict[str, Any] | None:
        try:
            async with slots:
                traj = await play(rows[p], p, seed + 1000 * p + s)
        except PromptTooLongError as e:
            too_long.append(e.tokens)
            return None  # the same prompt is too long for every sample: the row is skipped, counted once
        traj.env_name = env_name or traj.env_name
        return trajectory_record(traj, rows[p], chat, tool_parser, problem=p, sample=s)

    got = await asyncio.gather(*(one(p, s) for p in range(len(rows)) for s in range(k)))
    records = [r for r in got if r is not None]
    skipped = len({i // k for i, r in enumerate(got) if r is None})
    return dataclasses.replace(summarize(records, k, skipped), longest_skipped=max(too_long, default=0)), records


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    """One JSON record per line, written to a temp file and renamed (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    return path


def write_eval(out_dir: Path, label: str, result: EvalResult, records: list[dict[str, Any]]) -> Path:
    """eval_<label>.json (the scores) and trajectories/eval_<label>.jsonl (one record per episode)."""
    (out_dir / f"eval_{label}.json").write_text(json.dumps(result.__dict__))
    return write_records(out_dir / "trajectories" / f"eval_{label}.jsonl", records)
