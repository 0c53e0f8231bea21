"""Step-wise trajectories (rollout.step_wise) on real chat templates: the Qwen3-style thinking template (built
locally, tiny tokenizer) and SmolLM2's real tokenizer; episodes of the real math_feedback and calculator envs.

A Qwen3-style template strips the <think> of assistant turns before the last user query: after the feedback turn
"Incorrect, try again." the next prompt no longer extends the sampled tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from real_model import smollm2_dir
from test_rollout import ScriptedEngine, play, solved_texts

from thermik.config.schema import EnvConfig, SamplingConfig
from thermik.models.chat import QWEN3_THINKING_TEMPLATE, ChatTokenizer
from thermik.models.loading import load_tokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.agent_loop import LoopLimits, run_episode
from thermik.rollout.metrics import rollout_metrics
from thermik.rollout.step_wise import PrefixBreakError, extends, merge_samples
from thermik.rollout.trajectory import Trajectory
from thermik.tasks.registry import generate_rows, make_env

needs_real = pytest.mark.skipif(smollm2_dir() is None, reason="no imported SmolLM2 (thermik model import)")
TINY, QWEN3, REAL = "thermik-qwen3-thinking", "qwen3", "smollm2-real"
KINDS = [TINY, QWEN3, pytest.param(REAL, marks=needs_real)]
QWEN3_FIXTURE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen3.jinja"


def thinking_chat(kind: str) -> ChatTokenizer:
    """thermik's preset template on its tiny tokenizer; Qwen3's own template (fixture) on the tiny tokenizer and on
    SmolLM2's real BPE tokenizer."""
    tok = load_tokenizer(smollm2_dir()) if kind == REAL else build_tokenizer("qwen3-thinking")
    tok.chat_template = QWEN3_THINKING_TEMPLATE if kind == TINY else QWEN3_FIXTURE.read_text()
    return ChatTokenizer(tok)


def feedback_row() -> dict:
    return generate_rows("math_feedback", 1, seed=3, split="eval")[0]


# Turn 1 thinks and answers wrong; feedback (a user turn) strips that thinking from the history; turn 2 is right.
FEEDBACK_TEXTS = ["<think>\n17 * 29 = 493, minus 450\n</think>\n\n#### 44", "<think>\nrecheck: 43\n</think>\n\n#### 43"]


def play_feedback(
    chat: ChatTokenizer, mode: str, texts: list[str] = FEEDBACK_TEXTS
) -> tuple[Trajectory, ScriptedEngine]:
    row = feedback_row()
    engine = ScriptedEngine(chat, texts)
    env = make_env("math_feedback", reward_spec=row["reward_spec"], extra_info={}, options=EnvConfig(max_turns=3))
    limits = LoopLimits(3, 1024, 64, 2048, step_wise=mode)
    return asyncio.run(run_episode(engine, env, chat, row["prompt"], limits, SamplingConfig())), engine


def sampled_ids(chat: ChatTokenizer, texts: list[str]) -> list[int]:
    return [i for t in texts for i in [*chat.encode(t), chat.eos_id]]


@pytest.mark.parametrize("kind", KINDS)
def test_thinking_template_trains_on_break_with_per_sample_invariants(kind: str) -> None:
    chat = thinking_chat(kind)
    traj, engine = play_feedback(chat, "on-break")
    assert traj.reward == 0.5 and traj.num_turns == 2 and traj.stop_reason == "stop"
    samples = traj.samples
    assert len(samples) == 2
    # Each sample's engine input is exactly its tokens so far: the second prompt is the template's rendering of the
    # history with turn 1's thinking stripped, and the engine saw it (not the accumulated ids).
    for prompt, sample in zip(engine.prompts, samples, strict=True):
        assert sample.prompt_ids == prompt
    history = chat.tokenizer.decode(samples[1].prompt_ids, skip_special_tokens=False)
    assert "#### 44" in history and "minus 450" not in history and "Incorrect, try again." in history
    # The samples' loss masks together cover exactly the sampled tokens, in order, never re-tokenized.
    masked = [i for s in samples for i, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
    assert masked == sampled_ids(chat, FEEDBACK_TEXTS)
    for s in samples:
        assert {v for v, m in zip(s.weight_versions, s.loss_mask, strict=True) if m} == {3}
        assert [lp for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m] == [
            -0.25 - 0.01 * i for i in range(sum(s.loss_mask))
        ]
    # Per-turn rewards stay on their own sample: 0 on the wrong try, 0.5 on the right one.
    assert sum(samples[0].rewards) == 0.0 and samples[1].rewards[-1] == 0.5
    # Only the answer reached the env's extraction; the transcript keeps the thinking beside it.
    assert traj.messages[2] == {
        "role": "assistant",
        "content": "#### 44",
        "reasoning_content": "17 * 29 = 493, minus 450",
    }


@pytest.mark.parametrize("kind", KINDS)
def test_off_fails_loudly_on_the_same_episode(kind: str) -> None:
    with pytest.raises(PrefixBreakError, match="step_wise = 'on-break'"):
        play_feedback(thinking_chat(kind), "off")


@pytest.mark.parametrize("kind", KINDS)
def test_always_then_merge_recombines_the_turns_that_extend(kind: str) -> None:
    chat = thinking_chat(kind)
    texts = [*FEEDBACK_TEXTS[:1], "<think>\nagain\n</think>\n\n#### 45", FEEDBACK_TEXTS[1]]
    always, _ = play_feedback(chat, "always", texts)
    on_break, _ = play_feedback(chat, "on-break", texts)
    assert len(always.samples) == 3 and len(on_break.samples) == 3  # every feedback turn strips the thinking
    # A break-free episode: turns extend each other, so 'always' gives one sample per turn and the merge one in all.
    calc_always, _ = play_calculator(chat, "always")
    calc_on_break, _ = play_calculator(chat, "on-break")
    assert len(calc_always.samples) == 2 and len(calc_on_break.samples) == 1
    for merged, reference in (
        (merge_samples(calc_always.samples), calc_on_break),
        (merge_samples(always.samples), on_break),
    ):
        assert len(merged) == len(reference.samples)
        for m, r in zip(merged, reference.samples, strict=True):
            for field in ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "weight_versions", "rewards"):
                assert getattr(m, field) == getattr(r, field), field
            assert m.turn_spans == r.turn_spans


