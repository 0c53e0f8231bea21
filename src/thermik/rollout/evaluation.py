"""Held-out evaluation: success rate, mean reward and mean turns of sampled episodes (pass@k of training groups is
`rollout.metrics`; both count an episode as solved at `SUCCESS_THRESHOLD`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from thermik.config.schema import SamplingConfig
from thermik.inference.base import InferenceEngine
from thermik.rollout.agent_loop import EnvFactory, LoopLimits, rollout_rows
from thermik.rollout.tokenization import ChatTokenizer
from thermik.rollout.trajectory import Trajectory

SUCCESS_THRESHOLD = 1.0 - 1e-6
"""An episode succeeds when its total reward reaches 1 (exact answer, exact reversal)."""


@dataclass(frozen=True)
class EvalResult:
    success: float
    reward: float
    turns: float
    n: int

    def as_metrics(self, prefix: str = "eval") -> dict[str, float]:
        return {f"{prefix}/{k}": float(v) for k, v in asdict(self).items()}


def summarize(trajs: list[Trajectory]) -> EvalResult:
    n = max(len(trajs), 1)
    return EvalResult(
        success=sum(t.reward >= SUCCESS_THRESHOLD for t in trajs) / n,
        reward=sum(t.reward for t in trajs) / n,
        turns=sum(t.num_turns for t in trajs) / n,
        n=len(trajs),
    )


async def evaluate(
    engine: InferenceEngine,
    make_env: EnvFactory,
    chat: ChatTokenizer,
    rows: list[dict[str, Any]],
    limits: LoopLimits,
    temperature: float,
    seed: int = 0,
) -> tuple[EvalResult, list[Trajectory]]:
    sampling = SamplingConfig(temperature=temperature)
    trajs = await rollout_rows(engine, make_env, chat, rows, 1, limits, sampling, seed=seed)
    return summarize(trajs), trajs
