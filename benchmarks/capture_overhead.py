"""What capture costs: the same episodes played by thermik's own agent loop (rollout/agent_loop.py, token ids straight
to the engine) and by an openai SDK harness through the capture endpoint (thermik.capture), in one process.

Each episode is a multi-turn chat: the model answers, the environment answers back with a user turn, for --turns
turns. Both sides sample with the same seeds from the same embedded engine over the same model, so they sample the
same tokens; the capture side adds the SDK, HTTP on loopback, the request parsing and the sample bookkeeping. All
--episodes run concurrently, as a rollout batch does. Each round plays both sides back to back (their order
alternating), so machine load hits both alike: the round's ratio (capture / agent loop wall time) is paired, and
the median of the rounds' ratios is the result (target: within 1.05). The process CPU time per episode (all
threads: the engine's, the server's, the SDK's) shows the capture's own cost apart from waiting on a loaded machine.
The agent loop re-tokenizes a turn whose text does not re-render to the same prefix (an untrained model's broken
characters): it then starts a new sample, where capture keeps extending its tokens; the sample counts show how
often.

Run: `python benchmarks/capture_overhead.py [--model DIR | --preset qwen2-1m] [--episodes 16] [--turns 4]
[--tokens 24] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from thermik.capture import Capture, serve_capture
from thermik.config.schema import SamplingConfig
from thermik.envs.base import Env, StepOutput
from thermik.inference.server.run import load_engine
from thermik.models.chat import ChatTokenizer
from thermik.models.presets import init_model
from thermik.rollout.agent_loop import LoopLimits, run_episode
from thermik.rollout.trajectory import Trajectory

SEED_STRIDE = 7919  # the agent loop's per-turn seed offset (seed + 7919 * turn)


class ChatEnv(Env):
    """Answers every turn with a user message; done after `turns` turns."""

    def __init__(self, turns: int) -> None:
        self.turns, self.taken = turns, 0

    def step(self, action: str) -> StepOutput:
        self.taken += 1
        done = self.taken >= self.turns
        return StepOutput([] if done else [{"role": "user", "content": f"Go on ({self.taken})."}], 0.0, done)


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are brief."}, {"role": "user", "content": f"Tell me about {i}."}]


async def agent_loop_side(engine: Any, chat: ChatTokenizer, args: argparse.Namespace, seed: int) -> tuple[int, int]:
    """(sampled tokens, samples) of the batch."""
    limits = LoopLimits(max_turns=args.turns, max_input_length=1536, max_generate_length=args.tokens,
                        max_sequence_length=2048)  # fmt: skip
    trajs = await asyncio.gather(*(
        run_episode(engine, ChatEnv(args.turns), chat, prompt(i), limits, SamplingConfig(), seed=seed + 1000 * i)
        for i in range(args.episodes)
    ))  # fmt: skip
    return sum(t.num_generated_tokens for t in trajs), sum(len(t.samples) for t in trajs)


async def harness(sdk: openai.AsyncOpenAI, capture: Capture, args: argparse.Namespace, i: int, seed: int) -> Trajectory:
    """One episode as a user's harness plays it: the openai SDK's chat loop against the episode's base URL."""
    handle = capture.open()
    client = sdk.with_options(base_url=handle.base_url, api_key=handle.api_key)
    env, messages = ChatEnv(args.turns), prompt(i)
    for turn in range(args.turns):
        reply = await client.chat.completions.create(model=handle.model, messages=messages, max_tokens=args.tokens,
                                                     seed=seed + SEED_STRIDE * turn)  # fmt: skip
        text = reply.choices[0].message.content or ""
        out = env.step(text)
        if out.done or reply.choices[0].finish_reason != "stop":
            break
        messages = [*messages, {"role": "assistant", "content": text}, *out.observations]
    return capture.close(handle.id)


async def capture_side(
    sdk: openai.AsyncOpenAI, capture: Capture, args: argparse.Namespace, seed: int
) -> tuple[int, int]:
    """The episodes' SDK clients share one connection pool, made once for the whole benchmark: building an SDK
    client (its TLS context, 60-80 ms on a loaded 2-core machine) is the harness's cost, not the endpoint's."""
    trajs = await asyncio.gather(*(harness(sdk, capture, args, i, seed + 1000 * i) for i in range(args.episodes)))
    return sum(t.num_generated_tokens for t in trajs), sum(len(t.samples) for t in trajs)


async def main(args: argparse.Namespace) -> None:
    engine, tokenizer = load_engine(args.model, seed=0)
    chat = ChatTokenizer(tokenizer)
    times: dict[str, list[float]] = {"agent loop": [], "capture": []}
    cpu: dict[str, list[float]] = {"agent loop": [], "capture": []}
    counts: dict[str, tuple[int, int]] = {}
    load = os.getloadavg()[0]
    async with (
        serve_capture(engine, tokenizer, "policy", max_model_len=2048) as capture,
        openai.AsyncOpenAI(base_url=capture.url, api_key="unused", max_retries=0) as sdk,
    ):
        sides = {"agent loop": lambda s: agent_loop_side(engine, chat, args, s),
                 "capture": lambda s: capture_side(sdk, capture, args, s)}  # fmt: skip
        for side in sides.values():  # warm-up: first-call costs (template probe, kernels, connections)
            await side(0)
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                counts[name] = await sides[name](1 + r)
                times[name].append(time.perf_counter() - start)
                cpu[name].append((time.process_time() - start_cpu) / args.episodes)
    await engine.close()
    report(args, times, cpu, counts, (load, os.getloadavg()[0]))


def report(args: argparse.Namespace, times: dict[str, list[float]], cpu: dict[str, list[float]],
           counts: dict[str, tuple[int, int]], load: tuple[float, float]) -> None:  # fmt: skip
    print(f"{args.episodes} episodes x {args.turns} turns x <= {args.tokens} tokens, {args.rounds} rounds, "
          f"load average {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    for name, ts in times.items():
        tokens, samples = counts[name]
        print(f"  {name:>10}: {statistics.median(ts):.3f} s median rollout wall time, "
              f"{1000 * statistics.median(cpu[name]):.1f} ms process CPU per episode "
              f"(last round: {tokens} sampled tokens, {samples} samples)")  # fmt: skip
    ratios = [c / a for c, a in zip(times["capture"], times["agent loop"], strict=True)]
    cpu_ratio = statistics.median(cpu["capture"]) / statistics.median(cpu["agent loop"])
    print(f"rounds' capture / agent loop: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(f"capture / agent loop = {statistics.median(ratios):.3f} median of the rounds (target <= 1.05); "
          f"process CPU {cpu_ratio:.3f}")  # fmt: skip


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--preset", default="qwen2-1m")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.model is None:
        arguments.model = init_model(arguments.preset, Path(tempfile.mkdtemp()) / arguments.preset, seed=0)
    asyncio.run(main(arguments))