def play_calculator(chat: ChatTokenizer, mode: str, think: str = "<think>\nadd them\n</think>\n\n"):
    """A solved calculator episode whose turns think first: tool results are not user queries, so nothing is
    stripped and the prefix holds."""
    row = generate_rows("calculator", 1, seed=3, split="eval")[0]
    return play(chat, row, [think + t for t in solved_texts(row)], LoopLimits(4, 1024, 128, 2048, step_wise=mode))


def test_thinking_never_reaches_the_tool_parser_and_is_counted() -> None:
    chat = thinking_chat(TINY)
    row = generate_rows("calculator", 1, seed=3, split="eval")[0]
    call = solved_texts(row)[0]
    texts = [f"<think>\n{call}\n</think>\n\n<answer>0</answer>"]  # a tool call written while thinking
    traj, _ = play(chat, row, texts, LoopLimits(2, 1024, 128, 2048))
    assert traj.env_metrics.get("tool_calls", 0) == 0 and traj.stop_reason == "stop"
    assert traj.env_metrics["thinking_tokens"] == len(chat.encode(f"\n{call}\n"))
    metrics = rollout_metrics([traj])
    assert metrics["thinking/tokens_per_turn"] == traj.env_metrics["thinking_tokens"]
    assert metrics["step_wise/samples_per_episode"] == 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_no_break_on_break_equals_off(kind: str) -> None:
    chat = thinking_chat(kind)
    on_break, engine = play_calculator(chat, "on-break")
    off, _ = play_calculator(chat, "off")
    assert (
        on_break.continuations == []
        and on_break.prompt_ids + on_break.response_ids == off.prompt_ids + off.response_ids
    )
    assert on_break.loss_mask == off.loss_mask and on_break.reward == off.reward == 1.0
    assert engine.prompts[1] == (on_break.prompt_ids + on_break.response_ids)[: len(engine.prompts[1])]


