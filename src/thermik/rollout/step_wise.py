"""Step-wise samples of one episode: where the token prefix breaks, a new training sample starts.

`rollout.step_wise` (docs/algorithms.md, 'Step-wise trajectories'):

| mode | a new sample starts | a broken prefix |
|---|---|---|
| off | never | fails loudly (`PrefixBreakError`) |
| on-break | where the next prompt does not extend the sample's tokens | starts a new sample |
| always | at every turn | starts a new sample |

Each sample is a `Trajectory` with its own loss mask, rollout logprobs and weight versions; the token-in/token-out
check (`invariants.check_trajectory`) runs on every sample. `merge_samples` recombines consecutive samples that do
extend each other (SkyRL's prefix-aware merge); `on-break` is `always` followed by that merge, done as the episode
runs so that an episode without a break builds one sample and pays for no copies.
"""

from __future__ import annotations

from typing import Literal

from thermik.errors import ThermikError
from thermik.inference.base import Generation
from thermik.rollout.invariants import TrajectoryInvariantError, check_trajectory
from thermik.rollout.trajectory import Trajectory

StepWise = Literal["off", "on-break", "always"]


class PrefixBreakError(ThermikError, TrajectoryInvariantError):
    """With rollout.step_wise = 'off', the next prompt did not extend the episode's tokens: a setting to change
    (the message names it), so the CLI prints one line, not a traceback."""


def extends(ids: list[int], prompt: list[int]) -> bool:
    """Whether `prompt` starts with exactly `ids`."""
    return len(prompt) >= len(ids) and prompt[: len(ids)] == ids


def _append_observation(sample: Trajectory, ids: list[int]) -> None:
    """Tokens the loop inserted after the last sampled turn: loss mask 0, no logprob, weight version -1."""
    sample.response_ids += ids
    sample.loss_mask += [0] * len(ids)
    sample.rollout_logprobs += [0.0] * len(ids)
    sample.weight_versions += [-1] * len(ids)
    sample.rewards += [0.0] * len(ids)
    if sample.turn_spans:
        start, end_sampled, _ = sample.turn_spans[-1]
        sample.turn_spans[-1] = (start, end_sampled, len(sample.response_ids))


def _append_sampled(sample: Trajectory, gen: Generation) -> None:
    start = len(sample.response_ids)
    sample.response_ids += gen.token_ids
    sample.loss_mask += [1] * len(gen.token_ids)
    sample.rollout_logprobs += gen.logprobs
    sample.weight_versions += gen.weight_versions or [gen.weight_version] * len(gen.token_ids)
    sample.rewards += [0.0] * len(gen.token_ids)
    sample.turn_spans.append((start, len(sample.response_ids), len(sample.response_ids)))


