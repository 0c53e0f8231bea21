"""Every command ends with a verdict on whether it did the work it was asked to do (docs/reliability.md).

A `Verdict` sums named counters over a command's steps: the step metrics `problems/played`, `problems/skipped`,
`episodes/played`, `episodes/overlong`, `batch/trained_tokens`, ... (the rollout and the update report them).

- A `Requirement` names a counter that must end above 0 (`thermik eval` played a problem, `thermik rl` trained a
  token, `thermik sft` kept a conversation with a trained token). When it does not, `conclude` raises
  `NothingDoneError`: one line naming the cause and the setting to change, and exit code 3.
- A `Share` watches one kind of partial failure per step (problems skipped, episodes failed). Above its limit
  (`[failures]`) it warns on the console, once per kind, with the count and the cause; with `failures.stop` it
  stops the run instead.

Other checks (a reward source that never answered, ...) plug in as more requirements and shares on their counters.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from thermik.config.schema import FailuresConfig, RolloutConfig
from thermik.errors import NothingDoneError, ThermikError
from thermik.rollout.agent_loop import LoopLimits
from thermik.rollout.context import RolloutContext
from thermik.rollout.prompt_lengths import measure_prompts
from thermik.training.checkpoint import rng_kept

Totals = Mapping[str, float]
"""Counter name -> its sum over the steps so far (`.../longest_*` counters: their maximum, `.../first_*`: minimum)."""


@dataclass(frozen=True)
class Requirement:
    counter: str  # the work happened when this counter's total is > 0
    nothing: Callable[[Totals], str]  # the one line naming why it did not and what to change


@dataclass(frozen=True)
class Share:
    kind: str  # what failed, e.g. "problems skipped"
    part: str  # counter of the failures
    whole: tuple[str, ...]  # counters that add up to the total
    limit: float  # the share above which the run warns (or stops)
    setting: str  # the config key of `limit`
    cause: Callable[[Totals], str]  # why they failed, from the step's counters


class Verdict:
    """The counters, requirements and shares of one command."""

    def __init__(self, requirements: Iterable[Requirement] = (), shares: Iterable[Share] = (), stop: bool = False):
        self.requirements, self.shares, self.stop = list(requirements), list(shares), stop
        self.totals: dict[str, float] = defaultdict(float)
        self.warned: set[str] = set()

    def observe(self, metrics: Mapping[str, float], where: str = "") -> None:
        """Add one step's counters (`where`: "step 3"), then warn about, or stop at, each share above its limit."""
        for share in self.shares:
            self._check(share, metrics, where)
        for key, value in metrics.items():
            name = key.rsplit("/", 1)[-1]
            if name.startswith("longest"):
                self.totals[key] = max(self.totals[key], value)
            elif name.startswith("first"):
                self.totals[key] = min(self.totals.get(key, value), value)
            else:
                self.totals[key] += value

    def _check(self, share: Share, metrics: Mapping[str, float], where: str) -> None:
        part, whole = metrics.get(share.part, 0.0), sum(metrics.get(key, 0.0) for key in share.whole)
        if not part or not whole or part / whole <= share.limit or share.kind in self.warned:
            return
        line = (
            f"{where + ': ' if where else ''}{part:.0f} of {whole:.0f} {share.kind} ({part / whole:.0%} > "
            f"{share.setting} = {share.limit:.0%}): {share.cause(metrics)}"
        )
        if self.stop:
            raise ThermikError(f"stopped: {line}", hint="failures.stop = false warns and continues")
        self.warned.add(share.kind)
        print(f"thermik: warning: {line}", file=sys.stderr, flush=True)

    def conclude(self) -> None:
        """Raise NothingDoneError when a requirement's counter ended at 0."""
        for requirement in self.requirements:
            if self.totals[requirement.counter] <= 0:
                raise NothingDoneError(requirement.nothing(self.totals))


@dataclass(frozen=True)
class PromptLimit:
    """What a "prompt too long" message names: the limit, where it came from and the model's window."""

    limits: LoopLimits
    explicit: bool  # rollout.max_input_length was set (else it came from the model's context window)
    tools: bool = False  # the env renders tool schemas into the prompt

    @classmethod
    def of(cls, limits: LoopLimits, rollout: RolloutConfig, tools: bool = False) -> PromptLimit:
        return cls(limits, bool(rollout.max_input_length), tools)

    def exceeded(self, longest: float) -> str:
        """Why prompts of up to `longest` tokens were skipped, and what to change."""
        limit, window = self.limits.max_input_length, self.limits.window
        tools = " or set env.render_tools = false" if self.tools else ""
        if not longest:  # an API policy: its endpoint refused them (context_length_exceeded)
            return "the policy's endpoint refused the prompts as longer than its context; use a longer-context model"
        if self.explicit:
            room = f" (the model allows {window - self.limits.max_generate_length})" if window else ""
            exceed = f"prompts of up to {longest:.0f} tokens exceed rollout.max_input_length = {limit}"
            return f"{exceed}; raise it{room}{tools}"
        return (
            f"prompts of up to {longest:.0f} tokens exceed the model's context window ({window}) less "
            f"rollout.max_generate_length ({self.limits.max_generate_length}); use a model with a longer context"
            f"{tools}"
        )