def test_the_thinking_calculator_solver_breaks_once_per_episode() -> None:
    """`calculator_thinking`'s solver (examples/thinking_calculator): the template drops the tool-call turn's empty
    thinking block from history, so the answer turn is a second sample whose prompt is that rendering; the samples'
    masked tokens are the solver's turns as sampled, the reward reaches the answer's sample, and the thought
    (not the answer) is the turn's reasoning."""
    chat = thinking_chat(TINY)
    row = generate_rows("calculator_thinking", 1, seed=3, split="eval")[0]
    texts = solved_texts(row)
    assert texts[0].startswith("<think>\n\n</think>\n\n<tool_call>") and "<think>\nthe tool says" in texts[1]
    traj, engine = play(chat, row, texts, LoopLimits(3, 1024, 128, 2048, step_wise="on-break"))
    assert traj.reward == 1.0 and traj.num_turns == 2 and len(traj.samples) == 2
    head, answer = traj.samples
    assert answer.prompt_ids == engine.prompts[1]
    assert not extends(head.prompt_ids + head.response_ids, answer.prompt_ids)
    history = chat.tokenizer.decode(answer.prompt_ids, skip_special_tokens=False)
    assert "<think>" not in history and "<|im_start|>assistant\n<tool_call>" in history
    masked = [i for s in traj.samples for i, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
    assert masked == sampled_ids(chat, texts) and sum(head.rewards) == 0.0 and answer.rewards[-1] == 1.0
    assert traj.messages[-1]["reasoning_content"].startswith("the tool says")
    assert rollout_metrics([traj])["step_wise/samples_per_episode"] == 2.0
    with pytest.raises(PrefixBreakError):
        play(chat, row, texts, LoopLimits(3, 1024, 128, 2048, step_wise="off"))


# ---------------------------------------------------------------- context policies (rollout.context)


def play_long_calculator(
    context: str, max_input: int, extra_texts: list[str] = ()
) -> tuple[Trajectory, ScriptedEngine]:
    """Two tool calls before the answer, on the thermik template: each tool result grows the prompt. A dropped
    result becomes "-" (the calculator's results are a few characters: a longer placeholder would not save room)."""
    row = generate_rows("calculator", 1, seed=3, split="eval")[0]
    call, answer = solved_texts(row)
    limits = LoopLimits(
        6, max_input, 128, 900, "on-break", context, context_placeholder="-", summary_request="Summarise."
    )
    return play(ChatTokenizer(build_tokenizer()), row, [call, call, *extra_texts, answer], limits)


def prompt_lengths() -> tuple[int, int]:
    traj, engine = play_long_calculator("truncate-episode", 4096)
    assert traj.reward == 1.0 and traj.continuations == []
    return len(engine.prompts[0]), len(engine.prompts[2])


def test_truncate_episode_stops_a_long_episode_at_max_sequence_length() -> None:
    traj, _ = play_long_calculator("truncate-episode", 4096)
    full = len(traj.prompt_ids) + len(traj.response_ids)
    row = generate_rows("calculator", 1, seed=3, split="eval")[0]
    calls = solved_texts(row)[:1] * 4
    short, _ = play(ChatTokenizer(build_tokenizer()), row, calls, LoopLimits(6, 4096, 128, full - 40))
    assert short.stop_reason == "length" and short.env_metrics["overlong"] == 1.0 and sum(short.loss_mask) == 0


def test_drop_oldest_observations_fires_and_starts_a_new_sample() -> None:
    first, third = prompt_lengths()
    traj, engine = play_long_calculator("drop-oldest-observations", third - 2)
    assert traj.env_metrics["context_drops"] >= 1 and len(traj.samples) == 2 and traj.reward == 1.0
    second = traj.samples[1]
    assert second.prompt_ids == engine.prompts[2] and len(second.prompt_ids) <= third - 2
    text = ChatTokenizer(build_tokenizer()).tokenizer.decode(second.prompt_ids, skip_special_tokens=False)
    assert text.count("<tool_response>-</tool_response>") == 1 and text.count("<tool_response>") == 2
    assert first < len(second.prompt_ids)


def test_summarise_trains_the_summary_turn_and_restarts_from_it() -> None:
    _, third = prompt_lengths()
    summary = "Task: a calculation. One tool call so far."
    traj, engine = play_long_calculator("summarise", third - 5, extra_texts=[summary])
    assert traj.env_metrics["context_summaries"] == 1.0 and traj.reward == 1.0 and len(traj.samples) == 2
    head, after = traj.samples
    chat = ChatTokenizer(build_tokenizer())
    # The summary turn is sampled: it sits in the first sample with loss mask 1, after the request (mask 0).
    summary_ids = [*chat.encode(summary), chat.eos_id]
    start, end, _ = head.turn_spans[-1]
    assert head.response_ids[start:end] == summary_ids and head.loss_mask[start:end] == [1] * len(summary_ids)
    assert "Summarise." in chat.tokenizer.decode(head.response_ids[:start], skip_special_tokens=False)
    # The next sample starts from the first messages plus the summary: no tool result survives.
    text = chat.tokenizer.decode(after.prompt_ids, skip_special_tokens=False)
    assert f"Summary of your work so far:\n{summary}" in text and "<tool_response>" not in text
    assert after.prompt_ids == engine.prompts[3]


def test_enable_thinking_false_reaches_the_template_and_each_turn_breaks() -> None:
    """Qwen3's rule: the generation prompt closes an empty thinking block, which history re-renders without, so every
    tool turn starts a new sample under on-break (and `off` would stop)."""
    tok = build_tokenizer("qwen3-thinking")
    chat = ChatTokenizer(tok, enable_thinking=False)
    assert ChatTokenizer(tok).render([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")
    assert chat.render([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    traj, engine = play_calculator(chat, "on-break", think="")
    assert traj.reward == 1.0 and len(traj.samples) == 2
    assert all(
        p[-len(chat.encode("<think>\n\n</think>\n\n")) :] == chat.encode("<think>\n\n</think>\n\n")
        for p in engine.prompts
    )
    with pytest.raises(PrefixBreakError):
        play_calculator(chat, "off", think="")