class EpisodeSamples:
    """The samples of one episode as it runs; `head` (the first sample) carries the episode's own fields."""

    def __init__(self, head: Trajectory, mode: StepWise) -> None:
        self.head, self.mode = head, mode
        self.samples: list[Trajectory] = [head]
        self.sampled: list[list[list[int]]] = [[]]  # per sample, each turn's sampled ids (for the check)

    @property
    def current(self) -> Trajectory:
        return self.samples[-1]

    def current_ids(self) -> list[int]:
        return self.current.prompt_ids + self.current.response_ids

    def current_length(self) -> int:
        return len(self.current.prompt_ids) + len(self.current.response_ids)

    def add_generation(self, gen: Generation) -> None:
        _append_sampled(self.current, gen)
        self.sampled[-1].append(list(gen.token_ids))

    def add_reward(self, reward: float) -> None:
        """The env's reward on the current turn's last sampled token."""
        if self.current.rewards:
            self.current.rewards[-1] += reward

    def advance(self, ids: list[int], extends_current: bool) -> None:
        """The next prompt: `ids` are the new tokens after the current ones (`extends_current`) or a whole prompt.
        A whole prompt that happens to extend the current tokens still continues the sample (except in 'always')."""
        if not extends_current and self.mode != "always" and extends(self.current_ids(), ids):
            ids, extends_current = ids[self.current_length() :], True
        if extends_current and self.mode != "always":
            _append_observation(self.current, ids)
            return
        if not extends_current and self.mode == "off":
            raise PrefixBreakError(
                f"turn {self.head.num_turns + 1}: the next prompt is not an exact extension of the episode's tokens "
                "(the chat template re-renders earlier turns, e.g. strips <think>, or the history was rewritten); "
                "set rollout.step_wise = 'on-break' to train such episodes as several samples (docs/algorithms.md)"
            )
        prompt = self.current_ids() + ids if extends_current else list(ids)
        self.samples.append(Trajectory(prompt_ids=prompt, group_id=self.head.group_id, stop_reason=""))
        self.sampled.append([])

    def mark(self) -> tuple[int, int, int, int, tuple[int, int, int] | None]:
        """Where the episode stands now, for `rewind` (a turn that failed or was retried)."""
        current = self.current
        last = current.turn_spans[-1] if current.turn_spans else None
        return len(self.samples), len(current.response_ids), len(current.turn_spans), len(self.sampled[-1]), last

    def rewind(self, mark: tuple[int, int, int, int, tuple[int, int, int] | None]) -> None:
        """Undo everything added since `mark` (tokens, turns, samples started)."""
        count, length, turns, sampled, last = mark
        del self.samples[count:], self.sampled[count:]
        current = self.current
        for tokens in (current.response_ids, current.loss_mask, current.rollout_logprobs, current.weight_versions,
                       current.rewards):  # fmt: skip
            del tokens[length:]
        del current.turn_spans[turns:], self.sampled[-1][sampled:]
        if last is not None:
            current.turn_spans[-1] = last

    def finish(self, overlong: bool, masked: bool = False) -> Trajectory:
        """The head with its continuations; an overlong episode, or one its env masked (`mask_episode`), trains on
        nothing (every mask zeroed), and only the overlong one counts in `episodes/overlong`. Then the
        token-in/token-out check on every sample."""
        for sample, turns in zip(self.samples, self.sampled, strict=True):
            if overlong or masked:
                sample.loss_mask = [0] * len(sample.loss_mask)
                sample.env_metrics["overlong" if overlong else "masked"] = 1.0
            check_trajectory(sample, turns)
        self.head.continuations = self.samples[1:]
        return self.head


def merge_samples(samples: list[Trajectory]) -> list[Trajectory]:
    """Prefix-aware merge of one episode's consecutive samples: where a sample's prompt starts with all the tokens
    of the sample before it, the two become one sequence (the tokens between them become observation tokens, loss
    mask 0). Inputs are not modified; the first output keeps the head's episode fields."""
    if not samples:
        return []
    out = [_copy_tokens(samples[0], keep_episode=True)]
    for sample in samples[1:]:
        last = out[-1]
        if not extends(last.prompt_ids + last.response_ids, sample.prompt_ids):
            out.append(_copy_tokens(sample, keep_episode=False))
            continue
        _append_observation(last, sample.prompt_ids[len(last.prompt_ids) + len(last.response_ids) :])
        offset = len(last.response_ids)
        last.response_ids += sample.response_ids
        last.loss_mask += sample.loss_mask
        last.rollout_logprobs += sample.rollout_logprobs
        last.weight_versions += sample.weight_versions
        last.rewards += sample.rewards
        last.turn_spans += [(s + offset, e + offset, o + offset) for s, e, o in sample.turn_spans]
    out[0].continuations = out[1:]
    return out


def _copy_tokens(sample: Trajectory, keep_episode: bool) -> Trajectory:
    copy = Trajectory(
        prompt_ids=list(sample.prompt_ids),
        response_ids=list(sample.response_ids),
        loss_mask=list(sample.loss_mask),
        rollout_logprobs=list(sample.rollout_logprobs),
        weight_versions=list(sample.weight_versions),
        rewards=list(sample.rewards),
        turn_spans=list(sample.turn_spans),
        group_id=sample.group_id,
        env_metrics=dict(sample.env_metrics),
    )
    if keep_episode:
        copy.stop_reason, copy.num_turns, copy.env_name = sample.stop_reason, sample.num_turns, sample.env_name
        copy.timings, copy.messages = dict(sample.timings), list(sample.messages)
    return copy