def skipped_share(failures: FailuresConfig, limit: PromptLimit) -> Share:
    return Share(
        "problems skipped", "problems/skipped", ("problems/played", "problems/skipped"), failures.max_skipped_share,
        "failures.max_skipped_share", lambda m: limit.exceeded(m.get("problems/longest_skipped", 0.0)),
    )  # fmt: skip


def nothing_played(limit: PromptLimit) -> Callable[[Totals], str]:
    """The cause of an evaluation or a run that played no problem."""

    def line(totals: Totals) -> str:
        skipped = totals.get("problems/skipped", 0.0)
        if skipped:
            return f"all {skipped:.0f} problems skipped: {limit.exceeded(totals.get('problems/longest_skipped', 0))}"
        return "no problem to play: the held-out rows are empty (data.eval_path, eval.size)"

    return line


def eval_verdict(failures: FailuresConfig, limit: PromptLimit) -> Verdict:
    """`thermik eval`: at least one problem scored."""
    return Verdict(
        [Requirement("problems/played", nothing_played(limit))], [skipped_share(failures, limit)], failures.stop
    )


def rl_verdict(failures: FailuresConfig, limit: PromptLimit) -> Verdict:
    """`thermik rl`: at least one batch with a trained token (not every prompt skipped, not every episode overlong)."""
    played = nothing_played(limit)

    def nothing_trained(totals: Totals) -> str:
        if not totals.get("problems/played", 0.0):
            return played(totals)
        if totals.get("episodes/overlong", 0.0) >= totals.get("episodes/played", 0.0) > 0:
            return (
                f"no batch trained: all {totals['episodes/played']:.0f} episodes outgrew rollout.max_sequence_length "
                f"= {limit.limits.max_sequence_length} (overlong, untrained); raise it or lower env.max_turns"
            )
        return "no batch trained: no sampled token carried loss"

    overlong = Share(
        "episodes failed", "episodes/overlong", ("episodes/played",), failures.max_failed_share,
        "failures.max_failed_share",
        lambda m: f"overlong: they outgrew rollout.max_sequence_length = {limit.limits.max_sequence_length}, their "
        "tokens are not trained; raise it or lower env.max_turns",
    )  # fmt: skip
    requirement = Requirement("batch/trained_tokens", nothing_trained)
    return Verdict([requirement], [skipped_share(failures, limit), overlong, agent_share(failures)], failures.stop)


def agent_share(failures: FailuresConfig) -> Share:
    """Episodes an agent harness failed (`[agent]`, docs/agents.md), with the share of each reason."""

    def cause(m: Totals) -> str:
        reasons = {k.removeprefix("agent/failed_"): v for k, v in m.items() if k.startswith("agent/failed_") and v}
        shares = ", ".join(f"{reason} {share:.0%}" for reason, share in sorted(reasons.items()))
        return f"the agent harness failed them ({shares}); each names its reason on stderr (docs/agents.md)"

    return Share(
        "agent episodes failed", "episodes/agent_failed", ("episodes/played",), failures.max_failed_share,
        "failures.max_failed_share", cause,
    )  # fmt: skip


def check_prompts_fit(lengths: list[int], limit: PromptLimit) -> None:
    """Refuse, before any work, a prompt limit that every measured prompt exceeds, naming the longest prompt."""
    if lengths and min(lengths) > limit.limits.max_input_length:
        raise ThermikError(
            f"every prompt is too long: the {len(lengths)} measured have {min(lengths)} to {max(lengths)} tokens; "
            + limit.exceeded(max(lengths))
        )


def sft_verdict(failures: FailuresConfig, max_length: int, roles: tuple[str, ...]) -> Verdict:
    """`thermik sft`: at least one conversation keeps a trained token after the cut to max_length."""

    def cause(m: Totals) -> str:
        return (
            f"max_length = {max_length} cuts them before their first trained token (the earliest starts at token "
            f"{m.get('conversations/first_trained', 0):.0f}); raise max_length"
        )

    def nothing(totals: Totals) -> str:
        if totals.get("conversations/cut", 0.0):
            return f"no conversation left to train on: all {totals['conversations/cut']:.0f} cut: {cause(totals)}"
        return f"no token of the training rows carries loss: train_roles {tuple(roles)} match no content"

    share = Share(
        "conversations cut", "conversations/cut", ("conversations/kept", "conversations/cut"),
        failures.max_skipped_share, "failures.max_skipped_share", cause,
    )  # fmt: skip
    return Verdict([Requirement("conversations/kept", nothing)], [share], failures.stop)


MEASURED_ROWS = 8
"""Rows of each split whose prompts are measured before a run starts (their env is built and closed once)."""


async def prompt_limit(ctx: RolloutContext) -> PromptLimit:
    """Measure the first prompts of the training and held-out rows; refuse a limit every one exceeds. The global
    RNGs are left as they were: a seeded run draws the same after the measurement as without it."""
    rows = (ctx.sampler.rows[:MEASURED_ROWS] if ctx.sampler is not None else []) + ctx.held_out[:MEASURED_ROWS]
    with rng_kept():
        lengths = await measure_prompts(ctx.make_env, ctx.chat, rows)
    limit = PromptLimit.of(ctx.limits, ctx.cfg.rollout, lengths.tools)
    check_prompts_fit(lengths.tokens, limit)
    return limit
