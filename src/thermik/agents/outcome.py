"""How a harness's episode ends: scored (agents/scoring.py) and its reward placed, or failed with its reason.

A harness that misbehaves fails its episode, never the run: the episode keeps its tokens but trains on nothing
(loss masks zeroed, `env_metrics["masked"]`), its reward is 0, and `env_metrics["agent/failed"]` and
`agent/failed_<reason>` count it (crash, timeout, left_processes, over_budget, no_reward); one line on stderr names
the reason. docs/agents.md, "When a harness misbehaves".
"""

from __future__ import annotations

import sys
from typing import Any

from thermik.agents.harness_env import HarnessEnv
from thermik.agents.process import HarnessOutcome
from thermik.agents.scoring import Score, call_reward_fn, load_function, read_result, score_answer
from thermik.rollout.trajectory import Trajectory


async def finish(env: HarnessEnv, row: dict[str, Any], traj: Trajectory, outcome: HarnessOutcome) -> None:
    """Score the episode and place its reward, or fail it with its reason."""
    failure, detail = outcome.failure, outcome.detail
    if failure == "crash" and traj.stop_reason in ("max_turns", "length"):
        failure = "over_budget"  # the endpoint refused a call past agent.max_turns / max_tokens and ended it
    score = Score() if failure else await episode_score(env, row, traj, outcome)
    if not failure and score.reward is None:
        failure, detail = "no_reward", "the harness returned no reward nor an answer, posted none to its reward URL, "
        detail += "and agent.reward_fn is unset"
    traj.env_metrics |= outcome.posted_metrics | score.metrics
    if failure:
        fail(traj, failure, detail)
    else:
        place_reward(traj, float(score.reward or 0.0))


async def episode_score(env: HarnessEnv, row: dict[str, Any], traj: Trajectory, outcome: HarnessOutcome) -> Score:
    """agent.reward_fn when set, else the reward the harness returned, else the one it POSTed to its reward URL, else
    the env's scorer on its answer."""
    if env.cfg.reward_fn:
        fn = load_function(env.cfg.reward_fn, "agent.reward_fn", env.cfg.cwd)
        return await call_reward_fn(fn, row, outcome.result, traj.messages)
    score = read_result(outcome.result)
    if score.reward is None:
        score.reward = outcome.posted_reward
    if score.reward is None and score.answer is not None:
        score.reward = await score_answer(env.inner, row["prompt"], score.answer)
    return score


def place_reward(traj: Trajectory, reward: float) -> None:
    """The episode's reward on the last sampled token of its last sample that sampled anything."""
    if not traj.add_final_reward(reward):  # nothing sampled here (an API model's episode): it stands alone, as
        traj.rewards.append(reward)  # ApiPolicy's do


def fail(traj: Trajectory, reason: str, detail: str) -> None:
    """A failed episode: counted with its reason, logged, its tokens kept but trained on nothing."""
    for sample in traj.samples:
        sample.loss_mask = [0] * len(sample.loss_mask)
    traj.env_metrics |= {"masked": 1.0, "agent/failed": 1.0, f"agent/failed_{reason}": 1.0}
    if traj.stop_reason == "stop":
        traj.stop_reason = "abort"
    print(f"thermik: agent episode failed ({reason}): {detail}", file=sys.stderr, flush=True)
